"""Megatron-style tensor parallelism of the torch stages (docs/tensor-parallel.md): which slice of each parameter a
rank of a tensor-parallel group holds, and the layers whose math needs the group (vocabulary-parallel embedding
and cross-entropy).

Owns TensorShard: a rank's place in its TP group (tp, its index, etp, sp, the group) and, for every parameter by
its global name, the dimension split and the rank's slice of the full tensor. Attention's q, k, v and the FFNs'
up-projections are split by rows (column-parallel), the output projections by columns (row-parallel), the
embedding and head by vocabulary rows; routed and shared experts over etp ranks (whole when etp is 1); norms
and routers are whole on every rank. A split region computes `h / tp + partial` so that the collective after
it (all-reduce or reduce-scatter) yields `h + sum of partials`. Parameter classes say which group reduces a
gradient: "dense" (a TP shard's replicas), "expert" (an expert shard's replicas), "replicated" (tp > 1: whole
on every rank of the stage, partial gradients per TP rank).
Only piper_sim.torch_backend may import torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

PARAM_CLASSES = ("dense", "expert", "replicated")


@dataclass(frozen=True)
class TensorShard:
    """One rank of a tensor-parallel group of `tp` ranks (index = rank % tp); experts split over `etp` (1 or tp)."""

    tp: int = 1
    index: int = 0
    etp: int = 1
    sp: bool = False
    group: Any = None  # the TP process group (the vocabulary-parallel cross-entropy's all-reduces)

    def split_of(self, name: str) -> tuple[int, int]:
        """(dimension, parts) a parameter is split into; parts 1 for a whole parameter."""
        leaf = name.rsplit(".", 1)[-1]
        if name in ("embed.weight", "head.weight"):
            return 0, self.tp
        if ".attn." in name:
            return (1 if leaf == "wo" else 0), self.tp
        if ".dense." in name:
            return (1 if leaf == "w2" else 0), self.tp
        if ".experts." in name or ".shared." in name:
            return (1 if leaf == "w2" else 0), self.etp
        return 0, 1

    def full_shape(self, name: str, shape: torch.Size) -> torch.Size:
        dim, parts = self.split_of(name)
        full = list(shape)
        full[dim] *= parts
        return torch.Size(full)

    def take(self, name: str, full: Tensor) -> Tensor:
        """This rank's slice of a full parameter (or of its gradient)."""
        dim, parts = self.split_of(name)
        return full if parts == 1 else full.chunk(parts, dim=dim)[self.index]

    def param_class(self, name: str) -> str:
        if ".experts." in name:
            return "expert"
        return "replicated" if self.tp > 1 and self.split_of(name)[1] == 1 else "dense"

    def residual(self, h: Tensor, *, split: bool = True) -> Tensor:
        """The residual a split region adds its partial output to: h / tp, summed back by the region's
        collective (division by a power of two is exact)."""
        return h / self.tp if split and self.tp > 1 else h

    @property
    def experts_split(self) -> bool:
        """Experts split over the TP group like a dense FFN (etp == tp > 1)."""
        return self.etp > 1

    @property
    def routes_slice(self) -> bool:
        """Whole experts (etp 1) under tp > 1 without sp: each rank routes its sequence slice of a whole h."""
        return self.tp > 1 and self.etp == 1 and not self.sp

    def local_tokens(self, h: Tensor) -> Tensor:
        """The rank's 1/tp of a (batch, seq, d) tensor along the sequence."""
        return h.chunk(self.tp, dim=1)[self.index]

    def vocab_start(self, vocab_shard: int) -> int:
        return self.index * vocab_shard


NO_SHARD = TensorShard()


def vocab_parallel_embedding(tokens: Tensor, weight: Tensor, start: int) -> Tensor:
    """The rows of the rank's vocabulary slice [start, start + rows); zero for tokens outside it."""
    local = tokens - start
    outside = (local < 0) | (local >= weight.shape[0])
    rows = F.embedding(local.masked_fill(outside, 0), weight)
    return rows * (~outside).unsqueeze(-1).to(rows.dtype)


class VocabParallelCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy over logits split by vocabulary across the group (Megatron's vocab-parallel loss):
    an all-reduce of the row maxima, then one of the exponentials' sums with the target logits; the backward is
    local (softmax of the slice minus the one-hot targets that fall in it)."""

    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor, start: int, group: Any) -> Tensor:  # noqa: ANN001
        row_max = logits.max(dim=-1).values
        dist.all_reduce(row_max, op=dist.ReduceOp.MAX, group=group)
        exp = torch.exp(logits - row_max.unsqueeze(-1))
        local = targets - start
        inside = (local >= 0) & (local < logits.shape[-1])
        local = local.masked_fill(~inside, 0)
        target_logit = logits.gather(-1, local.unsqueeze(-1)).squeeze(-1) * inside.to(logits.dtype)
        sums = torch.stack([exp.sum(dim=-1), target_logit])
        dist.all_reduce(sums, group=group)
        sum_exp, target_logit = sums
        ctx.save_for_backward(exp / sum_exp.unsqueeze(-1), local, inside)
        return (torch.log(sum_exp) + row_max - target_logit).mean()

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None, None]:  # noqa: ANN001
        softmax, local, inside = ctx.saved_tensors
        grad_logits = softmax.clone()
        rows = torch.arange(len(local), device=local.device)
        grad_logits[rows, local] -= inside.to(softmax.dtype)
        return grad_logits * (grad / len(local)), None, None, None
