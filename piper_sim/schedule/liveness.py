"""When a (chunk, microbatch)'s activations are alive in a stage program, and the peak they reach.

Owns the one rule both the simulator's memory tracker (sim/stage_plans.py) and the planner's resource model
(planning/resource.py) use: a (chunk, microbatch)'s activations are live from its first forward task to
its last backward task (backward_weight in zero-bubble schedules, whose weight gradients still need the
layer inputs). Works on coarse and lowered programs alike (lowering expands each coarse task in place).
Pure data: imports no simpy, numpy or torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from piper_sim.schedule.ir import Task
from piper_sim.workload.task_kinds import BACKWARD_KINDS, TaskKind


def activation_deltas(
    program: Sequence[Task], act_bytes_by_chunk: Mapping[int, float]
) -> tuple[list[float], list[float]]:
    """Bytes added at the start of each task and released at its end (negative), per program position."""
    at_start, at_end = [0.0] * len(program), [0.0] * len(program)
    first: dict[tuple[int, int], int] = {}
    last: dict[tuple[int, int], int] = {}
    for i, t in enumerate(program):
        key = (t.chunk, t.microbatch)
        if t.kind == TaskKind.FORWARD and key not in first:
            first[key] = i
        if t.kind in BACKWARD_KINDS or t.kind == TaskKind.BACKWARD_WEIGHT:
            last[key] = i
    for key, i in first.items():
        at_start[i] += act_bytes_by_chunk[key[0]]
    for key, i in last.items():
        at_end[i] -= act_bytes_by_chunk[key[0]]
    return at_start, at_end


def peak_live_bytes(program: Sequence[Task], act_bytes_by_chunk: Mapping[int, float]) -> float:
    """The most activation bytes alive at once while the program runs (as the tracker counts it: a task's
    additions are counted before its releases)."""
    at_start, at_end = activation_deltas(program, act_bytes_by_chunk)
    live = peak = 0.0
    for add, release in zip(at_start, at_end, strict=True):
        live += add
        peak = max(peak, live)
        live += release
    return peak
