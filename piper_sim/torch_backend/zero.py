"""ZeRO-1 and ZeRO-2 (Rajbhandari et al. 2020): Adam's state sharded over a parameter group's replicas.

Owns one group's flat layout. The group's parameters (a rank's dense ones, replicated over its ep x dp
replicas, or its routed experts, replicated over dp) become views of one flat buffer, padded to a multiple
of the replicas; the rank's slice of it is the one parameter its Adam updates (so Adam's two moments
exist for that slice only). The gradients are reduce-scattered into that slice's gradient
(dist.reduce_scatter_tensor: gloo and nccl both run it), and the updated slices all-gathered back into
the buffer (dist.all_gather_into_tensor), which updates every replica's parameters in place. ZeRO-1
reduce-scatters once before the optimizer step and keeps the full gradients until it ends; ZeRO-2's schedule
reduce-scatters after each chunk's backward of each micro-batch (the group's whole buffer: what is not yet
computed is zero), adds the result into the shard's gradient and drops the full gradients.
Only piper_sim.torch_backend may import torch.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn

from .groups import DEFAULT_GROUPS


def flatten(params: list[nn.Parameter], members: int) -> tuple[Tensor, int]:
    """The parameters made views of one flat buffer padded to a multiple of members (their values copied in);
    the buffer and the elements of each member's shard."""
    numel = sum(p.numel() for p in params)
    shard_numel = -(-numel // members)
    flat = torch.zeros(shard_numel * members, dtype=params[0].dtype, device=params[0].device)
    with torch.no_grad():
        for p, view in zip(params, views(params, flat), strict=True):
            view.copy_(p.detach())
            p.data = view
    return flat, shard_numel


def views(params: list[nn.Parameter], flat: Tensor) -> list[Tensor]:
    """Each parameter's place in a flat buffer, shaped like it."""
    out, offset = [], 0
    for p in params:
        out.append(flat[offset : offset + p.numel()].view_as(p))
        offset += p.numel()
    return out


class ShardedGroup:
    """One parameter group over its replicas: flat parameters, this rank's shard, reduce-scatter, all-gather."""

    def __init__(self, named: list[tuple[str, nn.Parameter]], ranks: tuple[int, ...], *, stage: int) -> None:
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.stage = stage
        self.group = DEFAULT_GROUPS.get(ranks)
        self.numel = sum(p.numel() for p in self.params)
        self.flat, self.shard_numel = flatten(self.params, dist.get_world_size(self.group))
        index = dist.get_rank(self.group)
        self.shard = nn.Parameter(self.flat[index * self.shard_numel : (index + 1) * self.shard_numel])

    def _views(self, flat: Tensor) -> list[Tensor]:
        return views(self.params, flat)

    def reduce_scatter(self) -> float:
        """The replicas' gradients summed, this rank's shard of the sum as its shard's gradient; bytes sent in."""
        grads = torch.zeros_like(self.flat)
        for p, view in zip(self.params, self._views(grads), strict=True):
            if p.grad is not None:
                view.copy_(p.grad)
        shard_grad = torch.empty(self.shard_numel, dtype=grads.dtype, device=grads.device)
        dist.reduce_scatter_tensor(shard_grad, grads, group=self.group)
        if self.stage >= 2 and self.shard.grad is not None:  # ZeRO-2: once per chunk and micro-batch, accumulated
            self.shard.grad += shard_grad
        else:
            self.shard.grad = shard_grad
        if self.stage >= 2:  # only the reduced shard stays
            for p in self.params:
                p.grad = None
        return float(grads.numel() * grads.element_size())

    def all_gather(self) -> float:
        """Every replica's updated shard into the flat buffer (the parameters); bytes received."""
        dist.all_gather_into_tensor(self.flat, self.shard.detach().clone(), group=self.group)
        return float(self.flat.numel() * self.flat.element_size())

    def reduced_grads(self) -> dict[str, Tensor]:
        """Tests: the full reduced gradient of every parameter, gathered from the replicas' shards."""
        full = torch.empty_like(self.flat)
        dist.all_gather_into_tensor(full, self.shard.grad, group=self.group)
        return {n: view.clone() for n, view in zip(self.names, self._views(full), strict=True)}

    def state_bytes(self) -> float:
        """Parameters (the padded flat buffer), their full gradients (alive from the backward to the
        reduce-scatter, in both stages), the shard's reduced gradient and Adam's two moments of the shard."""
        return float(self.flat.element_size() * (self.flat.numel() + self.numel + 3 * self.shard_numel))
