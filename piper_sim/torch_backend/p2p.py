"""Pipeline sends and receives of one rank in the torch executor: posted with isend/irecv, finished when the
program waits on them (a task's dependency, or the end of the step) or when polling finds them done; the schedule's
nonblocking collectives (ZeRO-3's, issued with async_op) are tracked the same way.
Only piper_sim.torch_backend may import torch.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable

import torch.distributed as dist
from torch import Tensor

from piper_sim.schedule.ir import Task
from piper_sim.workload.task_kinds import TaskKind

# (task, its microbatch's state, posted at, ended at, the buffer sent or received)
Finish = Callable[[Task, object, float, float, Tensor], None]


class Transfers:
    def __init__(self, finish: Finish) -> None:
        self.finish = finish
        self.pending: dict[str, tuple] = {}  # task id -> (work, posted at, what to do when it has ended)

    def post(self, task: Task, micro: object, peer: int, buffer: Tensor, start: float) -> None:
        if task.kind == TaskKind.SEND:
            work = dist.isend(buffer, dst=peer, tag=tag(task))
        else:
            work = dist.irecv(buffer, src=peer, tag=tag(task))
        self.track(task.task_id, work, start, lambda s, e: self.finish(task, micro, s, e, buffer))

    def track(self, task_id: str, work: dist.Work, start: float, done: Callable[[float, float], None]) -> None:
        """Any issued work: done(posted at, seen ended at) once it has ended."""
        self.pending[task_id] = (work, start, done)

    def wait(self, task_id: str) -> None:
        """Finish the transfer of task_id (if it is pending)."""
        entry = self.pending.pop(task_id, None)
        if entry is not None:
            work, start, done = entry
            work.wait()
            done(start, time.perf_counter())

    def poll(self) -> None:
        now = time.perf_counter()
        for task_id, (work, start, done) in list(self.pending.items()):
            if work.is_completed():
                del self.pending[task_id]
                work.wait()
                done(start, now)

    def wait_all(self) -> None:
        for task_id in list(self.pending):
            self.wait(task_id)


def tag(task: Task) -> int:
    """A stable integer tag for a send/recv pair (both sides share the string tag)."""
    return zlib.crc32(task.tag.encode()) & 0x7FFFFFFF
