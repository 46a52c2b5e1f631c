"""Collectives of sharded optimizer state (ZeRO): gradient reduce-scatter and parameter all-gather.

Owns the registries REDUCE_SCATTER and ALL_GATHER: (bytes of the whole buffer per member, member GPUs,
topology) -> phases. "ring": the two halves of the ring all-reduce (collectives.phases.all_reduce_ring),
n - 1 steps of size/n each to the next member, so a reduce-scatter plus an all-gather moves exactly what
one ring all-reduce moves (Rajbhandari et al. 2020: ZeRO-1 keeps data parallelism's volume; ZeRO-2 reduce-scatters
each micro-batch's gradients, and tensor/sequence parallelism uses the same halves on activations).
Pure numpy; no simpy or torch.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from piper_sim.collectives.phases import Phase
from piper_sim.registry import Registry
from piper_sim.topology.graph import Topology

Sharded = Callable[[float, list[str], Topology], list[Phase]]
REDUCE_SCATTER: Registry[Sharded] = Registry("collectives.all_reduce")
ALL_GATHER: Registry[Sharded] = Registry("collectives.all_reduce")


def _ring_half(size_bytes: float, members: list[str], name: str) -> list[Phase]:
    n = len(members)
    if n < 2:
        return []
    src = np.arange(n)
    return [Phase(src=src, dst=(src + 1) % n, sizes=np.full(n, (n - 1) / n * size_bytes), messages=n - 1, name=name)]


@REDUCE_SCATTER.register("ring")
def reduce_scatter_ring(size_bytes: float, members: list[str], topo: Topology) -> list[Phase]:
    return _ring_half(size_bytes, members, "ring-reduce-scatter")


@ALL_GATHER.register("ring")
def all_gather_ring(size_bytes: float, members: list[str], topo: Topology) -> list[Phase]:
    return _ring_half(size_bytes, members, "ring-all-gather")
