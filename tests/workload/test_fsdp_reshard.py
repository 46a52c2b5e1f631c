"""ZeRO-3's reshard_after_forward (FSDP2's fully_shard argument; optimizer.reshard_after_forward): which passes gather,
the memory they keep, the simulator's and the estimator's time, the config's errors and the planner's space
(docs/sharding.md)."""

from __future__ import annotations

import pytest

from piper_sim.config import load_config
from piper_sim.errors import ConfigError
from piper_sim.planning.estimate import estimate_config
from piper_sim.planning.fsdp_estimate import after_backward_shares, gather_shares
from piper_sim.planning.plan_fixes import parse_fixes
from piper_sim.planning.plan_point import PlanPoint
from piper_sim.planning.planner import PlanRequest, screen
from piper_sim.schedule.build import build_coarse_schedule, build_schedule
from piper_sim.schedule.lower_fsdp import gathering_passes
from piper_sim.schedule.validate import check_schedule
from piper_sim.simulator import simulate
from piper_sim.workload.fsdp_state import gathered_window_bytes

MOE = "examples/small-moe.yaml"  # 8 layers, pp 2 x ep 4
Z3 = ["optimizer.zero=3", "parallel.dp=2"]


def _gathers(program, kind_prefix: str) -> int:
    return sum(t.kind == "all_gather" and t.task_id.startswith(kind_prefix) for t in program)


def test_one_f_one_b_without_resharding_gathers_for_the_forwards_that_follow_a_backward():
    cfg = load_config(MOE, [*Z3, "optimizer.reshard_after_forward=false"])
    coarse = build_coarse_schedule(cfg)
    for program in coarse.stage_programs:
        gathering = gathering_passes(program, reshard_after_forward=False)
        order = [t for t in program if t.kind in ("forward", "backward")]
        for before, task in zip([None, *order], order, strict=False):
            # sharded when the step starts and after every backward; a forward leaves the chunk gathered
            assert (task.task_id in gathering) == (before is None or before.kind == "backward")
    assert gathering_passes(coarse.stage_programs[0], reshard_after_forward=True) == frozenset(
        t.task_id for t in coarse.stage_programs[0]
    )


def test_reshard_false_moves_fewer_all_gathers_and_the_same_reduce_scatters():
    lowered = {
        r: build_schedule(load_config(MOE, [*Z3, f"optimizer.reshard_after_forward={r}"])) for r in ("true", "false")
    }
    for keep, shard in zip(lowered["false"].stage_programs, lowered["true"].stage_programs, strict=True):
        assert _gathers(keep, "allgather:B") < _gathers(shard, "allgather:B")
        assert _gathers(keep, "allgather:F") <= _gathers(shard, "allgather:F")  # the last stage: F B F B ...
        assert sum(t.kind == "reduce_scatter" for t in keep) == sum(t.kind == "reduce_scatter" for t in shard)
    assert _gathers(lowered["false"].stage_programs[0], "allgather:F") < _gathers(
        lowered["true"].stage_programs[0], "allgather:F"
    )  # stage 0's second warm-up forward finds it gathered
    check_schedule(lowered["false"])


def test_the_window_without_resharding_is_every_unit_and_two_units_gradients():
    shards = {"dense": 4, "replicated": 1, "expert": 2}
    units = [
        {"dense": 10.0, "replicated": 5.0, "expert": 0.0},
        {"dense": 10.0, "replicated": 5.0, "expert": 100.0},
        {"dense": 30.0, "replicated": 5.0, "expert": 0.0},
    ]
    # gathered: 10, 110, 30 (150 in all); the largest pair 140 of gradients
    assert gathered_window_bytes(units, shards, 2, reshard_after_forward=False) == 2 * (150 + 140)
    assert gathered_window_bytes(units, shards, 2, reshard_after_forward=False) > gathered_window_bytes(
        units, shards, 2
    )


def test_simulated_reshard_false_holds_more_memory_and_is_not_slower():
    runs = {
        r: simulate(load_config(MOE, [*Z3, f"optimizer.reshard_after_forward={r}", "sim.steps=1"]))
        for r in ("true", "false")
    }
    keep, shard = runs["false"].report, runs["true"].report
    assert min(a - b for a, b in zip(keep.peak_memory_bytes, shard.peak_memory_bytes, strict=True)) > 0
    assert keep.step_time_s <= shard.step_time_s * 1.001


def test_the_estimator_prices_fewer_gathers_without_resharding():
    est = {
        r: estimate_config(load_config(MOE, [*Z3, f"optimizer.reshard_after_forward={r}"]))[0]
        for r in ("true", "false")
    }
    assert est["false"].step_time_s <= est["true"].step_time_s
    forwards, backwards = gather_shares("1f1b", 2, 1, 8, 0, 0, False)
    assert 0 < forwards < 1 and 0 < backwards < 1  # stage 0 of 1F1B: its warm-up forwards and drain backwards
    assert gather_shares("1f1b", 1, 1, 8, 0, 0, False) == (1.0, 0.0)  # pp 1: F B F B ...
    assert gather_shares("gpipe", 2, 1, 8, 0, 0, True) == (1.0, 1.0)


def test_the_passes_that_gather_right_after_a_backward():
    """A pass that gathers right after a backward starts its first gather beside that backward's last
    reduce-scatter (the estimator prices the delay: tests/workload/test_zero3.py)."""
    # pp 1: F B F B ...: every forward but the step's first follows a backward; no backward follows one
    assert after_backward_shares("1f1b", 1, 1, 8, 0, 0, True) == (7 / 8, 0.0)
    assert after_backward_shares("1f1b", 1, 1, 8, 0, 0, False) == (7 / 8, 0.0)
    # GPipe: all forwards, then all backwards; each backward reshards, so every backward but the first (which finds
    # them gathered without resharding after the forward) gathers right after one, with resharding or without
    assert after_backward_shares("gpipe", 2, 1, 8, 0, 0, True) == (0.0, 7 / 8)
    assert after_backward_shares("gpipe", 2, 1, 8, 0, 0, False) == (0.0, 7 / 8)
    for stage in (0, 1):  # never more than the passes that gather
        after = after_backward_shares("1f1b", 2, 1, 8, stage, 0, False)
        assert all(a <= g for a, g in zip(after, gather_shares("1f1b", 2, 1, 8, stage, 0, False), strict=True))


def test_default_is_torchtitans_policy():
    assert load_config(MOE, [*Z3, "optimizer.reshard_after_forward=default"]).reshard_after_forward is False  # pp 2
    single = load_config(MOE, [*Z3, "parallel.pp=1", "parallel.ep=8", "optimizer.reshard_after_forward=default"])
    assert single.reshard_after_forward is True
    assert load_config(MOE, Z3).reshard_after_forward is True  # left out: FSDP2's own default


@pytest.mark.parametrize("value,zero", [("sometimes", 3), (1, 3), (False, 2), (True, 0)])
def test_a_bad_reshard_value_names_the_key(value, zero):
    with pytest.raises(ConfigError) as err:
        load_config(MOE, [f"optimizer.zero={zero}", "parallel.dp=2", f"optimizer.reshard_after_forward={value}"])
    assert err.value.key == "optimizer.reshard_after_forward"


def test_the_planner_space_has_both_settings_under_zero3_only():
    request = PlanRequest(
        model="small-moe",
        num_gpus=8,
        global_batch=16,
        topology="uniform",
        fixed=parse_fixes(["optimizer.zero=2,3", "parallel.pp=2", "parallel.ep=2"]),
    )
    _, table, _, _ = screen(request)
    points = [
        PlanPoint(**{k: row[k].item() if hasattr(row[k], "item") else row[k] for k in PlanPoint.__dataclass_fields__})
        for _, row in table.iterrows()
    ]
    assert {p.reshard_after_forward for p in points if p.zero == 3} == {True, False}
    assert all(p.reshard_after_forward for p in points if p.zero != 3)
    keep = next(p for p in points if not p.reshard_after_forward)
    assert keep.config_sections()["optimizer"] == {"zero": 3, "reshard_after_forward": False}
    assert "no-reshard" in keep.label()
    fixed = parse_fixes(["optimizer.reshard_after_forward=false"])
    assert fixed == {"reshard_after_forward": (False,)}
    assert (
        PlanPoint(
            pp=1, ep=1, dp=2, vpp=1, micro_batch_size=1, num_microbatches=1, schedule="1f1b", all_to_all="flat", zero=3
        ).sharding_label()
        == " z3"
    )
