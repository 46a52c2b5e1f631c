"""The executor's compute tasks (a mixin of executor.Executor, which owns the state they act on): forward, backward,
the zero-bubble weight pass and activation recomputation, each running its ops on the chunk's StageModule with the
autograd segments they keep and their FLOPs.

Autograd across segments: every differentiable tensor a segment leaves in the microbatch state is
detached into a fresh leaf when the next segment starts, so each backward task runs autograd on
exactly its own segment; gradients cross the all-to-alls and pipeline transfers explicitly, in the
backward tasks the schedule names. Zero-bubble schedules split each segment's backward into input
gradients (backward_input) and weight gradients (backward_weight, later, over the chunk's segments).
Activation recomputation (the schedule's recompute tasks, docs/torch-backend.md): with full
recomputation the forward of a chunk's recomputed ops runs without autograd and keeps only its input
(the checkpoint); the recompute tasks re-run those ops and all-to-alls from it with grad, right before
the chunk's backward, into segments of their own that the backward tasks then consume. Selective
recomputation keeps each attention core's q, k, v and re-runs the core in its recompute task
(layers.CoreRecompute). Only piper_sim.torch_backend may import torch.
"""

from __future__ import annotations

import torch
from torch import Tensor

from piper_sim.errors import PiperError
from piper_sim.schedule.ir import Task
from piper_sim.workload.flops import op_work
from piper_sim.workload.task_kinds import BACKWARD_INPUT_KINDS

from .layers import DeferredWeightGrads
from .segments import MicroState, Segment, differentiable, leafify
from .stage_modules import State


class ComputeTasks:
    """Executor methods for the schedule's compute tasks."""

    def _forward(self, task: Task) -> float:
        """The task's ops; with full recomputation its recomputed ops (a prefix of the chunk's forward) first,
        without autograd, from a checkpoint of the chunk's input the recompute tasks start from."""
        ms = self._micro(task)
        self.tp.enter_forward(task.ops, ms.state)
        redo = self.redo.get(task.chunk, set())
        split = next((i for i, op in enumerate(task.ops) if op not in redo), len(task.ops))
        prefix, rest = task.ops[:split], task.ops[split:]
        if any(op in redo for op in rest):
            raise PiperError(f"task {task.task_id}: recomputed ops {sorted(redo)} are not a prefix of the forward")
        flops = 0.0
        if prefix:
            if ms.checkpoint is None:
                self._take_checkpoint(ms)
            with torch.no_grad():
                flops = self._run_ops(task, prefix, ms.state, record_routing=True)
        seg = self._segment(task, rest, ms.state, record_routing=True, floats=bool(prefix))
        seg.redo = bool(prefix)
        ms.segments.append(seg)
        return flops + seg.flops

    def _segment(
        self, task: Task, ops: tuple[str, ...], state: State, *, record_routing: bool, floats: bool = False
    ) -> Segment:
        """Run ops with autograd on the state as one segment: inputs as fresh leaves, the activations it keeps
        counted (step 0)."""
        if not ops:
            return Segment()
        seg = Segment(inputs=leafify(state, floats=floats), ops=ops)
        with torch.enable_grad(), self.meter.count_saved(self.step == 0) as saved:
            seg.flops = self._run_ops(task, ops, state, record_routing=record_routing)
        if "loss" in state and "head" in ops:
            state["loss_scaled"] = state["loss"] * self.loss_scale
        seg.outputs = differentiable(state)
        seg.saved_bytes = float(sum(saved.values()))
        self.meter.account(seg.saved_bytes)
        return seg

    def _run_ops(self, task: Task, ops: tuple[str, ...], state: State, *, record_routing: bool) -> float:
        """Run ops of the task's chunk on the state; their FLOPs. record_routing: the router's choices go to the
        routing trace (forward only: a recompute repeats them)."""
        flops = 0.0
        module = self.modules[task.chunk]
        for op in ops:
            module.run_op(op, state)
            flops += self._op_flops(op, state)
            # the ranks of a TP group route the same tokens when the experts are split (etp == tp): one records
            if record_routing and op.startswith("router:") and self.coords["etp"] == 0:
                layer = int(op.partition(":")[2])
                counts = state["expert_counts"][layer].tolist()
                self.routing_rows.append((self.step, layer, task.microbatch, self.coords["ep"], counts))
        return flops

    def _take_checkpoint(self, ms: MicroState) -> None:
        """Full recomputation keeps the chunk's input state (all but the targets: the head, their only
        reader, is never recomputed)."""
        ms.checkpoint = {k: v for k, v in ms.state.items() if k != "targets"}
        storages = {
            t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
            for t in ms.checkpoint.values()
            if isinstance(t, Tensor)
        }
        ms.checkpoint_bytes = float(sum(storages.values()))
        self.meter.account(ms.checkpoint_bytes)

    def _recompute(self, task: Task) -> float:
        """A recompute task: selective, the attention cores of its ops; full, its forward ops with autograd on
        the state rebuilt from the chunk's checkpoint, as a segment the backward consumes."""
        ms = self._micro(task)
        if all(op.startswith("attn_core:") for op in task.ops):
            return self._recompute_cores(task, ms)
        state = self._redo_state(task, ms)
        self.tp.enter_forward(task.ops, state)
        seg = self._segment(task, task.ops, state, record_routing=False)
        ms.recomputed.append(seg)
        return seg.flops

    def _redo_state(self, task: Task, ms: MicroState) -> State:
        if ms.redo_state is None:
            if ms.checkpoint is None:
                raise PiperError(f"task {task.task_id}: nothing to recompute from (no checkpoint of the chunk)")
            ms.redo_state, ms.checkpoint = ms.checkpoint, None
            self.meter.account(-ms.checkpoint_bytes)  # the recomputed segments count what they keep of it
        return ms.redo_state

    def _recompute_cores(self, task: Task, ms: MicroState) -> float:
        """Selective: each layer's attention core from its kept q, k, v; what the recomputed graph keeps is
        charged to the segment holding the layer's attention until that segment's backward."""
        flops = 0.0
        cores = ms.state.get("attn_cores", {})
        for op in task.ops:
            layer = int(op.partition(":")[2])
            core = cores.pop(layer)
            kept = frozenset(t.untyped_storage().data_ptr() for t in core.kept())  # counted by the forward
            with self.meter.count_saved(self.step == 0, kept) as saved:
                core.recompute()
            owner = next(seg for seg in ms.segments if f"attn:{layer}" in seg.ops)
            owner.saved_bytes += float(sum(saved.values()))
            self.meter.account(float(sum(saved.values())))
            flops += self._op_flops(op, ms.state)
        return flops

    def _op_flops(self, op: str, state: State) -> float:
        tokens = (
            self.model.seq_len // self.mesh.cp * (state["h"].shape[0] if "h" in state and state["h"].dim() == 3 else 1)
        )
        if op.startswith("experts:"):
            counts = torch.bincount(state["recv_expert_ids"], minlength=self.model.num_experts)
            rows = tuple(int(c) for c in counts.tolist() if c > 0)
            return op_work(self.model, op, tokens, rows, split=self.split).flops
        return op_work(self.model, op, tokens, split=self.split).flops

    def _backward(self, task: Task) -> float:
        """Autograd over the segment the task's forward made (then over its recomputed part, if any)."""
        ms = self._micro(task)
        seg = ms.segments.pop()
        if seg.a2a is not None:
            raise PiperError(f"task {task.task_id}: expected a compute segment, found an all-to-all (schedule order)")
        if "loss_scaled" in seg.outputs:
            ms.pending["loss_scaled"] = torch.ones((), device=self.device)
        self._local_grad(task, ms)
        self.tp.enter_backward(task.ops, ms.pending)
        pieces = [seg, ms.recomputed.pop()] if seg.redo else [seg]
        for piece in pieces:
            self._backprop(piece, ms, split=task.kind in BACKWARD_INPUT_KINDS)
        return (1.0 if task.kind in BACKWARD_INPUT_KINDS else 2.0) * sum(piece.flops for piece in pieces)

    def _backprop(self, seg: Segment, ms: MicroState, *, split: bool) -> None:
        """The segment's outputs with their pending gradients back to its input leaves (pending by key)."""
        keys = [k for k in seg.outputs if k in ms.pending]
        outputs = [seg.outputs[k] for k in keys]
        grads = [ms.pending.pop(k) for k in keys]
        leaves = list(seg.inputs.items())
        if split:  # input gradients now, the linears' weight gradients in backward_weight
            with DeferredWeightGrads.collect(seg.weight_grads):
                if outputs:
                    torch.autograd.backward(outputs, grads)
            ms.done_backward.append(seg)
        else:
            if outputs:
                torch.autograd.backward(outputs, grads)
            self.meter.account(-seg.saved_bytes)
        for key, leaf in leaves:
            if leaf.grad is not None:
                ms.pending[key] = leaf.grad

    def _weight_pass(self, task: Task) -> float:
        """ZB-H1's W: the weight gradients the input passes of this microbatch deferred (GEMMs only)."""
        ms = self._micro(task)
        flops = 0.0
        for seg in ms.done_backward:
            flops += seg.flops
            DeferredWeightGrads.apply(seg.weight_grads)
            self.meter.account(-seg.saved_bytes)
        ms.done_backward.clear()
        return flops
