"""Context parallelism in the torch executor: a rank's chunks of each sequence, and the attention core over the whole
sequence's keys and values gathered around its CP group (docs/context-parallel.md).

Owns ContextShard (the rank's place in its CP group, its tokens' positions, the K/V collectives and their timing)
and RingAttention (the core under CP). Each rank holds 2 of a sequence's 2 x cp chunks, i and 2 cp - 1 - i
(Megatron-LM's get_batch_on_this_cp_rank), so the causal work is even; the embedding's tokens and the head's targets
are sliced so, and RoPE takes the tokens' positions in the whole sequence. The attention core:
- forward: the rank's K and V (before grouped-query heads are repeated) all-gathered over the CP group
  (dist.all_gather_into_tensor), the core run on the rank's queries against every key with the causal mask of the
  tokens' positions; it keeps only its own q, k and v;
- backward: K and V all-gathered again, the core re-run with autograd (which the forward did without) to take its
  gradients, and dK, dV reduce-scattered back to their ranks (dist.reduce_scatter_tensor).
These are the schedule's ring tasks (role cp, beside the attention's compute task): the executor records each
call's time as the row of the ring task it stands for. Unlike Megatron's ring, each collective is one call made
inside the attention task, before (or, the reduce-scatter, after) the core, not cp - 1 steps overlapped with it.
Only piper_sim.torch_backend may import torch.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from piper_sim.workload.task_kinds import TaskKind


class ContextShard:
    """A rank's index in its CP group of cp ranks (group: their process group)."""

    def __init__(self, cp: int, index: int, group: dist.ProcessGroup) -> None:
        self.cp, self.index, self.group = cp, index, group
        self.calls: list[tuple[str, float, float, float, float]] = []  # (kind, start, end, bytes, cpu) of each call

    def positions(self, seq_len: int, index: int | None = None, device: torch.device | None = None) -> Tensor:
        """Positions in the sequence of a rank's tokens (this rank's by default): chunks i and 2 cp - 1 - i."""
        i = self.index if index is None else index
        size = seq_len // (2 * self.cp)
        return torch.cat(
            [
                torch.arange(i * size, (i + 1) * size, device=device),
                torch.arange((2 * self.cp - 1 - i) * size, (2 * self.cp - i) * size, device=device),
            ]
        )

    def local(self, x: Tensor) -> Tensor:
        """The rank's tokens of (batch, seq) tokens or targets."""
        return x[:, self.positions(x.shape[1], device=x.device)]

    def _timed(self, kind: str, nbytes: float, call) -> None:
        start, cpu = time.perf_counter(), time.thread_time()
        call()
        self.calls.append((kind, start, time.perf_counter(), nbytes, time.thread_time() - cpu))

    def gather(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """(batch, heads, local seq, head_dim) K and V -> the whole sequence's, in the CP ranks' order."""
        kv = torch.stack([k.detach(), v.detach()]).contiguous()
        two, b, h, s, d = kv.shape
        out = kv.new_empty((self.cp * two, b, h, s, d))  # by rank
        self._timed(
            TaskKind.ALL_GATHER,
            float(out.numel() * out.element_size()),
            lambda: dist.all_gather_into_tensor(out, kv, group=self.group),
        )
        whole = out.view(self.cp, two, b, h, s, d).permute(1, 2, 3, 0, 4, 5).reshape(two, b, h, self.cp * s, d)
        return whole[0], whole[1]

    def scatter(self, dk: Tensor, dv: Tensor) -> tuple[Tensor, Tensor]:
        """The whole sequence's dK, dV summed over the CP ranks, each rank keeping its tokens'."""
        b, h, s, d = dk.shape
        pieces = torch.stack([dk, dv]).reshape(2, b, h, self.cp, s // self.cp, d).permute(3, 0, 1, 2, 4, 5)
        pieces = pieces.reshape(self.cp * 2, b, h, s // self.cp, d)  # by rank
        out = pieces.new_empty((2, b, h, s // self.cp, d))
        self._timed(
            TaskKind.REDUCE_SCATTER,
            float(pieces.numel() * pieces.element_size()),
            lambda: dist.reduce_scatter_tensor(out, pieces, group=self.group),
        )
        return out[0], out[1]

    def core(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """softmax(q k^T) v of the rank's queries against the whole sequence's keys, causal by position."""
        local = q.shape[2]
        seq_len = local * self.cp
        mine = self.positions(seq_len, device=q.device)
        keys = torch.cat([self.positions(seq_len, r, q.device) for r in range(self.cp)])
        if k.shape[1] != q.shape[1]:  # grouped-query heads
            repeat = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keys[None, :] <= mine[:, None])

    def take_calls(self) -> list[tuple[str, float, float, float, float]]:
        calls, self.calls = self.calls, []
        return calls


class RingAttention(torch.autograd.Function):
    """The attention core under context parallelism (module docstring); q, k, v are the rank's, (b, heads, s, d)."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, context: ContextShard) -> Tensor:  # noqa: ANN001
        ctx.save_for_backward(q, k, v)
        ctx.context = context
        with torch.no_grad():
            return context.core(q, *context.gather(k, v))

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:  # noqa: ANN001
        q, k, v = ctx.saved_tensors
        context: ContextShard = ctx.context
        whole_k, whole_v = context.gather(k, v)
        with torch.enable_grad():
            inputs = tuple(t.detach().requires_grad_(True) for t in (q, whole_k, whole_v))
            dq, dk, dv = torch.autograd.grad(context.core(*inputs), inputs, grad)
        dk, dv = context.scatter(dk, dv)
        return dq, dk, dv, None
