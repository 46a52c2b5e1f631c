"""Overlapped all-to-alls (collectives.overlap_all_to_all): a forward and the backward after it lowered as one pass."""

from __future__ import annotations

import pytest

from piper_sim.config import load_config
from piper_sim.errors import ConfigError
from piper_sim.planning.estimate import config_estimator
from piper_sim.planning.overlap_estimate import pair_s, paired_shares
from piper_sim.schedule.build import build_schedule
from piper_sim.schedule.generators import one_f_one_b
from piper_sim.schedule.lower_overlap import combined_order
from piper_sim.schedule.validate import check_schedule, dry_run
from piper_sim.simulator import simulate

BASE = {
    "model": {"preset": "small-moe", "num_layers": 8},
    "parallel": {"pp": 2, "vpp": 2, "ep": 4, "num_microbatches": 8, "micro_batch_size": 2},
    "schedule": "interleaved-1f1b",
}
PLANS = {
    "interleaved": {},
    "pp1": {"schedule": "1f1b", "parallel": {**BASE["parallel"], "pp": 1, "vpp": 1, "ep": 8}},
    "dualpipe-v": {"schedule": "dualpipe-v"},
    "interleaved-selective-zero2": {"recompute": "selective", "optimizer": {"zero": 2}},
}


def config(name: str, overlap: bool):
    raw = {**BASE, **PLANS[name]}
    return load_config({**raw, "collectives": {"all_to_all": "flat", "overlap_all_to_all": overlap}})


@pytest.mark.parametrize("name", sorted(PLANS))
def test_pairs_keep_every_task_and_dependency(name):
    plain, paired = build_schedule(config(name, False)), build_schedule(config(name, True))
    check_schedule(paired)
    assert dry_run(paired) > 0
    for before, after in zip(plain.stage_programs, paired.stage_programs, strict=True):
        by_id = {t.task_id: t for t in before}
        assert sorted(by_id) == sorted(t.task_id for t in after)
        position = {t.task_id: i for i, t in enumerate(after)}
        for task in after:
            was = by_id[task.task_id]
            overlapped = task.kind == "all_to_all" and task.nonblocking
            assert overlapped or task.nonblocking == was.nonblocking
            extra = [d for d in task.deps if d not in was.deps]
            if name == "pp1":  # the combined order moves whole passes
                continue
            assert task.deps[: len(was.deps)] == was.deps and len(extra) <= int(overlapped)
            for d in extra:  # stream order: the all-to-all issued before it
                before = after[position[d]]
                assert before.kind == "all_to_all" and before.nonblocking and position[d] < position[task.task_id]
                between = after[position[d] + 1 : position[task.task_id]]
                assert not any(t.kind == "all_to_all" and t.nonblocking for t in between)
        # each pair: its backward's pieces first, each all-to-all issued right after the compute it follows
        issued = [i for i, t in enumerate(after) if t.kind == "all_to_all" and t.nonblocking]
        assert issued, "no pair on this stage"
        for i in issued:
            assert after[i - 1].is_compute or after[i - 1].role == "tp"
    # the pairs hide all-to-alls: a shorter step and less exposed communication
    slow, fast = simulate(config(name, False)).report, simulate(config(name, True)).report
    assert fast.step_time_s < slow.step_time_s
    assert fast.exposed_comm_fraction < slow.exposed_comm_fraction


def test_interleaved_pair_order():
    """The reference order: the backward's piece up to its first all-to-all, then the forward's, in turn."""
    program = build_schedule(config("interleaved", True)).stage_programs[0]
    first = next(i for i, t in enumerate(program) if t.kind == "all_to_all" and t.nonblocking)
    pair = [t for t in program[first - 1 :] if t.kind != "recv"][:8]
    passes = [t.task_id[0] for t in pair]
    assert passes == ["B", "B", "F", "F", "B", "B", "F", "F"]
    assert [t.kind for t in pair[1::2]] == ["all_to_all"] * 4
    assert pair[0].microbatch != pair[2].microbatch


def test_combined_order_without_pipelining():
    """Megatron-core's combined 1F1B without pipelining: F0, (F1, B0), ..., (F7, B6), B7."""
    (program,) = one_f_one_b(1, 1, 8)
    order = combined_order(program)
    assert [(t.kind.value[0], t.microbatch) for t in order] == [
        ("f", 0),
        *((k, m) for i in range(1, 8) for k, m in (("f", i), ("b", i - 1))),
        ("b", 7),
    ]
    assert paired_shares("1f1b", 1, 1, 8) == (7 / 8,)
    (staged, _) = one_f_one_b(2, 1, 8)
    assert combined_order(staged) is staged  # a pipelined program is left as it is


def test_pair_seconds():
    """A pair of one MoE layer each: pieces (attention, experts, rest) and an all-to-all of 2 s."""
    forward, backward = [3.0, 4.0, 1.0], [2.0, 8.0, 6.0]  # the backward as it runs: rest, experts, attention
    # B 2 | a2a 2-4 | F 3 (2-5) | a2a 5-7 | B 8 (5-13, waits 4) | a2a 13-15 | F 4 (13-17, waits 7) | a2a 17-19
    # B 6 (waits 15: 17-23) | F 1 (waits 19: 23-24)
    assert pair_s(forward, backward, 2.0) == 24.0
    assert pair_s(forward, backward, 0.0) == sum(forward) + sum(backward)
    # all-to-alls too long to hide: each pass waits for its own, one after another on the stream
    assert pair_s([1.0, 1.0], [1.0, 1.0], 10.0) == 1 + 10 + 10 + 1
    # the all-to-alls' kernels hold half the units: a piece beside one runs at half rate until it ends
    # B 2 | a2a 2-4 | F 3 from 2: 1 s done by 4, then 2 s: 6 | a2a 6-8 | B 8 from 6: 1 done by 8, 15 | a2a 15-17
    # F 4 from 15: 1 done by 17, 20 | a2a 20-22 | B 6 from 20: 1 done by 22, 27 | F 1 from 27 (idle stream): 28
    assert pair_s(forward, backward, 2.0, share=0.5) == 28.0


@pytest.mark.parametrize("name", ["pp1", "interleaved"])
def test_estimate_prices_the_pairs(name):
    """Without pipelining the estimate is the simulator's step within 1e-5 (its gradient all-reduce's closed form); with
    pipelining, within 2%."""
    for overlap in (False, True):
        cfg = config(name, overlap)
        estimator, point = config_estimator(cfg)
        estimate = estimator.estimate(point).step_time_s
        step = simulate(cfg).report.step_time_s
        assert estimate == pytest.approx(step, rel=1e-5 if name == "pp1" else 0.02)


def test_estimate_prices_the_units_the_all_to_alls_hold():
    """On DGX H100 (NCCL's kernels hold 16 of 132 SMs) the estimate's pairs slow as the simulator's compute does."""
    for overlap in (False, True):
        cfg = load_config(
            {
                **BASE,
                "schedule": "1f1b",
                "parallel": {**BASE["parallel"], "pp": 1, "vpp": 1, "ep": 8},
                "topology": "dgx-h100-superpod",
                "cost": {"profile": "h100"},
                "collectives": {"all_to_all": "nccl", "all_reduce": "nccl", "overlap_all_to_all": overlap},
            }
        )
        estimator, point = config_estimator(cfg)
        assert estimator.estimate(point).step_time_s == pytest.approx(simulate(cfg).report.step_time_s, rel=1e-5)


@pytest.mark.parametrize(
    "changes,allowed",
    [
        ({"schedule": "1f1b"}, "interleaved-1f1b and vpp > 1"),
        ({"schedule": "zb-h1", "parallel": {**BASE["parallel"], "vpp": 1}}, "interleaved-1f1b and vpp > 1"),
        ({"optimizer": {"zero": 3}}, "optimizer.zero 3"),
        ({"collectives": {"overlap_all_to_all": "yes"}}, "true or false"),
    ],
)
def test_plans_that_cannot_pair_are_refused(changes, allowed):
    raw = {**BASE, "collectives": {"all_to_all": "flat", "overlap_all_to_all": True}, **changes}
    if raw["schedule"] == "1f1b":
        raw["parallel"] = {**BASE["parallel"], "vpp": 1}
    with pytest.raises(ConfigError) as err:
        load_config(raw)
    assert err.value.key == "collectives.overlap_all_to_all" and allowed in str(err.value)
