"""`simulate --tier estimate`: the planner's estimator on any config, with the simulation's report.json keys (null
where only a simulation has the figure), its step time within 10% of the simulation's under balanced routing
(docs/planning.md), and seconds on 1,024 GPUs."""

from __future__ import annotations

import json

import pytest

from piper_sim.cli import main
from piper_sim.config import load_config
from piper_sim.planning.estimate_report import NOT_ESTIMATED, ignored_notes


def report(tmp_path, name: str, *args: str) -> dict:
    out = tmp_path / name
    assert main(["simulate", "small-moe", "--out", str(out), *args]) == 0
    return json.loads((out / "report.json").read_text())


def test_the_estimate_tier_writes_the_simulations_keys_and_a_step_time_near_it(tmp_path):
    des, est = report(tmp_path, "des"), report(tmp_path, "est", "--tier", "estimate")
    assert des["tier"] == "des" and est["tier"] == "estimate"
    assert set(est) == set(des) | {"estimate"}  # the same keys, and the estimator's terms
    assert all(est[key] is None for key in NOT_ESTIMATED) and all(des[key] is not None for key in NOT_ESTIMATED)
    assert est["step_time_s"] == pytest.approx(des["step_time_s"], rel=0.1)
    assert est["estimate"]["step_time_s"] == est["step_time_s"]
    for key in ("num_gpus", "tokens_per_step", "hbm_bytes", "fits_memory"):
        assert est[key] == des[key], key
    # the resource model and the estimator's FLOPs are the simulator's own formulas: equal under uniform routing
    assert est["peak_memory_bytes"] == pytest.approx(des["peak_memory_bytes"], rel=1e-12)
    assert est["model_flops_per_step"] == pytest.approx(des["model_flops_per_step"], rel=1e-12)
    assert est["mfu"] * est["step_time_s"] == pytest.approx(des["mfu"] * des["step_time_s"], rel=1e-12)  # one peak
    assert sorted(p.name for p in (tmp_path / "est").iterdir()) == [".piper-sim.json", "config.yaml", "report.json"]


def test_the_estimate_tier_prices_1024_gpus(tmp_path):
    sets = [
        "model=x-moe-small",
        "parallel.pp=4",
        "parallel.ep=64",
        "parallel.dp=4",
        "parallel.num_microbatches=16",
        "parallel.micro_batch_size=1",
    ]
    est = report(tmp_path, "big", "--tier", "estimate", *[a for s in sets for a in ("--set", s)])
    assert est["num_gpus"] == 1024 and len(est["peak_memory_bytes"]) == 4
    assert est["step_time_s"] > est["estimate"]["all_to_all_s"] > 0
    assert est["tokens_per_step"] == 16 * 4 * 64 * 2048


def test_what_the_estimate_leaves_out_is_named():
    plain = load_config("small-moe")
    assert ignored_notes(plain) == []
    skewed = load_config(
        "small-moe", ["routing={kind: zipf, exponent: 1.0}", "migration={enabled: true, policy: greedy}"]
    )
    notes = ignored_notes(skewed)
    assert len(notes) == 2 and notes[0].startswith("routing.kind") and notes[1].startswith("migration")
