"""Stored points are keyed by what they were computed from: the point, the content of every file it reads and the
code version. A rerun reuses a point only under the same key, recomputes a stale one and counts both."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from piper_sim.cli import main
from piper_sim.paths import data_dir
from piper_sim.points import keys
from piper_sim.points.keys import input_files, point_key
from piper_sim.routing.models import routing_from_config
from piper_sim.routing.synth import synthesize_trace
from piper_sim.routing.trace import write_trace
from piper_sim.studies import config_sweep as sweep_module
from piper_sim.studies.all_to_all import StudySpec, write_study
from piper_sim.studies.config_sweep import run_sweep
from piper_sim.studies.imbalance import run_points as run_imbalance
from piper_sim.studies.imbalance import study_points
from piper_sim.workload.presets import PRESET_DIR

BASE = {"model": "tiny-moe", "parallel": {"pp": 1, "ep": 2, "num_microbatches": 4}}
GRID = ["parallel.pp=1,2"]


def _halve_peak(path: Path) -> None:
    text = path.read_text()
    peak = float(re.search(r"^peak_bf16_TFLOPS:\s*([0-9.]+)", text, re.M).group(1))
    path.write_text(re.sub(r"^peak_bf16_TFLOPS:.*$", f"peak_bf16_TFLOPS: {peak / 2}", text, flags=re.M))


def _sweep_cli(profile: Path, out: Path) -> tuple[float, dict]:
    argv = [
        "sweep",
        "small-moe",
        "--set",
        f"cost.profile={profile}",
        "--grid",
        "parallel.pp=2",
        "--workers",
        "0",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    step = float(pd.read_csv(out / "sweep.csv")["sim_step_time_s"].iloc[0])
    return step, yaml.safe_load((out / "sweep.yaml").read_text())["points"]


def test_a_sweep_rerun_after_its_profile_changed_gives_the_new_step(tmp_path):
    profile = tmp_path / "mytest.yaml"
    shutil.copy(data_dir("traces/profiles") / "mi250x.yaml", profile)
    old_step, first = _sweep_cli(profile, tmp_path / "stale")
    assert first == {"reused": 0, "stale": 0, "unreadable": 0, "computed": 1}
    _halve_peak(profile)
    new_step, second = _sweep_cli(profile, tmp_path / "stale")
    fresh_step, _ = _sweep_cli(profile, tmp_path / "fresh")
    assert second == {"reused": 0, "stale": 1, "unreadable": 0, "computed": 1}
    assert new_step == fresh_step and new_step > old_step  # half the peak: slower compute, a longer step


def test_an_unchanged_rerun_reuses_every_point(tmp_path, monkeypatch):
    first = run_sweep(BASE, GRID, tmp_path, workers=0, progress=False)
    monkeypatch.setattr(sweep_module, "simulate_point", lambda payload: pytest.fail("a stored point was recomputed"))
    again = run_sweep(BASE, GRID, tmp_path, workers=0, progress=False)
    assert again.equals(first)
    assert yaml.safe_load((tmp_path / "sweep.yaml").read_text())["points"] == {
        "reused": 2,
        "stale": 0,
        "unreadable": 0,
        "computed": 0,
    }


def test_another_code_version_recomputes_every_point(tmp_path, monkeypatch):
    first = run_sweep(BASE, GRID, tmp_path, workers=0, progress=False)
    monkeypatch.setattr(keys, "code_version", lambda: "0.0.0+another")
    again = run_sweep(BASE, GRID, tmp_path, workers=0, progress=False)
    assert yaml.safe_load((tmp_path / "sweep.yaml").read_text())["points"] == {
        "reused": 0,
        "stale": 2,
        "unreadable": 0,
        "computed": 2,
    }
    cols = [c for c in first.columns if c != "sim_wall_s"]
    assert again[cols].equals(first[cols])  # the same code in fact: the same figures, computed again


def test_the_code_version_counts_pricing_sources_only():
    counted = {"simulator.py", "sim/engine.py", "workload/cost.py", "workload/profile_load.py", "points/keys.py"}
    left_out = {
        "cli.py",
        "planning/cli.py",
        "simulate_commands.py",
        "progress.py",
        "torch_backend/training_run.py",
        "measure.py",
        "studies/collective_plots.py",
    }
    rels = {p.relative_to(keys.PACKAGE_DIR).as_posix() for p in keys.PACKAGE_DIR.rglob("*.py")}
    assert counted | left_out <= rels
    assert all(keys.counts_in_code_version(Path(r)) for r in counted)
    assert not any(keys.counts_in_code_version(Path(r)) for r in left_out)


@pytest.fixture
def inputs(tmp_path) -> dict[str, Path]:
    """A raw config naming one file of each kind a point reads: a model YAML whose preset is another model file,
    a topology YAML, a profile that extends another, a routing trace; and an HF config.json model."""
    files = {
        "base_profile": tmp_path / "base.yaml",
        "profile": tmp_path / "child.yaml",
        "topology": tmp_path / "topo.yaml",
        "model": tmp_path / "model.yaml",
        "base_model": tmp_path / "base-model.yaml",
        "trace": tmp_path / "trace.npz",
        "hf": tmp_path / "hf" / "config.json",
    }
    shutil.copy(data_dir("traces/profiles") / "mi250x.yaml", files["base_profile"])
    files["profile"].write_text(f"extends: {files['base_profile']}\nname: child\n")
    shutil.copy(data_dir("topologies") / "uniform.yaml", files["topology"])
    files["base_model"].write_text("preset: tiny-moe\nseq_len: 64\n")
    files["model"].write_text(f"preset: {files['base_model']}\nname: keyed\n")
    zipf = routing_from_config({"kind": "zipf", "exponent": 1.1}, 8, 2, 5)
    write_trace(
        synthesize_trace(
            zipf, model_name="toy", layers=[0, 1], steps=2, num_microbatches=2, num_sources=2, tokens_per_source=64
        ),
        files["trace"],
    )
    files["hf"].parent.mkdir()
    shutil.copy(Path(__file__).resolve().parents[1] / "data" / "hf" / "mixtral-8x7b" / "config.json", files["hf"])
    return files


def _raw(files: dict[str, Path], model: str = "model") -> dict:
    return {
        "model": str(files[model]),
        "topology": str(files["topology"]),
        "cost": {"profile": str(files["profile"])},
        "parallel": {"pp": 1, "ep": 2, "num_microbatches": 2},
        "routing": {"kind": "trace", "path": str(files["trace"]), "layers": "wrap"},
    }


def test_the_key_follows_every_file_a_point_reads(inputs):
    payload, hf_payload = {"config": _raw(inputs)}, {"config": _raw(inputs, "hf")}
    assert set(input_files(payload)) == {
        inputs[k] for k in ("base_profile", "profile", "topology", "model", "base_model", "trace")
    } | {PRESET_DIR / "tiny-moe.yaml"}
    before = {name: point_key(payload if name != "hf" else hf_payload) for name in inputs}
    assert before == {name: point_key(payload if name != "hf" else hf_payload) for name in inputs}  # stable
    for name, path in inputs.items():
        if path.suffix == ".npz":
            zipf = routing_from_config({"kind": "zipf", "exponent": 2.0}, 8, 2, 5)
            write_trace(
                synthesize_trace(
                    zipf,
                    model_name="toy",
                    layers=[0, 1],
                    steps=2,
                    num_microbatches=2,
                    num_sources=2,
                    tokens_per_source=64,
                ),
                path,
            )
        else:
            path.write_text(path.read_text() + "\n" if path.suffix == ".json" else path.read_text() + "# edited\n")
        assert point_key(payload if name != "hf" else hf_payload) != before[name], name


AUDIT = """
import json, sys
from piper_sim.planning.planner import simulate_point
opened = set()
sys.addaudithook(lambda event, args: opened.add(args[0]) if event == "open" and isinstance(args[0], str) else None)
simulate_point(json.loads(sys.argv[1]))
print(json.dumps(sorted(opened)))
"""


def test_every_data_file_a_point_opens_is_an_input_of_its_key(inputs):
    """The point run in a fresh process, every file it opens recorded: each data file (not Python's, not a
    library's, not the system's) is one its key digests."""
    payload = {"config": _raw(inputs)}
    done = subprocess.run(
        [sys.executable, "-c", AUDIT, json.dumps(payload)], capture_output=True, text=True, timeout=300, check=True
    )
    opened = {Path(p).resolve() for p in json.loads(done.stdout.splitlines()[-1])}
    system = [Path(p).resolve() for p in {sys.prefix, sys.base_prefix, "/proc", "/sys", "/dev", "/etc", "/usr"}]
    data = {
        p
        for p in opened
        if p.is_file()
        and p.suffix not in (".py", ".pyc", ".so", ".pth")
        and not any(p.is_relative_to(root) for root in system)
        and "cache" not in p.as_posix().lower()
        and not any(part.endswith((".egg-info", ".dist-info")) for part in p.parts)
    }  # package metadata
    assert {inputs["profile"].resolve(), inputs["trace"].resolve(), inputs["topology"].resolve()} <= data
    assert data <= {p.resolve() for p in input_files(payload)}


def test_the_studies_recompute_points_made_by_other_code(tmp_path, monkeypatch):
    spec = StudySpec(topology="uniform", nodes=(1,), sizes=("1MiB",), algorithms=("flat", "halo"))
    points = study_points(
        {**BASE, "routing": {"kind": "zipf"}},
        kind="zipf",
        skews=[1.0],
        policies=["none"],
        steps=1,
        drift_steps=0,
        drift_rate=0.0,
    )

    def run_both() -> tuple[list[str], str]:
        write_study(spec, tmp_path / "a2a", lambda line: None)
        run_imbalance(points, tmp_path / "imb", lambda line: None)
        a2a = sorted(json.loads(p.read_text())["key"] for p in (tmp_path / "a2a" / "points").glob("*.json"))
        return a2a, json.loads(next((tmp_path / "imb" / "points").glob("*.json")).read_text())["key"]

    first = run_both()
    monkeypatch.setattr(keys, "code_version", lambda: "0.0.0+another")
    again = run_both()  # a point reused would keep the key it was stored under
    assert again == (sorted(spec.keyed(1, alg, "1MiB").key for alg in ("flat", "halo")), points[0].keyed().key)
    assert set(again[0]).isdisjoint(first[0]) and again[1] != first[1]
