"""Broadcast: the root's buffer copied to every other member.

Owns the registry BROADCAST: (bytes of the root's buffer, member GPUs, topology) -> phases; the root is member 0
(nccl-tests' broadcast_perf root 0). "ring": the pipelined chain broadcast NCCL runs (its only broadcast algorithm:
a ring with the hop into the root left out), member i sending to member i + 1. The buffer moves in small chunks, so
every hop of the chain carries the whole buffer at once (one phase of n - 1 flows of the buffer's size, the
pipeline's fluid limit) after the pipeline fills: n - 1 sequential messages, each paying the per-message overhead
and the path latency. On a chain whose slowest hop has bandwidth B the time is (n - 1) (overhead + latency) + S / B,
and nccl-tests' bus bandwidth of a broadcast (S / t, factor 1) approaches B. The vendor libraries' form (their rings,
their copy efficiency) is registered by vendor.py. Pure numpy; no simpy or torch.
"""

from __future__ import annotations

import numpy as np

from piper_sim.collectives.phases import Phase
from piper_sim.collectives.sharded import Sharded
from piper_sim.registry import Registry
from piper_sim.topology.graph import Topology

BROADCAST: Registry[Sharded] = Registry("broadcast algorithm")


def chain_hops(order: np.ndarray, root: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(sources, destinations) of the chain that follows `order` (a ring of member indices) from the root."""
    start = int(np.flatnonzero(order == root)[0])
    chain = np.roll(order, -start)
    return chain[:-1], chain[1:]


@BROADCAST.register("ring")
def broadcast_ring(size_bytes: float, members: list[str], topo: Topology) -> list[Phase]:
    n = len(members)
    if n < 2:
        return []
    src, dst = chain_hops(np.arange(n))
    return [Phase(src=src, dst=dst, sizes=np.full(n - 1, float(size_bytes)), messages=n - 1, name="chain")]
