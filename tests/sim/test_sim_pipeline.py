"""Simulated pipeline schedules against closed forms (communication made negligible)."""

from __future__ import annotations

import copy

import pandas as pd
import pytest

from piper_sim.analysis.run_report import Report
from piper_sim.config import load_config
from piper_sim.simulator import simulate as simulate_config


def simulate(raw: dict, **overrides) -> tuple[Report, pd.DataFrame]:
    raw = copy.deepcopy(raw)
    for key, value in overrides.items():
        section, _, sub = key.partition("__")
        if sub:
            raw[section][sub] = value
        else:
            raw[section] = value
    result = simulate_config(load_config(raw))
    return result.report, result.trace


def per_microbatch_times(trace: pd.DataFrame, rank: int) -> tuple[float, float]:
    """Forward and backward time of one microbatch on one rank, from its compute tasks."""
    rows = trace[(trace["rank"] == rank) & (trace["microbatch"] == 0) & (trace["stream"] == "compute")]
    dur = rows["end_s"] - rows["start_s"]
    fwd = dur[rows["kind"].astype(str).str.startswith("forward")].sum()
    bwd = dur[rows["kind"].astype(str).str.startswith("backward")].sum()
    return float(fwd), float(bwd)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("pp,m", [(4, 8), (2, 6), (4, 4)])
def test_step_time_and_bubble_match_closed_form(negligible_comm_config, schedule, pp, m):
    report, trace = simulate(negligible_comm_config, schedule=schedule, parallel__pp=pp, parallel__num_microbatches=m)
    t_f, t_b = per_microbatch_times(trace, rank=trace["rank"].max())
    expected_step = (m + pp - 1) * (t_f + t_b)
    assert report.step_time_s == pytest.approx(expected_step, rel=0.01)
    assert report.bubble_fraction == pytest.approx((pp - 1) / (m + pp - 1), rel=0.01)
    assert report.exposed_comm_fraction < 0.001


def test_interleaving_shrinks_bubble_by_about_vpp(negligible_comm_config):
    base, _ = simulate(negligible_comm_config, parallel__num_microbatches=8)
    inter, _ = simulate(
        negligible_comm_config, schedule="interleaved-1f1b", parallel__vpp=2, parallel__num_microbatches=8
    )
    # bubble time (not fraction) shrinks by vpp: (p-1)/vpp chunks of F+B instead of (p-1)
    base_bubble = base.bubble_fraction * base.step_time_s
    inter_bubble = inter.bubble_fraction * inter.step_time_s
    assert base_bubble / inter_bubble == pytest.approx(2.0, rel=0.1)


def test_zero_bubble_h1_has_smaller_bubble_at_equal_memory(negligible_comm_config):
    one_f_one_b, _ = simulate(negligible_comm_config)
    zb, _ = simulate(negligible_comm_config, schedule="zb-h1")
    assert zb.bubble_fraction < 0.6 * one_f_one_b.bubble_fraction
    assert zb.step_time_s < one_f_one_b.step_time_s
    # ZB-H1 keeps at most pp microbatches of activations on every stage, as 1F1B does on stage 0;
    # its last stage then holds pp microbatches too, whose extra fp32 logits add a fraction of a percent.
    assert max(zb.peak_memory_bytes) == pytest.approx(max(one_f_one_b.peak_memory_bytes), rel=0.01)
    assert zb.peak_memory_bytes[0] == pytest.approx(one_f_one_b.peak_memory_bytes[0], rel=1e-9)


def test_mfu_is_model_flops_over_time_and_peak(negligible_comm_config):
    report, trace = simulate(negligible_comm_config)
    cfg = load_config(negligible_comm_config)
    # independent count: 3 x forward FLOPs per token x tokens per step (6N-style accounting)
    from piper_sim.workload.flops import forward_flops_per_token

    tokens = cfg.parallel.sequences_per_step * cfg.model.seq_len
    assert report.model_flops_per_step == pytest.approx(3 * forward_flops_per_token(cfg.model) * tokens, rel=1e-6)
    assert report.mfu == pytest.approx(report.model_flops_per_step / (report.step_time_s * 8 * 100e12))


def test_same_config_and_seed_give_identical_trace(negligible_comm_config):
    raw = dict(negligible_comm_config, routing={"kind": "zipf", "exponent": 1.2}, topology="uniform")
    _, first = simulate(raw)
    _, second = simulate(raw)
    pd.testing.assert_frame_equal(first, second)
    _, other_seed = simulate(dict(raw, sim={"seed": 1}))
    assert not first["end_s"].equals(other_seed["end_s"])


def test_first_step_peak_memory_is_step_zeros_own_peak():
    """The report's step-0 peak (what a run that counts activations on step 0 measures) is the whole run's
    peak for a one-step run, and never above it when later steps route differently."""

    raw = {
        "model": "tiny-moe",
        "parallel": {"pp": 2, "ep": 4, "num_microbatches": 4},
        "routing": {"kind": "dirichlet"},
        "sim": {"steps": 3},
    }
    report = simulate_config(load_config(raw)).report
    assert all(f <= p for f, p in zip(report.peak_memory_bytes_first_step, report.peak_memory_bytes, strict=True))
    assert report.peak_memory_bytes_first_step != report.peak_memory_bytes  # later steps route differently
    one = simulate_config(load_config({**raw, "sim": {"steps": 1}})).report
    assert one.peak_memory_bytes_first_step == one.peak_memory_bytes
    assert one.peak_memory_bytes_first_step == report.peak_memory_bytes_first_step


def test_a_run_collects_cyclic_garbage_less_often_and_restores_the_collector_after(monkeypatch):
    import gc

    from piper_sim import simulator as simulate_module

    seen = []
    real_build = simulate_module.build_schedule

    def build(cfg):
        seen.append(gc.get_threshold())
        return real_build(cfg)

    monkeypatch.setattr(simulate_module, "build_schedule", build)
    before = gc.get_threshold()
    simulate_config(load_config("tiny-moe"))
    assert seen == [simulate_module.GC_THRESHOLD] and gc.get_threshold() == before

    def fail(cfg):
        raise RuntimeError("stop")

    monkeypatch.setattr(simulate_module, "build_schedule", fail)
    with pytest.raises(RuntimeError):
        simulate_config(load_config("tiny-moe"))
    assert gc.get_threshold() == before


def test_a_run_too_large_for_the_memory_here_stops_before_it_starts(monkeypatch):
    from piper_sim import simulator as simulate_module
    from piper_sim.errors import ConfigError

    cfg = load_config("tiny-moe")
    started = []
    monkeypatch.setattr(simulate_module.Simulation, "run", lambda self: started.append(self))
    monkeypatch.setattr(simulate_module, "available_memory_bytes", lambda: 2**10)  # 1 KiB free
    with pytest.raises(ConfigError) as err:
        simulate_config(cfg)
    assert err.value.key == "parallel.num_microbatches" and err.value.value == cfg.parallel.num_microbatches
    assert "at most about 0 here" in str(err.value) and "GiB available" in str(err.value)
    assert not started
    monkeypatch.undo()
    assert simulate_config(cfg).report.step_time_s > 0  # this machine's own memory: it runs
