"""Overlapped all-to-alls: a forward and the backward of another micro-batch run as one interleaved pass.

Megatron-core's combined 1F1B (`--overlap-moe-expert-parallel-comm`; Megatron-core docs, "Combined 1F1B:
Expert-Parallel All-to-All Overlap") and DualPipe (DeepSeek-V3 technical report, 3.2.1 and figure 4) hide each MoE
all-to-all of one micro-batch behind the compute of another. Where a rank's program runs a forward right before the
backward of another micro-batch (the steady state of 1F1B and of its interleaved form, DualPipe's pairs), the two
passes are lowered as one: each pass is cut after each of its all-to-alls, which are issued without blocking the
program counter (the communication stream), and the pieces alternate, the backward's first. So each all-to-all is
issued as soon as the compute before it ends and runs beside the other pass's next compute, which is the reference
order (Megatron-core's layer schedule plan, DualPipe's figure 4): the combine's backward beside the attention's
forward, the dispatch beside the experts' backward, the dispatch's backward beside the experts' forward, the
combine beside the attention's backward; a piece that needs an all-to-all's tokens waits for it (its dependency),
and each all-to-all waits for the one issued before it (one communication stream runs them in order).
Compute still runs one task at a time, and tensor-parallel collectives still block.

Owns `pairs` (which adjacent coarse tasks run as one), `interleaved` (the order of a lowered pair) and
`combined_order` (Megatron-core's order without pipelining, where every forward would otherwise precede its own
backward). Pure data: imports no simpy, torch or numpy.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import zip_longest

from piper_sim.schedule.ir import Task
from piper_sim.workload.task_kinds import Role, TaskKind

K = TaskKind
OVERLAPPED_ROLES = (Role.DISPATCH, Role.COMBINE)


def pairs(forward: Task, backward: Task | None) -> bool:
    """A forward directly followed by the backward of another micro-batch (which cannot need its output)."""
    return (
        backward is not None
        and forward.kind == K.FORWARD
        and backward.kind in (K.BACKWARD, K.BACKWARD_INPUT)
        and backward.microbatch != forward.microbatch
    )


def issued(tasks: list[Task]) -> list[Task]:
    """A lowered pass with its MoE all-to-alls issued on the communication stream (nonblocking)."""
    return [replace(t, nonblocking=True) if t.kind == K.ALL_TO_ALL and t.role in OVERLAPPED_ROLES else t for t in tasks]


def _pieces(tasks: list[Task]) -> list[list[Task]]:
    """A pass cut after each of its issued all-to-alls."""
    out: list[list[Task]] = [[]]
    for t in tasks:
        out[-1].append(t)
        if t.kind == K.ALL_TO_ALL and t.nonblocking:
            out.append([])
    return [piece for piece in out if piece]


def _leading_receives(tasks: list[Task]) -> int:
    return next((i for i, t in enumerate(tasks) if t.kind != K.RECV), len(tasks))


def interleaved(forward: list[Task], backward: list[Task]) -> list[Task]:
    """The tasks of a pair (each pass already `issued`): both passes' receives first, then their pieces in turn,
    the backward's first. Every task keeps its own pass's dependencies."""
    f, b = _leading_receives(forward), _leading_receives(backward)
    out = [*forward[:f], *backward[:b]]
    none: list[Task] = []
    for theirs, mine in zip_longest(_pieces(backward[b:]), _pieces(forward[f:]), fillvalue=none):
        out += [*theirs, *mine]
    return _in_stream_order(out)


def _in_stream_order(tasks: list[Task]) -> list[Task]:
    """The pair's all-to-alls run one after another on the communication stream: each waits for the one issued
    before it. (What runs after an all-to-all of one pass waits for the other pass's before it anyway, so the wait
    holds back nothing else.)"""
    out, last = [], ""
    for t in tasks:
        if t.kind == K.ALL_TO_ALL and t.nonblocking:
            if last:
                t = replace(t, deps=(*t.deps, last))
            last = t.task_id
        out.append(t)
    return out


def combined_order(program: tuple[Task, ...]) -> tuple[Task, ...]:
    """A one-stage program of forwards each followed by its own backward (1F1B without pipelining) in Megatron-core's
    combined order: the first forward, then each forward before the backward of the micro-batch before it, then the
    last backward (combined_1f1b_schedule_for_no_pipelining), so that every step but the first and last pairs.
    Other programs come back as they are."""
    forwards = [t for t in program if t.kind == K.FORWARD]
    rest = [t for t in program if t.kind != K.FORWARD]
    own = len(program) == 2 * len(forwards) and all(
        program[2 * i] is f and program[2 * i + 1].kind == K.BACKWARD and program[2 * i + 1].microbatch == f.microbatch
        for i, f in enumerate(forwards)
    )
    if not own or len(forwards) < 2:
        return program
    order = [forwards[0]]
    for f, b in zip(forwards[1:], rest, strict=False):
        order += [f, b]
    return (*order, rest[-1])
