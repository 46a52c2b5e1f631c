"""The estimator's pipeline where its passes differ: the generator's own order replayed with each pass's time.

The closed forms (pipeline_estimate.py) take every micro-batch's pass of a chunk to cost the same. Under ZeRO-3 they
do not: a pass that finds its chunk's parameters sharded gathers them first (without resharding after the forward,
only the fill's forwards and the drain's backwards, which lie on the pipeline's critical path), and its first gather
waits longer right after a backward (fsdp_estimate). So such a plan's pipeline is the coarse dry run of its
schedule (schedule/dryrun.py: each stage's program in order, each pass after the passes it needs) with each pass's
own time (replayed_pipeline_s): the makespan of a walk taken once per schedule shape (ReplayShape) and replayed per
plan by a compiled loop over its steps. Each step's time is looked up by its category (stage, chunk, forward or
backward, whether it gathers, whether it follows a backward). Pure: no simpy, torch.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

import numba
import numpy as np

from piper_sim.planning.geometry import Geometry
from piper_sim.planning.plan_point import PlanPoint
from piper_sim.planning.resource import coarse_programs
from piper_sim.schedule.dryrun import coarse_order
from piper_sim.schedule.generator_registry import schedule_layout
from piper_sim.schedule.lower_fsdp import gathering_passes
from piper_sim.workload.task_kinds import TaskKind

PASSES = (TaskKind.FORWARD, TaskKind.BACKWARD)


@dataclass(frozen=True)
class ReplayShape:
    """One schedule shape's walk as arrays: each step's stage, the earlier steps it waits for (needs[ptr[i]:ptr[i+1]])
    and its category: ((stage x vpp + chunk) x 2 + backward) x 4 + 2 x gathers + follows a backward
    (category_of); a step that is not a forward or backward pass has category -1 and takes no time."""

    stage: np.ndarray
    ptr: np.ndarray
    needs: np.ndarray
    category: np.ndarray
    num_stages: int


def category_of(stage: int, chunk: int, vpp: int, backward: bool, gathers: bool, after_backward: bool) -> int:
    return ((stage * vpp + chunk) * 2 + backward) * 4 + 2 * gathers + after_backward


def num_categories(pp: int, vpp: int) -> int:
    return pp * vpp * 8


@functools.lru_cache(maxsize=512)
def replay_shape(schedule: str, pp: int, vpp: int, microbatches: int, reshard_after_forward: bool) -> ReplayShape:
    """The walk of the schedule's coarse programs (resource.coarse_programs, shared with the resource model and
    fsdp_estimate), its passes categorized by the gathers schedule/lower_fsdp.py's gathering_passes lowers."""
    programs = coarse_programs(schedule, pp, vpp, microbatches)
    order = coarse_order(programs, vpp=vpp, layout=schedule_layout(schedule))
    categories = []
    for stage, program in enumerate(programs):
        gathering = gathering_passes(program, reshard_after_forward=reshard_after_forward)
        row, previous = [], None
        for task in program:
            if task.kind not in PASSES:
                row.append(-1)
                continue
            gathers = task.task_id in gathering
            row.append(
                category_of(
                    stage, task.chunk, vpp, task.kind == TaskKind.BACKWARD, gathers, previous == TaskKind.BACKWARD
                )
            )
            previous = task.kind
        categories.append(row)
    counts = [len(needs) for _, _, _, needs in order.steps]
    return ReplayShape(
        stage=np.array([s for s, _, _, _ in order.steps], dtype=np.int64),
        ptr=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
        needs=np.array([i for *_, needs in order.steps for i in needs], dtype=np.int64),
        category=np.array([categories[s][position] for s, position, _, _ in order.steps], dtype=np.int64),
        num_stages=pp,
    )


def replayed_pipeline_s(estimator, point: PlanPoint, shape: Geometry, a2a: float) -> float:
    """ZeRO-3 with pipelining: the pipeline of all micro-batches with each pass's own time, from the estimator's
    (planning.estimate.Estimator) per-chunk figures: a chunk's pass and its all-to-alls, and for a pass that gathers
    its exposed gathers (and their delay right after a backward), for a backward that does not its reduce-scatters
    (Estimator._chunk_exposures)."""
    coster = estimator.coster(point.parallel.tokens_per_microbatch(estimator.model.seq_len), point.parallel.split)
    seconds = np.zeros(num_categories(point.pp, point.vpp))
    for p in range(point.pp):
        for chunk in shape.chunks[p]:
            cf, cb, _, _, moe, rs, redo_moe = estimator._chunk_parts(coster, point, chunk, False)
            moving = (4 * moe + 2 * redo_moe) * a2a / 2  # half in each pass, as Estimator._stage_s
            gather_f, gather_b, reducing, delay_f, delay_b = estimator._chunk_exposures(
                point, shape.layers, p, chunk.virtual, a2a
            )
            for gathers, after in itertools.product((False, True), repeat=2):
                at = functools.partial(category_of, p, chunk.index, point.vpp, gathers=gathers, after_backward=after)
                seconds[at(False)] = cf + moving + (gather_f + after * delay_f if gathers else 0.0)
                seconds[at(True)] = cb + rs + moving + (gather_b + after * delay_b if gathers else reducing)
    shape_key = (point.schedule, point.pp, point.vpp, point.num_microbatches, point.reshard_after_forward)
    return makespan_s(replay_shape(*shape_key), seconds)


def makespan_s(shape: ReplayShape, category_s: np.ndarray) -> float:
    """The walk's makespan with each step taking its category's seconds (category_s, num_categories long)."""
    durations = np.where(shape.category >= 0, category_s[np.maximum(shape.category, 0)], 0.0)
    return float(_makespan(shape.stage, shape.ptr, shape.needs, durations, shape.num_stages))


@numba.njit(cache=True)
def _makespan(stage, ptr, needs, durations, num_stages):
    clock = np.zeros(num_stages)
    ends = np.empty(stage.shape[0])
    for i in range(stage.shape[0]):
        start = clock[stage[i]]
        for j in range(ptr[i], ptr[i + 1]):
            if ends[needs[j]] > start:
                start = ends[needs[j]]
        clock[stage[i]] = start + durations[i]
        ends[i] = clock[stage[i]]
    return clock.max()
