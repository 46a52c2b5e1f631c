"""The gradient reductions and the optimizer step in the lowered schedule.

Owns the tasks that end a stage's program (reduction_tasks): DualPipe's mirror all-reduce, each class of
gradients all-reduced (or reduce-scattered under ZeRO 1), the optimizer step, the updated parameters all-gathered
under ZeRO, and the expert migration; and ZeRO-2's reduce-scatters of a chunk's gradients as each micro-batch's
backward finishes them (bucket_reduce_scatters). With `gradient_reduce` deepspeed each ZeRO-1/2 reduce-scatter is
DeepSpeed's all-reduces instead, one per call its reduce buckets make, the call's index among its class's in the
task's `layer` (workload/deepspeed_zero.py: reduce_buckets). ZeRO-3's per-unit collectives are lower_fsdp.py's.
Pure data: imports no simpy, torch or numpy.
"""

from __future__ import annotations

from piper_sim.schedule.ir import Layout, Task
from piper_sim.schedule.lower_context import LoweringContext, reduction_axes
from piper_sim.workload.deepspeed_zero import DEEPSPEED, reduce_buckets
from piper_sim.workload.memory import rank_params
from piper_sim.workload.task_kinds import Role, TaskKind

K = TaskKind


def bucket_reduce_scatters(ctx: LoweringContext, v: int, task: Task, after: str) -> list[Task]:
    """ZeRO-2 (Rajbhandari et al. 2020, section 5.2): each micro-batch's gradients of a chunk (virtual stage v) are
    reduce-scattered as its backward finishes them, into the rank's gradient shard; the full gradients do not
    outlive the chunk's backward. DeepSpeed: its bucket all-reduces of the chunk's gradients, one after another."""
    c, m = task.chunk, task.microbatch
    if ctx.gradient_reduce == DEEPSPEED:
        params = _params(ctx, ctx.stage_layers[v], ctx.stages.is_first(v), ctx.stages.is_last(v))
        return _bucket_all_reduces(ctx, params, f":c{c}:m{m}", after, chunk=c, microbatch=m)
    return [
        _grad_task(f"reducescatter:grad_{kind}:c{c}:m{m}", K.REDUCE_SCATTER, kind, axis, after, chunk=c, microbatch=m)
        for kind, axis in reduction_axes(ctx)
    ]


def _grad_task(
    task_id: str,
    kind: TaskKind,
    cls: str,
    axis: str,
    after: str,
    chunk: int = -1,
    microbatch: int = -1,
    layer: int = -1,
) -> Task:
    """A blocking reduction of the class's gradients over its group axis, after `after`."""
    return Task(
        task_id=task_id,
        kind=kind,
        role=Role(f"grad_{cls}"),
        chunk=chunk,
        microbatch=microbatch,
        layer=layer,
        group_axis=axis,
        deps=(after,),
    )


def _params(ctx: LoweringContext, layers: tuple[int, ...], first: bool, last: bool) -> dict[str, float]:
    """The parameters by class a rank holds for these layers (memory.rank_params), as the simulator's stage plans
    count them."""
    assert ctx.mesh is not None  # lower() gives the mesh
    return rank_params(ctx.model, layers, first=first, last=last, ep=ctx.mesh.ep, split=ctx.split)


def _bucket_all_reduces(
    ctx: LoweringContext, params: dict[str, float], suffix: str, after: str, chunk: int = -1, microbatch: int = -1
) -> list[Task]:
    """DeepSpeed's reduction of these gradients: for each bucket in turn, an all-reduce of each class it holds over
    that class's group (workload/deepspeed_zero.py), each after the one before; `layer` is the call's index among
    the class's."""
    tasks: list[Task] = []
    buckets = reduce_buckets(params)
    for kind, axis in reduction_axes(ctx):
        for call, _ in enumerate(buckets[kind]):
            task_id = f"allreduce:grad_{kind}:b{call}{suffix}"
            previous = tasks[-1].task_id if tasks else after
            tasks.append(_grad_task(task_id, K.ALL_REDUCE, kind, axis, previous, chunk, microbatch, layer=call))
    return tasks


def reduction_tasks(ctx: LoweringContext, program: list[Task], pp_index: int) -> list[Task]:
    last = program[-1].task_id
    tasks: list[Task] = []
    if ctx.layout == Layout.BIDIRECTIONAL:  # DualPipe's two copies of the layers: every gradient summed first
        tasks.append(
            Task(
                task_id="allreduce:grad_mirror",
                kind=K.ALL_REDUCE,
                role=Role.GRAD_MIRROR,
                group_axis="mirror",
                deps=(last,),
            )
        )
        last = tasks[-1].task_id
    axes = reduction_axes(ctx)
    if ctx.zero == 3:  # each unit's gradients were reduce-scattered after its backward: the step waits for them
        tasks.append(
            Task(
                task_id="optimizer",
                kind=K.OPTIMIZER,
                deps=(
                    last,
                    *(
                        t.task_id
                        for t in program
                        if t.kind in (K.REDUCE_SCATTER, K.ALL_REDUCE) and t.nonblocking and t.role != Role.CP
                    ),
                ),
            )
        )
        return tasks  # the parameters stay sharded until the next step gathers them
    if ctx.zero == 1 and ctx.gradient_reduce == DEEPSPEED:  # at the accumulation boundary, after the last backward
        chunks = [ctx.stages.of(pp_index, c) for c in range(ctx.vpp)]
        held = tuple(layer for v in chunks for layer in ctx.stage_layers[v])
        params = _params(ctx, held, any(map(ctx.stages.is_first, chunks)), any(map(ctx.stages.is_last, chunks)))
        tasks.extend(_bucket_all_reduces(ctx, params, "", last))
        last = tasks[-1].task_id if tasks else last
        axes_reduced = []
    else:
        axes_reduced = axes if ctx.zero != 2 else []  # ZeRO-2 reduce-scattered each chunk's as it finished
    for kind, axis in axes_reduced:
        name, collective = ("reducescatter", K.REDUCE_SCATTER) if ctx.zero else ("allreduce", K.ALL_REDUCE)
        tasks.append(_grad_task(f"{name}:grad_{kind}", collective, kind, axis, last))
        last = tasks[-1].task_id
    tasks.append(Task(task_id="optimizer", kind=K.OPTIMIZER, deps=(last,)))
    last = "optimizer"
    for kind, axis in axes if ctx.zero else ():
        tasks.append(
            Task(
                task_id=f"allgather:param_{kind}",
                kind=K.ALL_GATHER,
                role=Role(f"param_{kind}"),
                group_axis=axis,
                deps=(last,),
            )
        )
        last = tasks[-1].task_id
    if ctx.migration:
        tasks.append(Task(task_id="migrate", kind=K.ALL_TO_ALL, role=Role.MIGRATE, group_axis="ep", deps=(last,)))
    return tasks
