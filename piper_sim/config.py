"""The run configuration: one YAML file (or mapping) with the sections of the README's Configuration.

Owns reading, `--set a.b=value` overrides, defaults, key checking and resolution of every
section into specs, each built once here and kept on Config: the model, the parallel plan, the routing model
(a replayed trace read here), the migration spec and the collective algorithms (checked against their registries).
The topology, placement and cost profile stay references (a name, a path or a mapping) that
piper_sim.machine.build_machine builds. Unknown keys are errors naming the key. No I/O beyond reading the files
named. The raw sections are read here only: Config.raw is what resolved() writes back out.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from piper_sim.bounds import check_int_bounds
from piper_sim.errors import ConfigError, one_of
from piper_sim.paths import config_path
from piper_sim.profile_choice import DEFAULT_PROFILE, choose_profile
from piper_sim.workload.context_parallel import check_context_parallel
from piper_sim.workload.deepspeed_zero import DEFAULT_GRADIENT_REDUCE, check_gradient_reduce
from piper_sim.workload.fsdp import check_hsdp, resolve_reshard
from piper_sim.workload.model import FP8_RECIPES, SET_BY_CONFIG, ModelSpec
from piper_sim.workload.parallel import ParallelSpec, parallel_from_section
from piper_sim.workload.precision import PRECISIONS
from piper_sim.workload.presets import list_presets, load_model
from piper_sim.workload.recompute import RECOMPUTE_MODES, RECOMPUTE_MODULES, Recompute, selective_modules
from piper_sim.yamlio import parse_yaml, read_yaml

if TYPE_CHECKING:  # numpy: built in resolve, not loaded by `piper-sim --help`
    from piper_sim.collectives.algorithms import CollectiveChoice
    from piper_sim.migration.controller import MigrationSpec
    from piper_sim.routing.models import RoutingModel

SECTIONS = (
    "model",
    "parallel",
    "schedule",
    "topology",
    "placement",
    "collectives",
    "routing",
    "migration",
    "cost",
    "sim",
    "recompute",
    "recompute_layers",
    "recompute_checkpoint_layers",
    "recompute_modules",
    "optimizer",
)
ZERO_STAGES = (0, 1, 2, 3)
ZERO3_SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")  # one backward per chunk (docs/sharding.md)
TWO_CHUNK_SCHEDULES = ("dualpipe", "dualpipe-v")  # each rank holds two chunks: parallel.vpp 2, their only value
DEFAULTS: dict = {
    "schedule": "1f1b",
    "topology": "uniform",
    "placement": "contiguous",
    "collectives": {"all_to_all": "flat", "all_reduce": "ring"},
    "routing": {"kind": "uniform"},
    "migration": {"enabled": False},
    "cost": {"profile": DEFAULT_PROFILE, "flash_attention": True},
    "sim": {"steps": 1, "seed": 0, "collapse": True},
    "recompute": "none",
    "recompute_layers": None,
    "recompute_checkpoint_layers": None,
    "optimizer": {"zero": 0},
}
SECTION_KEYS = {
    "collectives": {"all_to_all", "all_reduce", "overlap_all_to_all"},
    "cost": {"profile", "flash_attention", "allow_device_mismatch", "framework_reserve_GiB", "precision", "fp8_recipe"},
    "sim": {"steps", "seed", "trace_format", "collapse"},
    "optimizer": {"zero", "reshard_after_forward", "master_weights", "gradient_reduce"},
    "parallel": {
        "pp",
        "ep",
        "dp",
        "tp",
        "etp",
        "sp",
        "vpp",
        "num_microbatches",
        "micro_batch_size",
        "world_size",
        "convention",
        "cp",
        "dp_shard",
    },
}
# sections that are not a mapping of known keys: the types they may take
SECTION_TYPES = {
    "model": ((str, dict), "a preset name, an inline mapping or a path"),
    "topology": ((str, dict), "a preset name, a YAML path or a mapping {builder, params} or {preset, params}"),
    "placement": ((str, list, dict), "a policy name, a list of node indices or a mapping {policy, ...}"),
    "routing": ((dict,), "a mapping with kind"),
    "migration": ((dict,), "a mapping of migration keys"),
    "schedule": ((str,), "a schedule name"),
    "recompute": ((str,), ", ".join(RECOMPUTE_MODES)),
}


@dataclass(frozen=True, kw_only=True)
class Config:
    """A resolved configuration: every section built once (the machine's references stay as given: machine.py builds
    them), and the raw sections resolved() writes back out."""

    model: ModelSpec
    parallel: ParallelSpec
    schedule: str
    topology: str | dict  # a preset name, a YAML path or a mapping (topology.load)
    placement: str | list | dict  # a policy name, node indices or a mapping (topology.placement)
    collectives: CollectiveChoice
    routing: RoutingModel  # the `routing` section for the model's experts and the seed (a trace read once)
    migration: MigrationSpec
    cost_profile: str | dict  # a profile name, a YAML path or a mapping (workload.profile_load)
    flash_attention: bool
    steps: int
    seed: int
    trace_format: str
    collapse: bool  # simulate interchangeable ranks of a stage as one lane (exact; checked at run time)
    recompute: str = "none"  # activation recomputation: none | selective | full
    recompute_layers: int | None = None  # full: layers of each pipeline chunk recomputed (None: all)
    recompute_checkpoint_layers: int | None = None  # full: layers per checkpoint (None: the whole chunk)
    recompute_modules: tuple[str, ...] = ()  # selective: what it re-runs (workload/recompute.py); () otherwise
    framework_reserve_bytes: float | None = None  # cost.framework_reserve_GiB (None: the profile's)
    zero: int = 0  # optimizer-state sharding over the data-parallel replicas (ZeRO stage 0, 1 or 2)
    reshard_after_forward: bool = True  # ZeRO-3: FSDP2's (optimizer.reshard_after_forward; workload/fsdp.py)
    gradient_reduce: str = DEFAULT_GRADIENT_REDUCE  # ZeRO-1/2: or DeepSpeed's all-reduces (workload/deepspeed_zero.py)
    raw: dict
    given: frozenset[str] = frozenset()  # keys the user's config named: "routing", "cost.profile", ... (notes.py)
    profile_reason: str = ""  # why cost_profile, where the config gave none (profile_choice.py; notes.py)
    taken: tuple[str, ...] = ()  # values resolve took in the user's place, each said as a note (notes.py)

    def resolved(self) -> dict:
        """The config as written to config.yaml: every section explicit, the model inline."""
        out = copy.deepcopy(self.raw)
        out["model"] = {k: v for k, v in asdict(self.model).items() if v not in (None, "") and k not in SET_BY_CONFIG}
        out["parallel"] = asdict(self.parallel)
        return out


def read_config_file(path: str | Path) -> dict:
    path = Path(path)
    if not path.exists() and str(path) in list_presets():  # a model's name where a run's config belongs
        raise ConfigError(
            "config",
            str(path),
            f"a config file; {path} is a model preset: `piper-sim plan {path} "
            "--gpus N --global-batch SEQS --out DIR` chooses a plan for it and "
            f"writes DIR/best.yaml, or write a config with `model: {path}` and a "
            "parallel section (`piper-sim presets` lists the example configs)",
        )
    raw = read_yaml(path, "config")
    if not isinstance(raw, dict):
        raise ConfigError("config", str(path), "a YAML mapping of sections")
    base = path.parent
    for key in ("model", "topology"):  # relative paths in a config are relative to the config file
        value = raw.get(key)
        if isinstance(value, str) and value.endswith((".yaml", ".yml", ".json")) and not Path(value).is_absolute():
            raw[key] = str(base / value)
    routing = raw.get("routing")
    if isinstance(routing, dict) and isinstance(routing.get("path"), str) and not Path(routing["path"]).is_absolute():
        candidate = base / routing["path"]
        if candidate.exists():
            routing["path"] = str(candidate)
    return raw


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """Apply `a.b=value` overrides; values are parsed as YAML (numbers, lists, booleans)."""
    out = copy.deepcopy(raw)
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ConfigError("--set", item, "KEY=VALUE, e.g. parallel.pp=4")
        parts = key.split(".")
        if parts[0] not in SECTIONS:
            raise ConfigError(f"--set {key}", text, f"a key under one of {', '.join(SECTIONS)}")
        node = out
        for i, part in enumerate(parts[:-1]):
            if not isinstance(node.get(part), dict):
                node[part] = (
                    {} if part not in node or node[part] is None else _as_mapping(".".join(parts[: i + 1]), node[part])
                )
            node = node[part]
        node[parts[-1]] = parse_yaml(text, f"--set {key}")
    return out


# the key a section given by name stands for, when --set gives it sub-keys (cost.profile: a named profile is the
# profile that extends it); other sections given by name are a policy
NAMED_AS = {"model": "preset", "topology": "preset", "cost": "profile", "cost.profile": "extends"}


def _as_mapping(key: str, value: object) -> dict:
    if isinstance(value, str):
        return {NAMED_AS.get(key, "policy"): value}
    raise ConfigError(key, value, "a mapping to set sub-keys on")


def resolve(raw: dict, devices: str | None = None) -> Config:
    """Check keys and types and build the specs. devices "cpu": the ranks compute on this machine's CPUs (a
    real run), whatever the topology's devices (profile_choice.py)."""
    unknown = sorted(set(raw) - set(SECTIONS))
    if unknown:
        raise ConfigError(unknown[0], raw[unknown[0]], f"a section: {', '.join(SECTIONS)}")
    check_int_bounds(raw)
    full = {**copy.deepcopy(DEFAULTS), **copy.deepcopy(raw)}
    for section, (types, allowed) in SECTION_TYPES.items():
        if section in full and not isinstance(full[section], types):
            raise ConfigError(section, full[section], allowed)
    for section, keys in SECTION_KEYS.items():
        value = full.get(section)
        if section == "cost" and isinstance(value, str):
            value = full[section] = {"profile": value}
        if not isinstance(value, dict):
            raise ConfigError(section, value, f"a mapping with keys {', '.join(sorted(keys))}")
        bad = sorted(set(value) - keys)
        if bad:
            raise ConfigError(f"{section}.{bad[0]}", value[bad[0]], one_of(keys, str(bad[0])))
        if section in DEFAULTS and isinstance(DEFAULTS[section], dict):
            full[section] = {**DEFAULTS[section], **value}
    if "model" not in raw:
        raise ConfigError("model", None, "a preset name, an inline mapping or a path (required)")
    model = with_master_weights(with_precision(load_model(full["model"]), full["cost"]), full["optimizer"])
    taken = _two_chunk_vpp(full)
    parallel = parallel_from_section(full.get("parallel", {}))
    parallel.validate(model)
    sim = full["sim"]
    steps, seed = sim.get("steps", 1), sim.get("seed", 0)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError("sim.steps", steps, "a positive integer")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError("sim.seed", seed, "an integer")
    trace_format = sim.get("trace_format", "parquet")
    if trace_format not in ("parquet", "csv"):
        raise ConfigError("sim.trace_format", trace_format, "parquet or csv")
    if not isinstance(sim.get("collapse", True), bool):
        raise ConfigError("sim.collapse", sim["collapse"], "true or false")
    # numpy, networkx: config stays light, since the schedule layer (numpy-free) and `piper-sim --help` import it
    from piper_sim.collectives.algorithms import collective_choice
    from piper_sim.migration.controller import migration_from_config
    from piper_sim.routing.models import routing_from_config

    migration = migration_from_config(full["migration"])  # raises ConfigError naming migration.<key>
    routing = routing_from_config(full["routing"], model.num_experts, model.top_k, seed)
    if not isinstance(full["schedule"], str):
        raise ConfigError("schedule", full["schedule"], "a schedule name")
    for flag in ("flash_attention", "allow_device_mismatch"):
        if not isinstance(full["cost"].get(flag, False), bool):
            raise ConfigError(f"cost.{flag}", full["cost"][flag], "true or false")
    check_context_parallel(parallel, full["cost"]["flash_attention"])
    given = _given_keys(raw)
    choice = choose_profile(
        full["topology"],
        full["cost"]["profile"] if "cost.profile" in given else None,
        allow_mismatch=full["cost"].get("allow_device_mismatch", False),
        devices=devices,
    )
    full["cost"]["profile"] = choice.profile
    recompute, recompute_layers, zero = _plan_features(full, parallel)
    check_hsdp(parallel.dp_replicate, zero)
    collectives = collective_choice(full["collectives"])  # raises ConfigError naming collectives.<key>
    check_overlap(collectives.overlap_all_to_all, full["schedule"], parallel, zero)
    return Config(
        model=model,
        parallel=parallel,
        recompute=recompute,
        recompute_layers=recompute_layers,
        zero=zero,
        reshard_after_forward=resolve_reshard(
            full["optimizer"].get("reshard_after_forward"), zero=zero, pp=parallel.pp
        ),
        gradient_reduce=check_gradient_reduce(full["optimizer"].get("gradient_reduce"), zero),
        recompute_checkpoint_layers=_checkpoint_layers(full, recompute),
        recompute_modules=_recompute_modules(full.get("recompute_modules"), recompute, model),
        framework_reserve_bytes=_reserve_bytes(full["cost"].get("framework_reserve_GiB")),
        schedule=full["schedule"],
        topology=full["topology"],
        placement=full["placement"],
        collectives=collectives,
        routing=routing,
        migration=migration,
        cost_profile=full["cost"]["profile"],
        flash_attention=full["cost"]["flash_attention"],
        steps=steps,
        seed=seed,
        trace_format=trace_format,
        collapse=sim.get("collapse", True),
        raw=full,
        given=given,
        profile_reason=choice.reason,
        taken=taken,
    )


def with_master_weights(model: ModelSpec, optimizer: dict) -> ModelSpec:
    """The model with optimizer.master_weights (default true: an fp32 master copy and fp32 Adam moments; false: all
    in the model's dtype; workload/memory.py), checked."""
    master = optimizer.get("master_weights", True)
    if not isinstance(master, bool):
        raise ConfigError("optimizer.master_weights", master, "true or false")
    return model if master else replace(model, master_weights=False)


def with_precision(model: ModelSpec, cost: dict) -> ModelSpec:
    """The model with cost.precision's GEMM precision (fp8: its linears in fp8 under cost.fp8_recipe, default
    delayed; workload/precision.py), checked (a real run refuses fp8: measure.py)."""
    precision, recipe = cost.get("precision", "bf16"), cost.get("fp8_recipe")
    if precision not in PRECISIONS:
        raise ConfigError("cost.precision", precision, one_of(PRECISIONS, str(precision)))
    if recipe is not None and (precision != "fp8" or recipe not in FP8_RECIPES):
        raise ConfigError(
            "cost.fp8_recipe", recipe, " or ".join(FP8_RECIPES) + " with cost.precision fp8, else left out"
        )
    if precision == "bf16":
        return model
    return replace(model, fp8_recipe=recipe or FP8_RECIPES[0])


def _two_chunk_vpp(full: dict) -> tuple[str, ...]:
    """DualPipe and DualPipeV allow parallel.vpp 2 only: taken where the config leaves vpp out or gives 1 (no
    virtual stages), and said (Config.taken); any other value stays, for the schedule's own error."""
    section = full.setdefault("parallel", {})
    vpp = section.get("vpp", 1) if isinstance(section, dict) else None
    if full["schedule"] not in TWO_CHUNK_SCHEDULES or type(vpp) is not int or vpp != 1:
        return ()
    was = "not given: 2" if "vpp" not in section else "1 taken as 2"
    section["vpp"] = 2
    return (f"parallel.vpp {was}, the only value schedule {full['schedule']} allows (each rank holds two chunks)",)


def _given_keys(raw: dict) -> frozenset[str]:
    """The sections the user's config named, and the keys inside those given as mappings ("cost.profile");
    a section given as a name stands for its main key (cost: mi250x is cost.profile)."""
    keys = set(raw)
    for section, value in raw.items():
        if isinstance(value, dict):
            keys |= {f"{section}.{key}" for key in value}
        elif section == "cost" and value is not None:
            keys.add("cost.profile")
    return frozenset(keys)


def _reserve_bytes(gib: object) -> float | None:
    """cost.framework_reserve_GiB, checked: HBM a plan may not use, per device (None: the profile's)."""
    if gib is None:
        return None
    if isinstance(gib, bool) or not isinstance(gib, int | float) or not 0 <= gib < 1e6:
        raise ConfigError("cost.framework_reserve_GiB", gib, "a number of GiB from 0 (leave it out for the profile's)")
    return float(gib) * 2**30


def _checkpoint_layers(full: dict, recompute: str) -> int | None:
    """recompute_checkpoint_layers, checked: layers per checkpoint under full recomputation."""
    layers = full["recompute_checkpoint_layers"]
    if layers is None:
        return None
    if recompute != Recompute.FULL:
        raise ConfigError("recompute_checkpoint_layers", layers, "unset unless recompute is full")
    if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers <= 1 << 20:
        raise ConfigError(
            "recompute_checkpoint_layers",
            layers,
            "a positive integer (layers per checkpoint; "
            "Megatron-LM's --recompute-num-layers with --recompute-method uniform)",
        )
    return layers


def _recompute_modules(modules, recompute: str, model: ModelSpec) -> tuple[str, ...]:
    """recompute_modules, checked: Megatron-core's module names selective recomputation re-runs (default
    core_attn); none unless recompute is selective."""
    if modules is None:
        return selective_modules(recompute, None)
    allowed = f"a list of distinct names among {', '.join(RECOMPUTE_MODULES)} (Megatron-core's recompute_modules)"
    if recompute != Recompute.SELECTIVE:
        raise ConfigError("recompute_modules", modules, "unset unless recompute is selective")
    if (
        not isinstance(modules, list)
        or not modules
        or len(set(map(str, modules))) < len(modules)
        or not all(isinstance(m, str) and m in RECOMPUTE_MODULES for m in modules)
    ):
        raise ConfigError("recompute_modules", modules, allowed)
    if model.fp8_recipe and set(modules) - {"core_attn"}:
        raise ConfigError(
            "recompute_modules",
            modules,
            "core_attn only with cost.precision fp8 (the fp8 copies "
            "of recomputed norm and activation outputs are not modelled)",
        )
    return tuple(modules)


def _plan_features(full: dict, parallel: ParallelSpec) -> tuple[str, int | None, int]:
    """recompute, recompute_layers and optimizer.zero, checked."""
    recompute, layers, zero = full["recompute"], full["recompute_layers"], full["optimizer"]["zero"]
    if recompute not in RECOMPUTE_MODES:
        raise ConfigError("recompute", recompute, f"one of {', '.join(RECOMPUTE_MODES)}")
    if layers is not None:
        if recompute != Recompute.FULL:
            raise ConfigError("recompute_layers", layers, "unset unless recompute is full")
        if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
            raise ConfigError("recompute_layers", layers, "a positive integer (layers of each chunk recomputed)")
    if zero not in ZERO_STAGES or isinstance(zero, bool):
        raise ConfigError("optimizer.zero", zero, "0, 1, 2 or 3")
    if zero == 3 and full["schedule"] not in ZERO3_SCHEDULES:
        raise ConfigError(
            "optimizer.zero",
            zero,
            f"0, 1 or 2 with schedule {full['schedule']} (3 with "
            f"{', '.join(ZERO3_SCHEDULES)}: a split backward's weight pass is not gathered for)",
        )
    if zero == 2 and full["schedule"] == "dualpipe":
        raise ConfigError(
            "optimizer.zero",
            zero,
            "0 or 1 with schedule dualpipe (its two copies of the layers sum "
            "their full gradients after the backward, which ZeRO-2 does not keep)",
        )
    if zero and parallel.data_parallel == 1 and parallel.dp == 1:
        raise ConfigError("optimizer.zero", zero, "0 when there is one data-parallel replica (dp x ep x etp / tp = 1)")
    return recompute, layers, zero


OVERLAP_SCHEDULES = ("interleaved-1f1b", "dualpipe", "dualpipe-v")  # with pipelining (any 1F1B with pp 1)


def pairs_with_pipelining(schedule: str, pp: int, vpp: int) -> bool:
    """Whether collectives.overlap_all_to_all may pair this schedule's passes (check_overlap; ZeRO-3 aside)."""
    return pp == 1 or (schedule in OVERLAP_SCHEDULES and (schedule != "interleaved-1f1b" or vpp > 1))


def check_overlap(overlap: bool, schedule: str, parallel: ParallelSpec, zero: int) -> None:
    """collectives.overlap_all_to_all pairs a forward with the backward of another micro-batch that follows it
    (schedule/lower_overlap.py): Megatron-core's combined 1F1B runs without pipelining or with virtual stages, DualPipe
    pairs its own; ZeRO-3's gathers are not lowered into pairs."""
    if not overlap:
        return
    if not pairs_with_pipelining(schedule, parallel.pp, parallel.vpp):
        raise ConfigError(
            "collectives.overlap_all_to_all",
            overlap,
            f"false with schedule {schedule} at parallel.pp {parallel.pp}, vpp {parallel.vpp} (true with "
            "interleaved-1f1b and vpp > 1, dualpipe, dualpipe-v, or 1f1b / interleaved-1f1b at pp 1)",
        )
    if zero == 3:
        raise ConfigError("collectives.overlap_all_to_all", overlap, "false with optimizer.zero 3")


def load_config(path: str | Path | dict, overrides: list[str] | None = None, *, devices: str | None = None) -> Config:
    """The resolved config of a YAML file, a shipped example's name (examples/NAME.yaml) or a mapping, with
    `a.b=value` overrides. devices "cpu": priced as ranks on this machine's CPUs (resolve)."""
    raw = path if isinstance(path, dict) else read_config_file(config_path(str(path)))
    return resolve(apply_overrides(raw, overrides or []), devices)


def with_overrides(cfg: Config, overrides: list[str]) -> Config:
    """cfg with `a.b=value` overrides, resolved again; the keys its user named stay the ones noted (notes.py)."""
    return replace(resolve(apply_overrides(cfg.raw, overrides)), given=cfg.given)


def for_devices(cfg: Config, devices: str | None) -> Config:
    """cfg priced for the devices its ranks compute on: devices "cpu" (a real run on this machine's CPUs) takes a
    CPU profile where the config gave none and refuses a given one of other devices (profile_choice.py)."""
    if devices is None:
        return cfg
    choice = choose_profile(
        cfg.topology,
        cfg.cost_profile if "cost.profile" in cfg.given else None,
        allow_mismatch=cfg.raw["cost"].get("allow_device_mismatch", False),
        devices=devices,
    )
    raw = copy.deepcopy(cfg.raw)
    raw["cost"]["profile"] = choice.profile
    return replace(cfg, cost_profile=choice.profile, profile_reason=choice.reason, raw=raw)
