"""ZeRO-3 / FSDP in the lowered schedule: each unit's parameters all-gathered before it runs, prefetched one unit
ahead, and its gradients reduce-scattered after its backward (docs/sharding.md).

Owns a unit's gathers and reduce-scatters, one per class of parameters it holds (unit_collectives), and their
placement among a pass's compute tasks. The lowering (lower.py) expands a chunk's forward (or its recomputation and
backward) unit by unit (units: workload/fsdp.py) and hands the runs here. As FSDP2 does by default
(torch.distributed.fsdp.fully_shard: implicit forward prefetch, backward prefetch of one module), the gather of the
next unit is issued when the current unit starts, after the current unit's own gather (one gather stream), so it
moves while the current unit computes; the pass's first gather is issued when the pass's input has arrived. All of
them are nonblocking collectives (ir.Task.nonblocking): the program counter moves on, and a unit's first compute
task waits for its gathers. Which passes gather at all follows FSDP2's resharding (gathering_passes): with
reshard_after_forward false a chunk's units stay gathered from a forward until the next backward of that chunk has
run. Pure data.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from piper_sim.schedule.ir import Task
from piper_sim.schedule.lower_context import LoweringContext, reduction_axes
from piper_sim.workload.fsdp import unit_classes, unit_of_op
from piper_sim.workload.task_kinds import Role, TaskKind

K = TaskKind

# (unit, deps) -> the unit's collectives of one kind, one per class of parameters it gathers or reduces
CLASS_AXES = {"dense": "ep_dp", "expert": "dp", "replicated": "stage"}  # the group a class's replicas form (mesh.py)
Collectives = Callable[[int, tuple[str, ...]], list[Task]]


def gathering_passes(program: tuple[Task, ...], *, reshard_after_forward: bool) -> frozenset[str]:
    """The coarse forward and backward tasks of a stage's program whose units are all-gathered first: those that
    find their chunk's parameters sharded, as FSDP2 tracks them per module (torch.distributed.fsdp.fully_shard): a
    forward leaves them gathered unless reshard_after_forward, a backward reshards them (reshard_after_backward,
    FSDP2's default), and a step starts sharded (the previous step's last backward resharded them)."""
    gathered: set[int] = set()
    out: set[str] = set()
    for task in program:
        if task.kind not in (TaskKind.FORWARD, TaskKind.BACKWARD):
            continue
        if task.chunk not in gathered:
            out.add(task.task_id)
        if task.kind == TaskKind.FORWARD and not reshard_after_forward:
            gathered.add(task.chunk)
        else:
            gathered.discard(task.chunk)
    return frozenset(out)


def shard_axes(mesh, cls: str) -> tuple[str, str]:
    """(the axis a unit's parameters of class cls are gathered and its gradients reduce-scattered over, "" when a
    shard is one rank; the axis its reduced shard is then all-reduced over, "" without HSDP). Under HSDP
    (mesh.replicate > 1) FSDP2 reduce-scatters within the shard group and all-reduces the shard across the replicas
    (torch.distributed.fsdp.fully_shard with a 2-D mesh)."""
    axis = CLASS_AXES[cls]
    if mesh is None or mesh.replicate == 1:
        return axis, ""
    replicas = {"ep_dp": mesh.data_parallel, "dp": mesh.dp, "stage": mesh.stage_size}[axis]
    return (f"{axis}_shard" if replicas // mesh.replicate > 1 else ""), "replicate"


def unit_runs(segments: list, layers: tuple[int, ...], *, backward: bool = False) -> list[tuple[int, list]]:
    """A pass's segments (lower_segments.Segment) as runs of one unit each, in order: a compute segment whose ops span
    several units is split between them (backward: its pieces in reverse, as a backward task runs its ops); a
    collective goes with its layer, or (the embedding's and the head's tensor-parallel collectives, layer -1) with
    the unit before it (the first unit when none is)."""
    pieces: list[tuple[int | None, object]] = []
    current: int | None = None
    for seg in segments:
        if not seg.ops:
            pieces.append((seg.layer if seg.layer >= 0 else current, seg))
            continue
        split: list[tuple[int | None, object]] = []
        start = 0
        for k in range(1, len(seg.ops) + 1):
            unit = unit_of_op(seg.ops[start], layers)
            if k == len(seg.ops) or unit_of_op(seg.ops[k], layers) != unit:
                split.append((unit, replace(seg, ops=seg.ops[start:k])))
                start = k
        pieces += split[::-1] if backward else split
        current = pieces[-1][0]
    known = next((u for u, _ in pieces if u is not None), None)
    runs: list[tuple[int, list]] = []
    for piece_unit, seg in pieces:
        owner = known if piece_unit is None else piece_unit
        assert owner is not None  # a collective comes with compute ops, whose units are ints (unit_of_op)
        if runs and runs[-1][0] == owner:
            runs[-1][1].append(seg)
        else:
            runs.append((owner, [seg]))
    return runs


def with_gathers(
    runs: list[tuple[int, list[Task]]], gathers: Collectives, reduces: Collectives | None = None
) -> list[Task]:
    """A pass's tasks, unit by unit, with each unit's gathers issued one unit ahead (the first unit's when the
    pass's input is there: its first task's deps) and each unit's first compute task waiting for them; reduces:
    (the backward) each unit's gradient reduce-scatters after its last task."""
    order = list(dict.fromkeys(unit for unit, _ in runs))
    if not order:
        return []
    issued = {order[0]: gathers(order[0], runs[0][1][0].deps)}
    out: list[Task] = list(issued[order[0]])
    for unit, tasks in runs:
        j = order.index(unit)
        own = tuple(t.task_id for t in issued[unit])
        if j + 1 < len(order) and order[j + 1] not in issued:  # prefetch: on the gather stream after this one's
            issued[order[j + 1]] = gathers(order[j + 1], own)
            out.extend(issued[order[j + 1]])
        waits = next((i for i, t in enumerate(tasks) if t.is_compute), None)
        for i, t in enumerate(tasks):
            out.append(replace(t, deps=(*t.deps, *own)) if i == waits and own else t)
        if reduces is not None:
            out.extend(reduces(unit, (tasks[-1].task_id,)))
    return out


def unit_collectives(ctx: LoweringContext, v: int, task: Task, pass_: str, reduce: bool = False):
    """ZeRO-3: the collectives of one unit of a chunk (Collectives), one per class of parameters it
    holds: its parameters' all-gathers, or (reduce) its gradients' reduce-scatters."""
    c, m, layers = task.chunk, task.microbatch, ctx.stage_layers[v]
    what, kind = ("grad", K.REDUCE_SCATTER) if reduce else ("param", K.ALL_GATHER)
    name = "reducescatter" if reduce else f"allgather:{pass_}"
    if not reduce and ctx.gathering is not None and task.task_id not in ctx.gathering:
        return lambda unit, deps: []  # the chunk's units are still gathered (reshard_after_forward false)

    def collectives(unit: int, deps: tuple[str, ...]) -> list[Task]:
        held = unit_classes(
            ctx.model, unit, last=ctx.stages.is_last(v) and unit == (layers[-1:] or (unit,))[0], tp=ctx.split.tp
        )
        tasks: list[Task] = []
        for cls, _ in reduction_axes(ctx):
            shard, across = shard_axes(ctx.mesh, cls)
            if cls not in held:
                continue
            if shard:
                tasks.append(
                    Task(
                        task_id=f"{name}:{what}_{cls}:c{c}:m{m}:u{unit}",
                        kind=kind,
                        role=Role(f"{what}_{cls}"),
                        chunk=c,
                        microbatch=m,
                        layer=unit,
                        group_axis=shard,
                        deps=deps,
                        nonblocking=True,
                    )
                )
            if reduce and across:  # HSDP: the reduced shard summed over its replicas
                tasks.append(
                    Task(
                        task_id=f"allreduce:grad_{cls}:c{c}:m{m}:u{unit}",
                        kind=K.ALL_REDUCE,
                        role=Role(f"grad_{cls}"),
                        chunk=c,
                        microbatch=m,
                        layer=unit,
                        group_axis=across,
                        deps=(tasks[-1].task_id,) if shard else deps,
                        nonblocking=True,
                    )
                )
        return tasks

    return collectives
