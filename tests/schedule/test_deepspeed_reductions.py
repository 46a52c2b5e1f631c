"""The lowering under `optimizer.gradient_reduce: deepspeed` (schedule/lower_reductions.py): DeepSpeed's ZeRO-1
all-reduces one call per bucket and class, after the whole backward; ZeRO-2's after each micro-batch's backward."""

from __future__ import annotations

from piper_sim.config import load_config
from piper_sim.schedule.build import build_schedule
from piper_sim.workload.deepspeed_zero import reduce_buckets
from piper_sim.workload.memory import rank_params
from piper_sim.workload.task_kinds import BACKWARD_KINDS, Role, TaskKind

K = TaskKind
# 4 layers of X-MoE Small on one Frontier node, EP 4 of 8 GCDs: the dense gradients (171M elements) over the 8
# data-parallel ranks, the experts' (369M) over their 2 replicas; together 540M, two buckets of 5e8
SMALL = {
    "model": {"preset": "x-moe-small", "num_layers": 4},
    "parallel": {"convention": "megatron", "ep": 4, "dp": 8, "num_microbatches": 2, "micro_batch_size": 1},
    "topology": "frontier",
    "collectives": {"all_to_all": "rccl", "all_reduce": "rccl"},
    "cost": {"profile": "mi250x-xmoe"},
}


def program(zero: int, gradient_reduce: str):
    cfg = load_config({**SMALL, "optimizer": {"zero": zero, "gradient_reduce": gradient_reduce}})
    return cfg, build_schedule(cfg).stage_programs[0]


def test_zero1_all_reduces_each_bucket_of_each_class_after_the_last_backward():
    cfg, tasks = program(1, "deepspeed")
    params = rank_params(cfg.model, tuple(range(4)), first=True, last=True, ep=cfg.parallel.ep)
    pieces = reduce_buckets(params)
    assert [len(pieces[k]) for k in ("dense", "expert")] == [1, 2]  # the experts straddle the bucket boundary
    reduces = [t for t in tasks if t.role in (Role.GRAD_DENSE, Role.GRAD_EXPERT)]
    assert [(t.kind, t.role, t.group_axis, t.layer) for t in reduces] == [
        (K.ALL_REDUCE, Role.GRAD_DENSE, "ep_dp", 0),
        (K.ALL_REDUCE, Role.GRAD_EXPERT, "dp", 0),
        (K.ALL_REDUCE, Role.GRAD_EXPERT, "dp", 1),
    ]
    assert not any(t.kind == K.REDUCE_SCATTER for t in tasks)
    # at the accumulation boundary: after every backward task, blocking, one after another, then the step
    last_backward = max(i for i, t in enumerate(tasks) if t.kind in BACKWARD_KINDS)
    first = tasks.index(reduces[0])
    assert first == last_backward + 1 and reduces[0].deps == (tasks[last_backward].task_id,)
    assert all(not t.nonblocking for t in reduces)
    assert [t.deps for t in reduces[1:]] == [(t.task_id,) for t in reduces[:-1]]
    optimizer = next(t for t in tasks if t.kind == K.OPTIMIZER)
    assert optimizer.deps == (reduces[-1].task_id,)
    gathers = [t for t in tasks if t.kind == K.ALL_GATHER]
    assert [t.role for t in gathers] == [Role.PARAM_DENSE, Role.PARAM_EXPERT]  # the updated shards, as before


def test_reduce_scatter_stays_the_default():
    _, tasks = program(1, "reduce-scatter")
    reduces = [t for t in tasks if t.role in (Role.GRAD_DENSE, Role.GRAD_EXPERT)]
    assert [(t.kind, t.layer) for t in reduces] == [(K.REDUCE_SCATTER, -1)] * 2


def test_zero2_all_reduces_each_micro_batchs_gradients_after_its_backward():
    _, tasks = program(2, "deepspeed")
    reduces = [t for t in tasks if t.role in (Role.GRAD_DENSE, Role.GRAD_EXPERT)]
    assert [(t.microbatch, t.role, t.layer) for t in reduces] == [
        (m, role, b) for m in (0, 1) for role, b in ((Role.GRAD_DENSE, 0), (Role.GRAD_EXPERT, 0), (Role.GRAD_EXPERT, 1))
    ]
    at = {t.task_id: i for i, t in enumerate(tasks)}
    for m in (0, 1):  # after the micro-batch's whole backward, before the next micro-batch's first task
        last_backward = max(at[t.task_id] for t in tasks if t.kind in BACKWARD_KINDS and t.microbatch == m)
        mine = [at[t.task_id] for t in reduces if t.microbatch == m]
        assert min(mine) == last_backward + 1
        assert max(mine) < min([at[t.task_id] for t in tasks if t.microbatch == m + 1] or [len(tasks)])
    assert not any(t.kind == K.REDUCE_SCATTER for t in tasks)
