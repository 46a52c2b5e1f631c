"""Config checking and the CLI: one clear message naming the key, exit status 2, no traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from piper_sim.cli import main
from piper_sim.config import load_config
from piper_sim.errors import ConfigError

BASE = {"model": "small-moe", "parallel": {"pp": 2, "ep": 4, "num_microbatches": 4}}


@pytest.mark.parametrize(
    "raw,key",
    [
        ({**BASE, "bogus": 1}, "bogus"),
        ({**BASE, "parallel": {"pp": 2, "ep": 4, "pipeline": 3}}, "parallel.pipeline"),
        ({**BASE, "parallel": {"pp": 2, "ep": 3}}, "parallel.ep"),  # 3 does not divide 8 experts
        ({**BASE, "parallel": {"pp": 16, "ep": 1}}, "parallel.pp"),  # 8 layers < 16 stages
        ({**BASE, "parallel": {"pp": 2, "ep": 4, "world_size": 16}}, "parallel.world_size"),
        ({**BASE, "parallel": {"pp": "two"}}, "parallel.pp"),
        ({**BASE, "schedule": "2f2b"}, "schedule"),
        ({**BASE, "collectives": {"all_to_all": "magic"}}, "collectives.all_to_all"),
        ({**BASE, "sim": {"steps": 0}}, "sim.steps"),
        ({**BASE, "cost": {"profile": "no-such-gpu"}}, "cost.profile"),
        ({**BASE, "topology": "no-such-machine"}, "topology"),
        ({**BASE, "model": {"preset": "small-moe", "top_k": 99}}, "model.top_k"),
    ],
)
def test_bad_config_names_the_key(raw, key, tmp_path):
    from piper_sim.simulator import simulate

    with pytest.raises(ConfigError) as err:
        simulate(load_config(raw))
    assert err.value.key.startswith(key)


@pytest.mark.parametrize("key", ["all_to_all", "all_reduce"])
def test_a_collective_typo_is_refused_at_load(key):
    """collectives.all_to_all and collectives.all_reduce are checked against their registries when the config is
    loaded (not once the schedule is lowered and the machine built)."""
    with pytest.raises(ConfigError) as err:
        load_config(BASE, [f"collectives.{key}=flatt"])
    assert err.value.key == f"collectives.{key}" and err.value.value == "flatt"


def test_overrides_apply_and_parse_values():
    cfg = load_config(BASE, ["parallel.pp=4", "parallel.ep=2", "sim.seed=7", "routing.kind=zipf"])
    assert (cfg.parallel.pp, cfg.parallel.ep, cfg.seed, cfg.routing.kind) == (4, 2, 7, "zipf")


def test_cli_simulate_writes_the_contract_files(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["simulate", "small-moe", "--out", str(out), "--set", "parallel.num_microbatches=4"]) == 0
    for name in (
        "config.yaml",
        "report.json",
        "trace.parquet",
        "perfetto.json",
        "links.csv",
        "plots/timeline.png",
        "plots/link_utilization.png",
    ):
        assert (out / name).exists(), name
    report = json.loads((out / "report.json").read_text())
    for key in (
        "num_gpus",
        "step_time_s",
        "tokens_per_s",
        "model_flops_per_step",
        "tflops_per_gpu",
        "mfu",
        "bubble_fraction",
        "exposed_comm_fraction",
        "peak_memory_bytes",
        "all_to_all_bandwidth_bytes_per_s",
        "sim_wall_s",
    ):
        assert key in report, key
    assert report["num_gpus"] == 8 and len(report["peak_memory_bytes"]) == 2
    perfetto = json.loads((out / "perfetto.json").read_text())
    assert {e["pid"] for e in perfetto["traceEvents"] if e["ph"] == "X"} == set(range(8))


def test_cli_bad_config_prints_one_line_and_exits_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: small-moe\nparallel: {pp: 2, ep: 3}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "piper_sim.cli", "simulate", str(bad), "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "parallel.ep" in proc.stderr and "divisor" in proc.stderr
    assert not (tmp_path / "o").exists()


def test_a_model_preset_given_as_config_says_how_to_make_one(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["simulate", "x-moe-small", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is a model preset" in err and "piper-sim plan x-moe-small" in err
    assert not (tmp_path / "o").exists()


def test_cli_schedule_show_and_export(tmp_path, capsys):
    assert main(["schedule", "show", "small-moe", "--set", "parallel.num_microbatches=4"]) == 0
    shown = capsys.readouterr().out
    assert "stage 0 | F0" in shown and "no deadlock" in shown
    path = tmp_path / "s.json"
    assert main(["schedule", "export", "small-moe", "--out", str(path)]) == 0
    from piper_sim.schedule.build import build_schedule
    from piper_sim.schedule.io import schedule_from_json

    assert schedule_from_json(path.read_text()) == build_schedule(load_config("examples/small-moe.yaml"))


def test_version_is_printed(capsys):
    from piper_sim import __version__

    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out.strip() == f"piper-sim {__version__}"


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["model.num_heads=512", "model.d_model=256"], "model.num_heads"),
        (["model.moe_layer_freq=100"], "model.moe_layer_freq"),
    ],
)
def test_shapes_that_make_no_sense_are_refused(overrides, key):
    with pytest.raises(ConfigError) as err:
        load_config({"model": "tiny-moe", "parallel": {"pp": 1, "ep": 1, "num_microbatches": 1}}, overrides)
    assert str(err.value).startswith(key)


def test_the_readme_example_is_x_moe_small_on_one_frontier_node_with_halo():
    from piper_sim.config import load_config
    from piper_sim.paths import config_path
    from piper_sim.simulator import simulate

    cfg = load_config(config_path("x-moe-small-frontier"))
    assert (cfg.model.name, cfg.parallel.num_gpus, cfg.collectives.all_to_all) == ("x-moe-small", 8, "halo")
    result = simulate(cfg)
    assert result.report.fits_memory == [True, True] and result.report.step_time_s > 0
    assert len({result.topology.host_of(g) for g in result.placement}) == 1  # one node


def test_presets_lists_cost_profiles_and_examples(capsys):
    from piper_sim.cli import main

    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    assert "cost profiles: a100" in out and "mi250x" in out and "x-moe-small-frontier" in out
