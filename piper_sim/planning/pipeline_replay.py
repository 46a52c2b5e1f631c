"""The estimator's pipeline: the generator's own order replayed with each pass's time and the contract's p2p.

A pass of a chunk on a stage takes its chunk's forward, backward (ZB-H1: input pass) or weight-pass time, all-to-alls
included (Estimator._chunk_s); under ZeRO-3 a pass that finds its chunk's parameters sharded also gathers them
(without resharding after the forward, only the fill's forwards and the drain's backwards, which lie on the critical
path), its first gather later right after a backward, and a backward that does not gather still reduces
(fsdp_estimate, Estimator._chunk_exposures). A pass that needs another stage's activations or gradients receives them
first: the execution contract's transfer starts when both its send (issued as the producing pass ends) and its recv
(issued as the receiving stage reaches the pass) are issued, and takes the hop's time (docs/execution-contract.md,
rule 4; Estimator._p2p_s), so in a schedule whose stages run in lockstep (interleaved 1F1B) every such hop is
exposed, while a stage that waits for its producer pays it only after the send.

The pipeline is then the coarse dry run of the schedule (schedule/dryrun.py: each stage's program in order, each
pass after the passes it needs) with these times: a walk taken once per schedule shape (ReplayShape) and replayed per
plan by a compiled loop over its steps, each step's time looked up by its category (stage, chunk, kind, whether it
gathers, whether it follows a backward). With equal passes and no hop it is the closed forms of
pipeline_estimate.py. DualPipe's two directions and overlapped pairs keep those forms. Pure: no simpy, torch.
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

REPLAYED = frozenset({"1f1b", "gpipe", "interleaved-1f1b", "zb-h1", "dualpipe", "dualpipe-v"})
KINDS = {TaskKind.FORWARD: 0, TaskKind.BACKWARD: 1, TaskKind.BACKWARD_INPUT: 1, TaskKind.BACKWARD_WEIGHT: 2}
BACKWARDS = frozenset({TaskKind.BACKWARD, TaskKind.BACKWARD_INPUT, TaskKind.BACKWARD_WEIGHT})


@dataclass(frozen=True)
class ReplayShape:
    """One schedule shape's walk as arrays: each step's stage, the earlier steps it waits for (needs[ptr[i]:ptr[i+1]]),
    whether it receives from another stage first (receives: one of them is on another stage), and its category
    (category_of; -1 for a step that takes no time)."""

    stage: np.ndarray
    ptr: np.ndarray
    needs: np.ndarray
    receives: np.ndarray
    category: np.ndarray
    num_stages: int


def category_of(stage: int, chunk: int, vpp: int, kind: int, gathers: bool, after_backward: bool) -> int:
    """A pass's category: ((stage x vpp + chunk) x 3 + kind) x 4 + 2 x gathers + follows a backward (kind: KINDS)."""
    return ((stage * vpp + chunk) * 3 + kind) * 4 + 2 * gathers + after_backward


def num_categories(pp: int, vpp: int) -> int:
    return pp * vpp * 12


@functools.lru_cache(maxsize=512)
def replay_shape(schedule: str, pp: int, vpp: int, microbatches: int, reshard_after_forward: bool) -> ReplayShape:
    """The walk of the schedule's coarse programs (_walk), its passes categorized by the gathers
    schedule/lower_fsdp.py's gathering_passes lowers under ZeRO-3 (ignored otherwise)."""
    programs = coarse_programs(schedule, pp, vpp, microbatches)
    stage, ptr, needs, receives, positions = _walk(schedule, pp, vpp, microbatches)
    categories = []
    for p, program in enumerate(programs):
        gathering = gathering_passes(program, reshard_after_forward=reshard_after_forward)
        row, previous = [], None
        for task in program:
            kind = KINDS.get(task.kind)
            gathers = task.task_id in gathering
            after = previous in BACKWARDS
            row.append(-1 if kind is None else category_of(p, task.chunk, vpp, kind, gathers, after))
            previous = task.kind if kind is not None else previous
        categories.append(row)
    category = np.array([categories[s][position] for s, position in zip(stage.tolist(), positions, strict=True)])
    return ReplayShape(stage, ptr, needs, receives, category.astype(np.int64), pp)


@functools.lru_cache(maxsize=256)
def _walk(schedule: str, pp: int, vpp: int, microbatches: int) -> tuple:
    """The coarse dry run's walk of the schedule (resource.coarse_programs' programs, shared with the resource model
    and fsdp_estimate): each step's stage, needs (CSR), whether it receives from another stage, and its position in
    its stage's program."""
    order = coarse_order(coarse_programs(schedule, pp, vpp, microbatches), vpp=vpp, layout=schedule_layout(schedule))
    stage = [s for s, _, _, _ in order.steps]
    counts = [len(needs) for _, _, _, needs in order.steps]
    return (
        np.array(stage, dtype=np.int64),
        np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
        np.array([i for *_, needs in order.steps for i in needs], dtype=np.int64),
        np.array([any(stage[i] != s for i in needs) for s, _, _, needs in order.steps], dtype=np.bool_),
        [position for _, position, _, _ in order.steps],
    )


def replayed_pipeline_s(
    estimator, point: PlanPoint, shape: Geometry, a2a: float, hop: float, stage_key: tuple, chunks: list
) -> tuple[float, float]:
    """(the pipeline of all micro-batches without its transfers, what its exposed transfers add), from the
    estimator's (planning.estimate.Estimator) per-chunk figures (chunks: each stage's Estimator._stage_chunks) and
    the hop's time; stage_key: what the stages' times depend on (Estimator.estimate's), which keys the categories'
    seconds (plans that differ elsewhere share them)."""
    seconds = estimator._cached(("replay", *stage_key), lambda: _category_seconds(estimator, point, shape, a2a, chunks))
    walk = replay_shape(point.schedule, point.pp, point.vpp, point.num_microbatches, point.reshard_after_forward)
    alone = makespan_s(walk, seconds)
    return alone, makespan_s(walk, seconds, hop) - alone


def _category_seconds(estimator, point: PlanPoint, shape: Geometry, a2a: float, chunks: list) -> np.ndarray:
    """Each category's seconds (category_of): a chunk's pass and half its all-to-alls, and under ZeRO-3 its exposed
    gathers where it gathers (with their delay right after a backward), its reduce-scatters where a backward does
    not."""
    seconds = np.zeros(num_categories(point.pp, point.vpp))
    for p in range(point.pp):
        for chunk, (f, b, w, moving, _, _) in zip(shape.chunks[p], chunks[p], strict=True):
            exposed = (0.0,) * 5
            if point.zero == 3:
                exposed = estimator._chunk_exposures(point, shape.layers, p, chunk.virtual, a2a)
            gather_f, gather_b, reducing, delay_f, delay_b = exposed
            for gathers, after in itertools.product((False, True), repeat=2):
                at = functools.partial(category_of, p, chunk.index, point.vpp, gathers=gathers, after_backward=after)
                seconds[at(0)] = f + moving / 2 + (gather_f + after * delay_f if gathers else 0.0)
                seconds[at(1)] = b + moving / 2 + (gather_b + after * delay_b if gathers else reducing)
                seconds[at(2)] = w
    return seconds


def makespan_s(shape: ReplayShape, category_s: np.ndarray, hop: float = 0.0) -> float:
    """The walk's makespan with each step taking its category's seconds (category_s, num_categories long) and a
    step that receives from another stage starting `hop` after it and its producers are ready."""
    durations = np.where(shape.category >= 0, category_s[np.maximum(shape.category, 0)], 0.0)
    return float(_makespan(shape.stage, shape.ptr, shape.needs, shape.receives, durations, hop, shape.num_stages))


@numba.njit(cache=True)
def _makespan(stage, ptr, needs, receives, durations, hop, num_stages):
    clock = np.zeros(num_stages)
    ends = np.empty(stage.shape[0])
    for i in range(stage.shape[0]):
        start = clock[stage[i]]
        for j in range(ptr[i], ptr[i + 1]):
            if ends[needs[j]] > start:
                start = ends[needs[j]]
        if receives[i]:
            start += hop
        clock[stage[i]] = start + durations[i]
        ends[i] = clock[stage[i]]
    return clock.max()
