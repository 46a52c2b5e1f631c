"""The executor's communication tasks (a mixin of executor.Executor, which owns the state they act on): the MoE
all-to-alls (forward, their recomputation and their backward), the tensor-parallel collectives on h, the pipeline
sends and receives, and ZeRO-3's nonblocking collectives (sharded_params.py), issued and recorded when they end.
Only piper_sim.torch_backend may import torch.
"""

from __future__ import annotations

import time

import torch
from torch import Tensor

from piper_sim.errors import PiperError
from piper_sim.schedule.ir import Task
from piper_sim.workload.task_kinds import Role, TaskKind

from .a2a_algorithms import all_to_all, dispatch_rows
from .segments import MicroState, Segment
from .stage_modules import State


class CommunicationTasks:
    """Executor methods for the schedule's communication tasks."""

    def _all_to_all(self, task: Task) -> float:
        ms = self._micro(task)
        group = self.mesh.group(self.rank, "ep")
        if task.task_id.startswith("R:"):  # recomputed: exchanged again, from the recompute tasks' state
            return self._a2a_forward(task, self._redo_state(task, ms), group, ms.recomputed)
        if task.in_forward:
            redo = f"{task.role}:{task.layer}" in self.redo.get(task.chunk, set())
            return self._a2a_forward(task, ms.state, group, ms.segments, redo=redo)
        seg = ms.segments.pop()
        if seg.redo:
            seg = ms.recomputed.pop()
        if seg.a2a is None:
            raise PiperError(f"task {task.task_id}: expected an all-to-all record, found a compute segment")
        a2a = seg.a2a
        forward_dispatch = a2a["role"] == Role.DISPATCH
        grad_key, out_key = ("recv_rows", "send_rows") if forward_dispatch else ("combined_rows", "return_rows")
        grad = ms.pending.pop(grad_key, None)
        if grad is None:
            grad = torch.zeros(sum(a2a["recv_splits"]), self.model.d_model, device=self.device, dtype=self.dtype)
        rows, _ = all_to_all(grad.contiguous(), a2a["recv_splits"], group, self.node_of, self.algorithm, halo=self.halo)
        ms.pending[out_key] = rows
        return float(rows.numel() * rows.element_size())

    def _a2a_forward(
        self, task: Task, state: State, group: tuple[int, ...], segments: list[Segment], *, redo: bool = False
    ) -> float:
        """The forward exchange on state; its record goes on segments (redo: a stand-in for the recomputed one)."""
        if task.role == Role.DISPATCH:
            splits = list(state["send_splits"])
            rows, ids, recv_splits = dispatch_rows(
                state["send_rows"],
                state["send_expert_ids"],
                splits,
                group,
                self.node_of,
                self.algorithm,
                halo=self.halo,
            )
            state.update(recv_rows=rows.requires_grad_(True), recv_splits=recv_splits, recv_expert_ids=ids)
            record = {"role": Role.DISPATCH, "send_splits": splits, "recv_splits": recv_splits}
            sent = state["send_rows"]
            nbytes = (sum(splits) - splits[group.index(self.rank)]) * sent.shape[1] * sent.element_size()
        else:
            splits = list(state["recv_splits"])
            rows, back = all_to_all(
                state["return_rows"].detach(), splits, group, self.node_of, self.algorithm, halo=self.halo
            )
            state["combined_rows"] = rows.requires_grad_(True)
            record = {"role": Role.COMBINE, "send_splits": splits, "recv_splits": back}
            nbytes = (sum(splits) - splits[group.index(self.rank)]) * rows.shape[1] * rows.element_size()
        segments.append(Segment(a2a=record, redo=redo))
        return float(nbytes)

    def _tp_task(self, task: Task) -> float:
        """A TP collective on h (forward, or its recomputation) or on h's gradient (backward)."""
        ms = self._micro(task)
        if not task.in_forward:
            self._local_grad(task, ms)
            ms.pending["h"] = self.tp.run(task.kind, ms.pending["h"])
            return float(ms.pending["h"].numel() * ms.pending["h"].element_size())
        recomputed = task.task_id.startswith("R:")
        state = self._redo_state(task, ms) if recomputed else ms.state
        full_redo = any(not op.startswith("attn_core:") for op in self.redo.get(task.chunk, ()))
        if full_redo and not recomputed and not ms.segments and ms.checkpoint is None:
            self._take_checkpoint(ms)  # the chunk's input, before its first task (an all-gather under sp)
        state["h"] = self.tp.run(task.kind, state["h"]).requires_grad_(True)
        return float(state["h"].numel() * state["h"].element_size())

    def _post_p2p(self, task: Task) -> None:
        ms = self._micro(task)
        start = time.perf_counter()
        if task.kind == TaskKind.SEND:
            tensor = ms.state["h"] if task.role == Role.ACT else ms.pending.pop("h")
            buffer = tensor.detach().contiguous()
        else:
            seq = self.model.seq_len // self.mesh.cp  # the rank's chunks of the sequence under CP
            shape = self.tp.activation_shape(self.micro_batch_size, seq, self.model.d_model)
            buffer = torch.empty(shape, device=self.device, dtype=self.dtype)
        self.transfers.post(task, ms, self.mesh.peer(self.rank, task.peer_stage), buffer, start)

    def _issue_fsdp(self, task: Task) -> None:
        """A ZeRO-3 collective, issued: its row spans from here to when the rank first sees it ended."""
        start = time.perf_counter()
        issued, nbytes = self.fsdp.issue(task)
        if issued is None:
            self._record(task, start, time.perf_counter(), 0.0, 0.0)
            return
        work, finish = issued

        def done(posted: float, ended: float) -> None:
            finish()
            self._record(task, posted, ended, nbytes, 0.0)

        self.transfers.track(task.task_id, work, start, done)

    def _ring_rows(self, task: Task) -> None:
        """The rows of the ring tasks issued before task, from the K/V collectives its attention ran, in order."""
        calls = self.context.take_calls()
        if not self.ring and not calls:
            return
        kinds = [t.kind for t in self.ring]
        if kinds != [kind for kind, *_ in calls]:
            raise PiperError(
                f"task {task.task_id}: its ring tasks {kinds} but its attention ran "
                f"{[kind for kind, *_ in calls]} (context parallelism)"
            )
        for ring, (_, start, end, nbytes, cpu) in zip(self.ring, calls, strict=True):
            self._record(ring, start, end, nbytes, 0.0, cpu)
        self.ring.clear()

    def _finish_p2p(self, task: Task, ms: MicroState, start: float, end: float, buffer: Tensor) -> None:
        if task.kind == TaskKind.RECV:
            if task.role == Role.ACT:
                ms.state["h"] = buffer.requires_grad_(True)
            else:
                ms.pending["h"] = buffer
        self._record(task, start, end, float(buffer.numel() * buffer.element_size()), 0.0)
