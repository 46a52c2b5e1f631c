"""Seeded generation of fuzz cases: mutated example configs, --set values, topology and profile files, routing
traces, run folders for `compare`, CLI option values and output paths.

A Case is a piper-sim command line, the files it needs (written into the case's own folder, which is its working
directory) and what must happen: `invalid` True (refused with one short line naming `key`), False (runs, exit 0)
or None (either, but no traceback and no hang).
"""

from __future__ import annotations

import io
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml
from values import (
    BAD,
    BAD_YAML_TEXT,
    CONFIG_KEYS,
    LIST_BAD,
    MAPPINGS,
    PROFILE_KEYS,
    TOPOLOGY_KEYS,
    Key,
    anchor_bomb,
    deep_nesting,
    npz_bomb,
    wrapping_counts,
)

ROOT = Path(__file__).resolve().parents[2]
BASES = ("small-moe", "tiny-moe")
SECTIONS_WITH_MAPPINGS = ("parallel", "sim", "cost", "collectives", "routing", "migration", "optimizer")


@dataclass
class Case:
    family: str
    argv: list[str]
    invalid: bool | None
    key: str | None = None  # what a clean error must name
    files: dict[str, bytes | None] = field(default_factory=dict)  # relative path -> content; None: a folder
    copies: dict[str, str] = field(default_factory=dict)  # relative path -> a shared folder copied there
    removes: list[str] = field(default_factory=list)  # relative paths deleted after the copies
    note: str = ""

    def label(self) -> str:
        return f"{self.family}: {self.note}" if self.note else self.family


def base_config(name: str) -> dict:
    return yaml.safe_load((ROOT / "examples" / f"{name}.yaml").read_text())


def dump(value: object) -> bytes:
    return yaml.safe_dump(value, sort_keys=False).encode()


def set_path(cfg: dict, path: str, value: object) -> None:
    """Set a dotted key in a config, turning a section given by name (model: small-moe) into a mapping."""
    parts = path.split(".")
    node = cfg
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if not isinstance(child, dict):
            child = (
                {"preset": child}
                if part in ("model", "topology") and isinstance(child, str)
                else (
                    {"profile": child}
                    if part == "cost" and isinstance(child, str)
                    else {"policy": child}
                    if part == "placement" and isinstance(child, str)
                    else {}
                )
            )
            if part == "topology" and i == 0 and "preset" not in child:
                child = {"preset": "uniform"}
            node[part] = child
        node = child
    node[parts[-1]] = value


def yaml_text(value: object) -> str:
    text = yaml.safe_dump(value, default_flow_style=True).strip()
    return text.removesuffix("...").strip()


def simulate(config: str, *extra: str) -> list[str]:
    return ["simulate", config, "--out", "out", *extra]


def bad_values(key: Key) -> list:
    """The bad values of the key's kind that its good values do not name (num_nodes: null is the default)."""
    return [v for v in BAD[key.kind] if not any(v is g or (type(v) is type(g) and v == g) for g in key.good)]


# ---- families ------------------------------------------------------------------------------------------


def config_key(rng: random.Random, via_set: bool) -> Case:
    key = rng.choice(CONFIG_KEYS)
    base = rng.choice(BASES)
    good = bool(key.good) and rng.random() < 0.2
    value = rng.choice(key.good) if good else rng.choice(bad_values(key))
    family = "set-value" if via_set else "config-value"
    note = f"{key.path}={value!r}"
    if via_set:
        return Case(family, simulate(base, "--set", f"{key.path}={yaml_text(value)}"), not good, key.path, note=note)
    cfg = base_config(base)
    set_path(cfg, key.path, value)
    return Case(family, simulate("cfg.yaml"), not good, key.path, {"cfg.yaml": dump(cfg)}, note=note)


def set_text(rng: random.Random) -> Case:
    key = rng.choice(CONFIG_KEYS).path
    text = rng.choice(BAD_YAML_TEXT + (anchor_bomb(),))
    return Case(
        "set-yaml", simulate(rng.choice(BASES), "--set", f"{key}={text}"), True, key, note=f"{key}={text[:30]!r}"
    )


def unknown_key(rng: random.Random) -> Case:
    where = rng.choice(MAPPINGS)
    cfg = base_config(rng.choice(BASES))
    name = rng.choice(("bogus_key", "Steps", "pp ", "0"))
    path = f"{where}.{name}" if where else name
    if where in ("placement", "topology", "model"):
        set_path(
            cfg,
            f"{where}.{'policy' if where == 'placement' else 'preset'}",
            {"placement": "contiguous", "topology": "uniform", "model": "small-moe"}[where],
        )
    set_path(cfg, path, 1)
    return Case("unknown-key", simulate("cfg.yaml"), True, name.strip() or name, {"cfg.yaml": dump(cfg)}, note=path)


def section_type(rng: random.Random) -> Case:
    section = rng.choice(
        (
            "model",
            "topology",
            "placement",
            "routing",
            "migration",
            *SECTIONS_WITH_MAPPINGS,
            "topology.params",
            "cost.profile",
            "topology.collectives",
        )
    )
    value = rng.choice(BAD["mapping"])
    cfg = base_config(rng.choice(BASES))
    set_path(cfg, section, value)
    return Case(
        "section-type", simulate("cfg.yaml"), True, section, {"cfg.yaml": dump(cfg)}, note=f"{section}={value!r}"
    )


def config_file(rng: random.Random) -> Case:
    kind = rng.choice(
        ("non-utf8", "folder", "empty", "list", "scalar", "bad-yaml", "anchor-bomb", "deep", "deep-model", "binary")
    )
    content: bytes | None = {
        "non-utf8": b"model: small-moe\nschedule: \xff\xfe1f1b\n",
        "folder": None,
        "empty": b"",
        "list": b"- model\n- parallel\n",
        "scalar": b"42\n",
        "bad-yaml": rng.choice(BAD_YAML_TEXT).encode(),
        "anchor-bomb": ("model: small-moe\n" + anchor_bomb()).encode(),
        "deep": deep_nesting().encode(),
        "deep-model": ("model: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n").encode(),
        "binary": bytes(rng.randrange(256) for _ in range(300)),
    }[kind]
    return Case("config-file", simulate("cfg.yaml"), True, "config", {"cfg.yaml": content}, note=kind)


def _mutated_file(rng: random.Random, source: Path, keys: tuple[Key, ...], list_bad: dict) -> tuple[bytes, str, bool]:
    raw = yaml.safe_load(source.read_text())
    key = rng.choice(keys)
    if key.kind in list_bad:
        value, good = rng.choice(list_bad[key.kind]), False
    else:
        good = bool(key.good) and rng.random() < 0.2
        value = rng.choice(key.good) if good else rng.choice(bad_values(key))
    set_path(raw, key.path, value)
    return dump(raw), f"{key.path}={value!r}", good


GARBAGE_FILES = {
    "empty": b"",
    "list": b"- 1\n",
    "non-utf8": b"name: \xff\n",
    "bad-yaml": b"params: [1,\n",
    "anchor-bomb": anchor_bomb().encode(),
    "deep": deep_nesting().encode(),
}


def topology_file(rng: random.Random) -> Case:
    if rng.random() < 0.3:
        kind = rng.choice([*GARBAGE_FILES, "folder"])
        files = {"topo.yaml": GARBAGE_FILES.get(kind)}
        return Case(
            "topology-file",
            simulate(rng.choice(BASES), "--set", "topology=topo.yaml"),
            True,
            "topology",
            files,
            note=kind,
        )
    content, note, good = _mutated_file(rng, ROOT / "topologies" / "uniform.yaml", TOPOLOGY_KEYS, {})
    leaf = note.partition("=")[0].rsplit(".", 1)[-1]
    return Case(
        "topology-file",
        simulate(rng.choice(BASES), "--set", "topology=topo.yaml"),
        not good,
        leaf,
        {"topo.yaml": content},
        note=note,
    )


def profile_file(rng: random.Random) -> Case:
    if rng.random() < 0.3:
        kind = rng.choice([*GARBAGE_FILES, "folder"])
        return Case(
            "profile-file",
            simulate(rng.choice(BASES), "--set", "cost.profile=prof.yaml"),
            True,
            "cost.profile",
            {"prof.yaml": GARBAGE_FILES.get(kind)},
            note=kind,
        )
    content, note, good = _mutated_file(rng, ROOT / "traces" / "profiles" / "mi250x.yaml", PROFILE_KEYS, LIST_BAD)
    leaf = note.partition("=")[0].split(".", 1)[0]
    return Case(
        "profile-file",
        simulate(rng.choice(BASES), "--set", "cost.profile=prof.yaml"),
        not good,
        leaf,
        {"prof.yaml": content},
        note=note,
    )


TRACE = ROOT / "traces" / "routing" / "tiny-moe-stdlib-captured.npz"


def _npz(**arrays: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def routing_trace(rng: random.Random) -> Case:
    data = TRACE.read_bytes()
    with np.load(TRACE) as npz:
        arrays = {k: npz[k] for k in npz.files}
    meta = json.loads(str(arrays["meta"]))
    kind = rng.choice(
        (
            "truncated",
            "garbage",
            "empty",
            "folder",
            "no-meta",
            "bad-meta",
            "float-counts",
            "negative",
            "wrong-shape",
            "huge-meta",
            "other-model",
            "valid",
            "bit-flip",
            "npy",
            "bomb",
            "wrapping-counts",
            "huge-float-counts",
        )
    )
    if kind == "valid":
        return Case(
            "routing-trace",
            simulate("tiny-moe", "--set", "routing.kind=trace", "--set", f"routing.path={TRACE}"),
            False,
            note=kind,
        )
    if kind == "other-model":  # the tiny-moe trace on small-moe: its layer and expert counts do not match
        return Case(
            "routing-trace",
            simulate("small-moe", "--set", "routing.kind=trace", "--set", f"routing.path={TRACE}"),
            True,
            "routing.path",
            note=kind,
        )
    flipped = bytearray(data)
    for _ in range(8):
        flipped[rng.randrange(len(flipped))] ^= 0xFF
    content: bytes | None = {
        "truncated": data[: rng.randrange(1, len(data) - 1)],
        "garbage": bytes(rng.randrange(256) for _ in range(500)),
        "empty": b"",
        "folder": None,
        "bit-flip": bytes(flipped),
        "no-meta": _npz(**{k: v for k, v in arrays.items() if k != "meta"}),
        "bad-meta": _npz(**{**arrays, "meta": np.array("{not json")}),
        "float-counts": _npz(**{**arrays, "counts": arrays["counts"].astype(float) + 0.5}),
        "negative": _npz(**{**arrays, "counts": -arrays["counts"]}),
        "wrong-shape": _npz(**{**arrays, "counts": arrays["counts"][0]}),
        "huge-meta": _npz(**{**arrays, "meta": np.array(json.dumps({**meta, "tokens_per_step": 10**30}))}),
        "npy": _npy(arrays["counts"]),
        "bomb": npz_bomb(arrays, "counts", (2**20, 2**20, 4)),  # 32 TiB declared
        "wrapping-counts": _npz(**{**arrays, "counts": wrapping_counts(arrays["counts"])}),
        "huge-float-counts": _npz(**{**arrays, "counts": arrays["counts"] * 1e30}),
    }[kind]
    return Case(
        "routing-trace",
        simulate("tiny-moe", "--set", "routing.kind=trace", "--set", "routing.path=t.npz"),
        True,
        "routing",
        {"t.npz": content},
        note=kind,
    )


def cli_option(rng: random.Random) -> Case:
    """CLI option values that must be refused (named by their flag) before any work starts."""
    a2a = [
        "study",
        "all-to-all",
        "--topology",
        "uniform",
        "--nodes",
        "1,2",
        "--sizes",
        "1MiB",
        "--algorithms",
        "flat",
        "--out",
        "out",
    ]
    coll = [
        "study",
        "collective",
        "--collective",
        "all_reduce",
        "--topology",
        "uniform",
        "--gpus",
        "2,4",
        "--sizes",
        "1MiB",
        "--algorithms",
        "ring",
        "--out",
        "out",
    ]
    imb = [
        "study",
        "imbalance",
        "tiny-moe",
        "--skews",
        "0,1",
        "--policies",
        "none",
        "--steps",
        "2",
        "--drift-steps",
        "0",
        "--out",
        "out",
    ]
    plan = [
        "plan",
        "tiny-moe",
        "--gpus",
        "4",
        "--global-batch",
        "8",
        "--topology",
        "uniform",
        "--workers",
        "0",
        "--top",
        "0",
        "--out",
        "out",
    ]

    def replace(argv: list[str], flag: str, value: str) -> list[str]:
        argv = list(argv)
        if flag in argv and flag != "--set":
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
        return argv

    options = [
        (["schedule", "show", "small-moe"], "--width", ("-5", "0", "3", "nan", "10" * 12)),
        (a2a, "--sizes", ("0B", "-1MiB", "1XB", "nanMiB", "1e400MiB", "9" * 40 + "GiB", ",")),
        (a2a, "--max-flows", ("0", "-1", "abc")),
        (a2a, "--nodes", ("0", "-2", "abc", "1,,x", "9" * 30)),
        (a2a, "--algorithms", ("bogus", ",")),
        (a2a, "--placement", ("bogus", "5")),
        (a2a, "--topology", ("bogus", "5", "/nonexistent.yaml")),
        (
            a2a,
            "--set",
            (
                "topology.params.bogus=1",
                "topology.params.nic_bandwidth_GBps=.nan",
                "topology.params.nic_bandwidth_GBps=[1",
                "nic=1",
            ),
        ),
        (coll, "--collective", ("bogus", "", "all-reduce")),
        (coll, "--gpus", ("1", "0", "abc", "2,,x", "9" * 30)),
        (coll, "--sizes", ("0B", "nanMiB", ",")),
        (coll, "--algorithms", ("bogus", "nccl", "flat")),
        (imb, "--skews", ("-1", "abc", "nan", "inf", ",", "1e400")),
        (imb, "--policies", ("bogus", ",")),
        (imb, "--steps", ("0", "-1", "100000000000")),
        (imb, "--drift-steps", ("-1", "10000000000")),
        (imb, "--drift-rate", ("nan", "-1", "inf")),
        (imb, "--kind", ("bogus",)),
        (plan, "--gpus", ("0", "-4", "99999999999999999999")),
        (plan, "--global-batch", ("0", "-1")),
        (plan, "--top", ("-1",)),
        (plan, "--seq-len", ("0", "-5")),
        (plan, "--reserve-GiB", ("nan", "-1", "inf")),
        (plan, "--workers", ("-1",)),
        (["reproduce", "a2a-levels", "--quick", "--out", "out"], "--workers", ("-1", "1000")),
        (
            [
                "study",
                "scaling",
                "tiny-moe",
                "--strong",
                "--global-batch",
                "8",
                "--topology",
                "uniform",
                "--out",
                "out",
            ],
            "--gpus",
            ("99999999999", "0", "8,-8", "8,2097152"),
        ),
        (
            ["sweep", "tiny-moe", "--grid", "parallel.pp=1", "--out", "out"],
            "--scheduler",
            ("ucx://127.0.0.1:8786", "tls://127.0.0.1:8786", "inproc://x", "tcp://host", "tcp://127.0.0.1:9"),
        ),
        (plan, "--fix", ("bogus=1", "parallel.pp=abc", "parallel.pp=0", "=")),
        (
            ["sweep", "tiny-moe", "--workers", "0", "--out", "out"],
            "--grid",
            ("parallel.pp=0", "bogus=1", "parallel.pp=", "=1", "parallel.pp=abc"),
        ),
        (["run", "tiny-moe", "--out", "out"], "--timeout", ("-1", "0", "nan", "inf")),
        (["validate", "--profile", "mi250x"], "--repeats", ("0", "-1")),
        (["validate"], "--profile", ("bogus", "/nonexistent.yaml")),
        (["calibrate", "--out", "p.yaml"], "--ranks", ("0", "-1")),
        (["calibrate", "--out", "p.yaml"], "--threads", ("0", "-2")),
        (["calibrate", "--out", "p.yaml"], "--timeout", ("0", "-1", "nan")),
        (["calibrate", "--out", "p.yaml"], "--refit", ("missing.json", "bad.json")),
        (["calibrate"], "--out", ("p.txt",)),
    ]
    argv, flag, values = rng.choice(options)
    value = rng.choice(values)
    argv = replace(argv, flag, value)
    files = {"bad.json": b"{not json"} if value == "bad.json" else {}
    set_key = value.partition("=")[0]  # --set topology.params.KEY=...: the error names that key
    key = set_key if flag == "--set" and set_key.startswith("topology.params.") else flag
    return Case("cli-option", argv, True, key, files, note=f"{argv[0]} {flag} {value[:40]}")


def out_path(rng: random.Random) -> Case:
    kind = rng.choice(
        (
            "is-a-file",
            "under-a-file",
            "too-long",
            "proc",
            "dev-null",
            "schedule-suffix",
            "schedule-under-file",
            "compare-under-file",
        )
    )
    files = {"afile": b"x"}
    out = {
        "is-a-file": "afile",
        "under-a-file": "afile/sub",
        "too-long": "x" * 300,
        "proc": "/proc/piper-sim-out",
        "dev-null": "/dev/null",
    }.get(kind)
    if kind.startswith("schedule"):
        target = "plan.txt" if kind == "schedule-suffix" else "afile/s.json"
        return Case("out-path", ["schedule", "export", "tiny-moe", "--out", target], True, "--out", files, note=kind)
    if kind == "compare-under-file":
        return Case(
            "out-path",
            ["compare", "ref/sim", "ref/sim2", "--out", "afile/c"],
            True,
            "--out",
            files,
            copies={"ref": "ref"},
            note=kind,
        )
    command = rng.choice(
        (
            ["simulate", "tiny-moe"],
            [
                "study",
                "imbalance",
                "tiny-moe",
                "--skews",
                "0",
                "--policies",
                "none",
                "--steps",
                "2",
                "--drift-steps",
                "0",
            ],
        )
    )
    return Case("out-path", [*command, "--out", out], True, "--out", files, note=f"{command[0]} {kind}")


def compare_inputs(rng: random.Random) -> Case:
    kind = rng.choice(
        (
            "valid",
            "missing-trace",
            "corrupt-parquet",
            "corrupt-report",
            "missing-report",
            "no-dir",
            "other-model",
            "empty-csv",
            "report-not-mapping",
        )
    )
    argv = ["compare", "ref/sim", "ref/sim2"]
    if kind == "valid":
        return Case("compare", argv, False, copies={"ref": "ref"}, note=kind)
    if kind == "no-dir":
        return Case("compare", ["compare", "nope", "ref/sim2"], True, "nope", copies={"ref": "ref"}, note=kind)
    if kind == "other-model":
        return Case("compare", ["compare", "ref/sim", "ref/other"], True, "model", copies={"ref": "ref"}, note=kind)
    edits: dict[str, bytes | None] = {
        "missing-trace": {},
        "corrupt-parquet": {"ref/sim2/trace.parquet": b"PAR1 not really"},
        "corrupt-report": {"ref/sim2/report.json": b'{"step_time_s": '},
        "missing-report": {},
        "empty-csv": {"ref/sim2/trace.csv": b""},
        "report-not-mapping": {"ref/sim2/report.json": b"[1, 2]"},
    }[kind]
    removes = {
        "missing-trace": ["ref/sim2/trace.parquet"],
        "missing-report": ["ref/sim2/report.json"],
        "empty-csv": ["ref/sim2/trace.parquet"],
    }.get(kind, [])
    return Case("compare", argv, True, "ref/sim2", dict(edits), copies={"ref": "ref"}, removes=removes, note=kind)


HF_CONFIG = {
    "model_type": "mixtral",
    "num_hidden_layers": 4,
    "hidden_size": 256,
    "num_attention_heads": 4,
    "vocab_size": 1000,
    "max_position_embeddings": 256,
    "intermediate_size": 256,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
}
HF_HUGE = (10**30, 2**63, 10**10, 10**9, 1e30)
CPU_PROFILE = ROOT / "traces" / "profiles" / "cpu-2rank.yaml"
FRONTIER = ("--set", "topology=frontier", "--set", "cost.profile=mi250x")


def _hf_config(rng: random.Random) -> Case:
    key = rng.choice(list(HF_CONFIG)[1:])
    value = rng.choice(HF_HUGE)
    cfg = {
        "model": "hf/config.json",
        "parallel": {"pp": 1, "ep": 1, "dp": 1, "num_microbatches": 2, "micro_batch_size": 1},
    }
    files = {"hf/config.json": json.dumps({**HF_CONFIG, key: value}).encode(), "cfg.yaml": dump(cfg)}
    return Case("hostile", simulate("cfg.yaml"), True, f"hf_config.{key}", files, note=f"hf {key}={value!r}")


def _profile_measurements(rng: random.Random) -> Case:
    raw = yaml.safe_load(CPU_PROFILE.read_text())
    where, value = rng.choice(
        (
            ("measurements", [1, 2]),
            ("measurements.network", "x"),
            ("measurements.optimizer", {"per_tensor_us": "x"}),
            ("measurements.framework_overhead", [1]),
            ("measurements.framework_overhead.micro_model", rng.choice(("abc", [1]))),
            ("measurements.framework_overhead.shapes", [[1]]),
        )
    )
    node, parts = raw, where.split(".")
    for part in parts[:-1]:
        node = node[part]
    node[parts[-1]] = value
    return Case(
        "hostile",
        simulate("tiny-moe", "--set", "cost.profile=p.yaml", "--set", "cost.allow_device_mismatch=true"),
        True,
        f"cost.profile.{where}",
        {"p.yaml": dump(raw)},
        note=f"profile {where}={value!r}",
    )


def _machine_value(rng: random.Random) -> Case:
    setting, key = rng.choice(
        (
            ("topology.params.seed=abc", "topology.params.seed"),
            ("topology.params.seed=1.5", "topology.params.seed"),
            ("topology.params.nic_switch_spread=abc", "topology.params.nic_switch_spread"),
            ("topology.collectives.halo.chunk_MiB=0", "topology.collectives.halo.chunk_MiB"),
            ("topology.collectives.halo.max_slices=0", "topology.collectives.halo.max_slices"),
            ("topology.collectives.rccl.net_chunk_MiB=0", "topology.collectives.rccl.net_chunk_MiB"),
            ("topology.collectives.rccl.rings=['0 1 2']", "topology.collectives.rccl.rings"),
        )
    )
    return Case("hostile", simulate("tiny-moe", *FRONTIER, "--set", setting), True, key, note=setting)


def _config_value(rng: random.Random) -> Case:
    setting, key = rng.choice(
        (
            ("routing.capacity_factor=1.0e+300", "routing.capacity_factor"),
            ("sim={steps: 1, 1: 2, b: 3}", "sim.1"),
            ("parallel.dp=1048576", "parallel"),
            ("cost.profile=no-such-profile", "no-such-profile.yaml"),
        )
    )
    return Case("hostile", simulate("tiny-moe", "--set", setting), True, key, note=setting)


def hostile_surface(rng: random.Random) -> Case:
    """Values an outside fuzzer found on surfaces the families above did not reach (issue 40): HF config.json
    sizes, a profile's measurements, a machine's seed and collective parameters, extreme config values."""
    return rng.choice((_hf_config, _profile_measurements, _machine_value, _config_value))(rng)


def _sweep_point(grid: str) -> tuple[str, str]:
    """The digest and key of the one point of `sweep tiny-moe --grid GRID` (what its stored file is named and
    holds)."""
    from piper_sim.config import read_config_file
    from piper_sim.paths import config_path
    from piper_sim.points.keys import keyed_point
    from piper_sim.studies.config_sweep import parse_grid, sweep_points

    ((_, resolved),) = sweep_points(read_config_file(config_path("tiny-moe")), parse_grid([grid]))
    point = keyed_point({"config": resolved})
    return point.digest, point.key


def stored_point(rng: random.Random) -> Case:
    """A resumed sweep whose stored point file is damaged: it is recomputed (exit 0), never a traceback."""
    digest, key = _sweep_point("parallel.pp=1")
    damaged = {
        "empty": b"",
        "binary": bytes(rng.randrange(256) for _ in range(300)),
        "list": b"[1, 2]",
        "truncated": b'{"key": "',
        "key-list": json.dumps({"key": [key], "row": {"x": 1}}).encode(),
        "no-row": json.dumps({"key": key}).encode(),
        "row-empty": json.dumps({"key": key, "row": {}}).encode(),
        "row-list": json.dumps({"key": key, "row": [1]}).encode(),
        "deep": b"[" * 50_000,
        "row-nan": json.dumps({"key": key, "row": {"sim_step_time_s": float("nan")}}).encode(),
        "row-text": json.dumps({"key": key, "row": {"sim_step_time_s": "x"}}).encode(),
    }
    kind = rng.choice(sorted(damaged))
    files = {
        "out/.piper-sim.json": json.dumps({"command": "sweep"}).encode(),
        f"out/points/{digest}.json": damaged[kind],
    }
    return Case(
        "stored-point",
        ["sweep", "tiny-moe", "--grid", "parallel.pp=1", "--workers", "0", "--out", "out"],
        False,
        files=files,
        note=kind,
    )


def valid_command(rng: random.Random) -> Case:
    argv = rng.choice(
        (
            simulate("small-moe"),
            simulate("tiny-moe", "--set", "sim.trace_format=csv"),
            simulate("testbed-2g"),
            ["schedule", "show", "small-moe", "--width", "80"],
            ["schedule", "export", "tiny-moe", "--out", "s.json"],
            ["presets"],
            ["--version"],
            simulate("tiny-moe", "--set", "routing={kind: zipf, exponent: 1.2}"),
            [
                "study",
                "all-to-all",
                "--topology",
                "uniform",
                "--nodes",
                "1,2",
                "--sizes",
                "1MiB",
                "--algorithms",
                "flat",
                "--out",
                "out",
            ],
        )
    )
    return Case("valid", list(argv), False, note=" ".join(argv[:2]))


FAMILIES = (
    (config_key, 14, {"via_set": False}),
    (config_key, 12, {"via_set": True}),
    (set_text, 4, {}),
    (unknown_key, 6, {}),
    (section_type, 6, {}),
    (config_file, 5, {}),
    (topology_file, 6, {}),
    (profile_file, 8, {}),
    (routing_trace, 6, {}),
    (cli_option, 14, {}),
    (out_path, 4, {}),
    (compare_inputs, 4, {}),
    (hostile_surface, 8, {}),
    (stored_point, 4, {}),
    (valid_command, 3, {}),
)


def generate(count: int, seed: int, *, spread: bool = False) -> list[Case]:
    """`count` cases drawn with this seed (the same seed gives the same cases): families drawn by weight, or with
    `spread`, taken in turn (a few cases still cover every family)."""
    rng = random.Random(seed)
    makers = [(f, kw) for f, weight, kw in FAMILIES for _ in range(weight)]
    cases = []
    for i in range(count):
        maker, kwargs = (FAMILIES[i % len(FAMILIES)][::2]) if spread else rng.choice(makers)
        cases.append(maker(rng, **kwargs))
    return cases


def needs_reference(cases: list[Case]) -> bool:
    return any(c.copies for c in cases)
