"""The estimator's pipeline from per-stage times, where the replay does not price it (planning/estimate.py).

Owns pipeline_s: closed forms for 1F1B, GPipe, interleaved 1F1B and ZB-H1, and for DualPipe / DualPipe-V the coarse
dry run of the generator's own order (schedule/dryrun.py), walked once per schedule shape and replayed with each
plan's times. The estimator takes them for plans whose all-to-alls overlap another micro-batch's pass; every other
plan's pipeline is planning/pipeline_replay.py's, which equals these with equal passes and no hop. Pure: no simpy,
torch.
"""

from __future__ import annotations

import functools

from piper_sim.planning.plan_point import PlanPoint
from piper_sim.schedule.dryrun import CoarseOrder, coarse_order, replay
from piper_sim.schedule.generator_registry import SCHEDULES, schedule_layout
from piper_sim.schedule.ir import VirtualStages
from piper_sim.workload.task_kinds import TaskKind

SPLIT_BACKWARD = frozenset({"zb-h1", "dualpipe", "dualpipe-v"})  # backward = input pass + weight pass
DRY_RUN_PRICED = frozenset({"dualpipe", "dualpipe-v"})  # no closed form in the execution contract's terms


def _chunks_per_microbatch(schedule: str, pp: int, vpp: int) -> int:
    """Chunk tasks of one kind a microbatch runs on each rank (vpp, but one in a bidirectional layout)."""
    return vpp // VirtualStages(schedule_layout(schedule), pp, vpp).num_pipelines


@functools.lru_cache(maxsize=4096)
def _dry_run_bubble_s(schedule: str, pp: int, vpp: int, f: float, b: float, w: float) -> float:
    """Makespan less a rank's work for chunk times f, b, w, from the coarse dry run of the schedule at its
    fewest microbatches (2 pp); the bubble does not grow with more microbatches, whose steady-state rounds
    add only work (tests/schedule/test_dualpipe.py checks it against the full dry run). The dry run's walk is one per
    schedule shape (_bubble_order), replayed with these times."""
    m = 2 * pp
    durations = {TaskKind.FORWARD: f, TaskKind.BACKWARD: b, TaskKind.BACKWARD_INPUT: b, TaskKind.BACKWARD_WEIGHT: w}
    makespan = max(replay(_bubble_order(schedule, pp, vpp), durations)[1], default=0)
    return makespan - m * _chunks_per_microbatch(schedule, pp, vpp) * (f + b + w)


@functools.lru_cache(maxsize=256)
def _bubble_order(schedule: str, pp: int, vpp: int) -> CoarseOrder:
    """The coarse dry run's walk of the schedule at 2 pp microbatches (schedule.dryrun.coarse_order)."""
    return coarse_order(SCHEDULES.get(schedule, "schedule")(pp, vpp, 2 * pp), vpp=vpp, layout=schedule_layout(schedule))


def pipeline_s(point: PlanPoint, per_stage: list[tuple[float, float, float, float]]) -> float:
    """The pipeline of all micro-batches from per-stage (F, B, W, all-to-all) times of one micro-batch."""
    m = point.num_microbatches
    if point.schedule in DRY_RUN_PRICED:
        # The report's bubble (PP/2 - 1)(F&B + B - 3W) (DeepSeek-V3 table 2) assumes overlapped F&B pairs,
        # which the execution contract does not run; the dry run of the generator's order prices it instead,
        # with the slowest rank's times per chunk task.
        chunks = _chunks_per_microbatch(point.schedule, point.pp, point.vpp)
        f, b, w = (max(s[i] for s in per_stage) / chunks for i in range(3))
        return m * chunks * (f + b + w) + _dry_run_bubble_s(point.schedule, point.pp, point.vpp, f, b, w)
    if point.schedule == "zb-h1":
        fb = [f + b for f, b, _, _ in per_stage]
        w = max(s[2] for s in per_stage)
        return sum(fb) + (m - 1) * max(f + b + ww for f, b, ww, _ in per_stage) + w - min(point.pp - 1, m - 1) * w
    work = [f + b for f, b, _, _ in per_stage]
    if point.schedule == "interleaved-1f1b":
        return sum(work) / point.vpp + (m - 1 / point.vpp) * max(work)
    return sum(work) + (m - 1) * max(work)
