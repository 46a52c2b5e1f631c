"""The context-parallel ring of a layer's attention in the lowered schedule (docs/context-parallel.md).

Owns the tasks that pass keys and values around a CP group while the attention runs: a nonblocking collective of
role "cp" on group axis "cp", issued with the attention's compute task and waited for by the task after it, so the
ring's transfers overlap the attention on their own (collective) stream. Forward and recomputed forward: one
all-gather of the micro-batch's K/V; backward (and a split backward's input pass): the K/V all-gathered again and
their gradients reduce-scattered (Megatron-core's docs/source/api-guide/context_parallel.rst: the all-gather and
reduce-scatter run as point-to-point steps of a ring, Transformer Engine's cp_comm_type p2p). Both backends price and
run them as ring collectives of cp - 1 steps. Pure data: imports no simpy, torch or numpy.
"""

from __future__ import annotations

from piper_sim.schedule.ir import Task
from piper_sim.workload.task_kinds import Role, TaskKind

FORWARD_RING = (TaskKind.ALL_GATHER,)
BACKWARD_RING = (TaskKind.ALL_GATHER, TaskKind.REDUCE_SCATTER)
WHAT = {TaskKind.ALL_GATHER: "kv", TaskKind.REDUCE_SCATTER: "dkv"}


def ring_tasks(task_id: str, task: Task, layer: int, deps: tuple[str, ...], forward: bool) -> list[Task]:
    """The ring collectives beside the attention compute task `task_id` of layer `layer` (same deps as it)."""
    return [
        Task(
            task_id=f"{task_id}:cp_{WHAT[kind]}",
            kind=kind,
            microbatch=task.microbatch,
            chunk=task.chunk,
            role=Role.CP,
            layer=layer,
            group_axis="cp",
            deps=deps,
            nonblocking=True,
        )
        for kind in (FORWARD_RING if forward else BACKWARD_RING)
    ]
