"""The estimator's pipeline: the generator's own order replayed with each pass's time and the contract's p2p.

A pass of a chunk on a stage takes its chunk's forward, backward (ZB-H1: input pass) or weight-pass time, all-to-alls
included (Estimator._stage_chunks); under ZeRO-3 a pass that finds its chunk's parameters sharded also gathers them
(without resharding after the forward, only the fill's forwards and the drain's backwards, which lie on the critical
path), its first gather later right after a backward, and a backward that does not gather still reduces
(fsdp_estimate, Estimator._chunk_exposures). A pass that needs another stage's activations or gradients receives them
first: the execution contract's transfer starts when both its send (issued as the producing pass ends) and its recv
(issued as the receiving stage reaches the pass) are issued, and takes the hop's time (docs/execution-contract.md,
rule 4; Estimator._p2p_s), so in a schedule whose stages run in lockstep (interleaved 1F1B) every such hop is
exposed, while a stage that waits for its producer pays it only after the send.

The pipeline is then the coarse dry run of the schedule (schedule/dryrun.py's coarse_order: each stage's program in
order, each pass after the passes it needs) with these times: a walk taken once per schedule shape, compiled
(ReplayShape), and replayed per plan by a compiled loop over its steps, each step's time looked up by its category
(stage, chunk, kind, whether it gathers, whether it follows a backward). With equal passes and no hop it is the
closed forms of pipeline_estimate.py, which plans whose all-to-alls overlap another micro-batch's pass keep. Pure:
no simpy, torch.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numba
import numpy as np

from piper_sim.planning.geometry import Geometry
from piper_sim.planning.plan_point import PlanPoint
from piper_sim.planning.resource import coarse_programs
from piper_sim.schedule.generator_registry import schedule_layout
from piper_sim.schedule.ir import VirtualStages
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


def category_of(stage, chunk, vpp: int, kind, gathers, after_backward):
    """A pass's category: ((stage x vpp + chunk) x 3 + kind) x 4 + 2 x gathers + follows a backward (kind: KINDS);
    of one pass, or element-wise of arrays of them."""
    return ((stage * vpp + chunk) * 3 + kind) * 4 + 2 * gathers + after_backward


def num_categories(pp: int, vpp: int) -> int:
    return pp * vpp * 12


@functools.lru_cache(maxsize=512)
def replay_shape(schedule: str, pp: int, vpp: int, microbatches: int, reshard_after_forward: bool) -> ReplayShape:
    """The walk of the schedule's coarse programs (_walk), its passes categorized (pass_categories)."""
    category = pass_categories(schedule, pp, vpp, microbatches, reshard_after_forward)
    order, ptr, needs, receives = _walk(schedule, pp, vpp, microbatches)
    return ReplayShape(_tasks(schedule, pp, vpp, microbatches).stage[order], ptr, needs, receives, category[order], pp)


@functools.lru_cache(maxsize=512)
def pass_categories(schedule: str, pp: int, vpp: int, microbatches: int, reshard_after_forward: bool) -> np.ndarray:
    """Each task's category (category_of; -1 for a task that is not a pass), stage after stage in program order, its
    gathers those schedule/lower_fsdp.py's gathering_passes lowers under ZeRO-3 (fsdp_estimate counts them)."""
    tasks = _tasks(schedule, pp, vpp, microbatches)
    gathering = [gathering_passes(program, reshard_after_forward=reshard_after_forward) for program in tasks.programs]
    gathers = np.array([task.task_id in gathering[p] for p, program in enumerate(tasks.programs) for task in program])
    return np.where(tasks.kind >= 0, category_of(tasks.stage, tasks.chunk, vpp, tasks.kind, gathers, tasks.after), -1)


@dataclass(frozen=True)
class _Tasks:
    """A schedule's coarse programs' tasks, stage after stage in program order: each one's stage, chunk, kind
    (KINDS; -1 for a task that is not a pass), whether it follows a backward pass of its stage, the key it
    completes and the keys it waits for (its dependency on its own stage, its input from the neighbouring virtual
    stage; -1 for none), keys being (class, stage, chunk, micro-batch) as integers."""

    programs: tuple
    stage: np.ndarray
    chunk: np.ndarray
    kind: np.ndarray
    after: np.ndarray
    own: np.ndarray
    same: np.ndarray
    cross: np.ndarray


@functools.lru_cache(maxsize=256)
def _tasks(schedule: str, pp: int, vpp: int, microbatches: int) -> _Tasks:
    """The coarse programs (resource.coarse_programs, shared with the resource model and fsdp_estimate) as _Tasks:
    a forward needs the forward of the virtual stage before it, a backward (input pass) the backward of the one
    after it (the coarse dry run's implicit transfers, schedule/dryrun.py), each task its program's deps."""
    programs = coarse_programs(schedule, pp, vpp, microbatches)
    stages = VirtualStages(schedule_layout(schedule), pp, vpp)

    def key(kind: int, stage: int, chunk: int) -> int:  # a key less its micro-batch: key(...) * microbatches + m
        return ((kind * pp + stage) * vpp + chunk) * microbatches

    neighbour: dict[tuple[int, int, int], int] = {}  # (stage, chunk, kind) -> the needed pass's key, -1 for none
    columns: list[tuple[int, ...]] = []
    for p, program in enumerate(programs):
        by_id = {task.task_id: task for task in program}
        previous = None
        for task in program:
            kind, chunk, m = KINDS.get(task.kind, -1), task.chunk, task.microbatch
            if (p, chunk, kind) not in neighbour:
                virtual = stages.of(p, chunk)
                other = stages.previous(virtual) if kind == 0 else stages.next(virtual) if kind == 1 else None
                neighbour[p, chunk, kind] = -1 if other is None else key(kind, *stages.where(other))
            if len(task.deps) > 1:
                raise ValueError(f"{schedule}: task {task.task_id} has {len(task.deps)} deps; the replay takes one")
            dep = by_id[task.deps[0]] if task.deps else None
            same = -1 if dep is None else key(KINDS[dep.kind], p, dep.chunk) + dep.microbatch
            cross = neighbour[p, chunk, kind]
            own = -1 if kind < 0 else key(kind, p, chunk) + m
            columns.append((p, chunk, kind, previous in BACKWARDS, own, same, -1 if cross < 0 else cross + m))
            previous = task.kind if kind >= 0 else previous
    stage, chunk, kind, after, own, same, cross = (np.array(c, dtype=np.int64) for c in zip(*columns, strict=True))
    return _Tasks(programs, stage, chunk, kind, after, own, same, cross)


@functools.lru_cache(maxsize=256)
def _walk(schedule: str, pp: int, vpp: int, microbatches: int) -> tuple[np.ndarray, ...]:
    """The stages' programs walked with one blocking program counter per stage (schedule/dryrun.py's coarse_order,
    compiled): (the tasks in walk order, its steps' needs as CSR over step indices, whether each step receives from
    another stage)."""
    t = _tasks(schedule, pp, vpp, microbatches)
    starts = np.concatenate([[0], np.cumsum(np.bincount(t.stage, minlength=pp))]).astype(np.int64)
    order, need_same, need_cross = _walk_order(starts, t.own, t.same, t.cross, 3 * pp * vpp * microbatches)
    if order.shape[0] < t.stage.shape[0]:
        raise ValueError(f"{schedule} pp {pp} vpp {vpp} x{microbatches}: its programs deadlock")
    both = np.stack([need_same, need_cross], axis=1)
    counts = (both >= 0).sum(axis=1)
    stage = t.stage[order]
    receives = (need_cross >= 0) & (stage[np.maximum(need_cross, 0)] != stage)
    return order, np.concatenate([[0], np.cumsum(counts)]).astype(np.int64), both[both >= 0], receives


@numba.njit(cache=True)
def _walk_order(starts, own, same, cross, num_keys):
    num_stages = starts.shape[0] - 1
    done = np.full(num_keys, -1, dtype=np.int64)  # key -> the step that completed it
    blocked = np.full(num_stages, -1, dtype=np.int64)  # stage -> the key it waits for
    pc = starts[:-1].copy()
    order = np.empty(own.shape[0], dtype=np.int64)
    need_same = np.full(own.shape[0], -1, dtype=np.int64)
    need_cross = np.full(own.shape[0], -1, dtype=np.int64)
    ready = list(range(num_stages))
    steps = 0
    while len(ready) > 0:
        stage = ready.pop(0)
        while pc[stage] < starts[stage + 1]:
            i = pc[stage]
            if same[i] >= 0 and done[same[i]] < 0:
                blocked[stage] = same[i]
                break
            if cross[i] >= 0 and done[cross[i]] < 0:
                blocked[stage] = cross[i]
                break
            order[steps] = i
            need_same[steps] = done[same[i]] if same[i] >= 0 else -1
            need_cross[steps] = done[cross[i]] if cross[i] >= 0 else -1
            pc[stage] += 1
            if own[i] >= 0 and done[own[i]] < 0:
                done[own[i]] = steps
                for other in range(num_stages):
                    if blocked[other] == own[i]:
                        blocked[other] = -1
                        ready.append(other)
            steps += 1
    return order[:steps], need_same[:steps], need_cross[:steps]


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
    table = seconds.reshape(point.pp, point.vpp, 3, 4)  # [stage, chunk, kind, 2 x gathers + follows a backward]
    for p in range(point.pp):
        for chunk, (f, b, w, moving, _, _) in zip(shape.chunks[p], chunks[p], strict=True):
            row = table[p, chunk.index]
            row[0], row[1], row[2] = f + moving / 2, b + moving / 2, w
            if point.zero == 3:
                gather_f, gather_b, reducing, delay_f, delay_b = estimator._chunk_exposures(
                    point, shape.layers, p, chunk.virtual, a2a
                )
                row[0, 2:] += (gather_f, gather_f + delay_f)
                row[1, 2:] += (gather_b, gather_b + delay_b)
                row[1, :2] += reducing
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
