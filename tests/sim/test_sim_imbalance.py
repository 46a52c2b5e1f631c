"""Imbalance, multi-step and migration in the simulator."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from piper_sim.config import load_config
from piper_sim.routing.trace import TraceRecorder
from piper_sim.simulator import simulate
from piper_sim.workload.cost import TaskCoster
from piper_sim.workload.profile_load import load_profile

BASE = {"model": "small-moe", "parallel": {"pp": 2, "ep": 4, "num_microbatches": 4, "micro_batch_size": 1}}


def test_uniform_multi_step_equals_single_step():
    one = simulate(load_config(BASE)).report
    many = simulate(load_config(BASE, ["sim.steps=3"])).report
    assert many.step_times_s == pytest.approx([one.step_time_s] * 3, rel=1e-9)
    assert many.mfu == pytest.approx(one.mfu, rel=1e-9)


def test_skew_slows_the_step_and_expert_time_follows_the_rows():
    uniform = simulate(load_config(BASE))
    skewed = simulate(load_config({**BASE, "routing": {"kind": "zipf", "exponent": 1.5}}))
    assert skewed.report.step_time_s > uniform.report.step_time_s
    assert skewed.report.imbalance["overall"]["lif"] > 1.3
    # every expert task lasts exactly what the cost model says for that rank's rows
    cfg = load_config({**BASE, "routing": {"kind": "zipf", "exponent": 1.5}})
    coster = TaskCoster(cfg.model, load_profile("mi250x"), cfg.model.seq_len)
    experts = simulate(cfg)
    trace = experts.trace
    rows = trace[(trace["kind"] == "forward_expert")]
    program = {t.task_id: t for t in experts.schedule.stage_programs[0]}
    loads = []
    for r in rows[rows["rank"] < 4].itertuples():
        task = program[str(r.task_id)]
        layer = int(task.ops[0].split(":")[1])
        sent = trace[(trace["rank"] < 4) & (trace["task_id"] == f"F:c0:m{r.microbatch}:L{layer}:dispatch")]
        assert len(sent) == 4
        loads.append((r.end_s - r.start_s, r.flops))
    # the slowest expert task is the one with the most FLOPs (most rows): straggler follows the max load
    durations, flops = np.array(loads).T
    assert np.argmax(durations) == np.argmax(flops)
    assert (
        coster.cost("forward_expert", ("experts:0",), (100, 100))[0]
        < coster.cost("forward_expert", ("experts:0",), (400, 400))[0]
    )


def test_greedy_migration_lowers_imbalance_and_moves_real_bytes():
    raw = {
        **BASE,
        "model": {"preset": "small-moe", "num_experts": 16},
        "routing": {"kind": "zipf", "exponent": 1.2},
        "sim": {"steps": 4},
    }
    none = simulate(load_config(raw))
    greedy = simulate(load_config({**raw, "migration": {"enabled": True, "policy": "greedy"}}))
    mig = greedy.report.migration
    assert mig["experts_moved"] > 0
    moved = greedy.trace[greedy.trace["role"] == "migrate"]
    # bytes on the wire = what the policy says, per EP group (2 stages, one group each)
    assert moved["bytes"].sum() == pytest.approx(mig["bytes_moved_per_group"], rel=1e-9)
    later = slice(1, None)
    assert np.mean(greedy.report.step_times_s[later]) < np.mean(none.report.step_times_s[later])
    assert none.report.migration["experts_moved"] == 0


def test_routing_trace_replays_to_identical_simulations(tmp_path):
    cfg = load_config(BASE)
    rng = np.random.default_rng(0)
    layers = list(cfg.model.moe_layer_indices)
    rec = TraceRecorder(model="small-moe", num_experts=8, top_k=2, layers=layers, source="test")
    for step in range(2):
        for layer in layers:
            rec.record(step, layer, rng.multinomial(256 * 2 * 4 * 4, rng.dirichlet(np.full(8, 5.0))))
    path = rec.write(tmp_path / "t.npz")
    raw = {**BASE, "routing": {"kind": "trace", "path": str(path)}, "sim": {"steps": 2}}
    first = simulate(load_config(raw)).trace
    again = simulate(load_config(raw)).trace
    pd.testing.assert_frame_equal(first, again)
    assert simulate(load_config(raw)).report.imbalance["overall"]["lif"] > 1.0


@pytest.mark.parametrize("profile", ["mi250x", "cpu-8rank"])  # the roofline, and measured fixed costs per op
def test_experts_priced_for_many_ranks_at_once_as_one_by_one(profile):
    cfg = load_config(BASE)
    rows = np.random.default_rng(5).integers(0, 700, size=(12, 4))
    rows[3] = 0  # a rank whose experts got nothing
    rows[4, 1] = 0
    num_local = np.full(12, 4)
    for kind in ("forward_expert", "backward_expert", "recompute_expert"):
        one_by_one = TaskCoster(cfg.model, load_profile(profile), cfg.model.seq_len)
        expected = [one_by_one.cost(kind, ("experts:1",), tuple(r.tolist())) for r in rows]
        at_once = TaskCoster(cfg.model, load_profile(profile), cfg.model.seq_len)
        seconds, flops = at_once.experts_cost(kind, "experts:1", rows, num_local)
        assert seconds.tolist() == [s for s, _ in expected]
        assert flops.tolist() == [f for _, f in expected]
        assert seconds[3] < seconds[4] < seconds.max()
