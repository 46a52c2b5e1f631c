"""The gradient reductions and the optimizer step in the lowered schedule.

Owns the tasks that end a stage's program (reduction_tasks): DualPipe's mirror all-reduce, each class of
gradients all-reduced (or reduce-scattered under ZeRO 1), the optimizer step, the updated parameters all-gathered
under ZeRO, and the expert migration; and ZeRO-2's reduce-scatters of a chunk's gradients as each micro-batch's
backward finishes them (bucket_reduce_scatters). ZeRO-3's per-unit collectives are lower_fsdp.py's. Pure data:
imports no simpy, torch or numpy.
"""

from __future__ import annotations

from piper_sim.schedule.ir import Layout, Task
from piper_sim.schedule.lower_context import LoweringContext, reduction_axes
from piper_sim.workload.task_kinds import Role, TaskKind

K = TaskKind


def bucket_reduce_scatters(ctx: LoweringContext, task: Task, after: str) -> list[Task]:
    """ZeRO-2 (Rajbhandari et al. 2020, section 5.2): each micro-batch's gradients of a chunk are reduce-scattered
    as its backward finishes them, into the rank's gradient shard; the full gradients do not outlive the chunk's
    backward."""
    c, m = task.chunk, task.microbatch
    tasks: list[Task] = []
    for kind, axis in reduction_axes(ctx):
        tasks.append(
            Task(
                task_id=f"reducescatter:grad_{kind}:c{c}:m{m}",
                kind=K.REDUCE_SCATTER,
                role=Role(f"grad_{kind}"),
                chunk=c,
                microbatch=m,
                group_axis=axis,
                deps=(after,),
            )
        )
    return tasks


def reduction_tasks(ctx: LoweringContext, program: list[Task]) -> list[Task]:
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
    for kind, axis in axes if ctx.zero != 2 else ():  # ZeRO-2 reduce-scattered each chunk's as it finished
        if ctx.zero:
            tasks.append(
                Task(
                    task_id=f"reducescatter:grad_{kind}",
                    kind=K.REDUCE_SCATTER,
                    role=Role(f"grad_{kind}"),
                    group_axis=axis,
                    deps=(last,),
                )
            )
        else:
            tasks.append(
                Task(
                    task_id=f"allreduce:grad_{kind}",
                    kind=K.ALL_REDUCE,
                    role=Role(f"grad_{kind}"),
                    group_axis=axis,
                    deps=(last,),
                )
            )
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
