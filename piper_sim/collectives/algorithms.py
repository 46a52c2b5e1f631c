"""Collective algorithms: a collective becomes phases of point-to-point flows with dependencies.

Owns the registries of all-to-all and all-reduce algorithms. Pure numpy; no simpy or torch.
An all-to-all algorithm maps (traffic matrix bytes[src member, dst member], member GPUs, topology)
to phases; an all-reduce algorithm maps (bytes per member, member GPUs, topology) to phases.
Every phase's flows are (src member, dst member, bytes); `messages` is how many messages each flow
sends one after another (each pays latency and per-message overhead); `after` lists the phases
that must end before this one starts. Flows from a member to itself are local copies and dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from piper_sim.registry import Registry
from piper_sim.topology.graph import Topology


@dataclass(frozen=True, kw_only=True, eq=False)
class Phase:
    src: np.ndarray  # member indices
    dst: np.ndarray
    sizes: np.ndarray  # bytes per flow
    messages: int = 1
    after: tuple[int, ...] = ()
    name: str = ""


AllToAll = Callable[[np.ndarray, list[str], Topology], list[Phase]]
AllReduce = Callable[[float, list[str], Topology], list[Phase]]
ALL_TO_ALL: Registry[AllToAll] = Registry("collectives.all_to_all")
ALL_REDUCE: Registry[AllReduce] = Registry("collectives.all_reduce")


def matrix_phase(matrix: np.ndarray, name: str = "", after: tuple[int, ...] = (), messages: int = 1) -> Phase:
    """One phase moving every off-diagonal nonzero entry of a bytes matrix."""
    src, dst = np.nonzero(matrix)
    off = src != dst
    src, dst = src[off], dst[off]
    return Phase(src=src, dst=dst, sizes=matrix[src, dst].astype(float), name=name, after=after, messages=messages)


@ALL_TO_ALL.register("flat")
def a2a_flat(matrix: np.ndarray, members: list[str], topo: Topology) -> list[Phase]:
    """Direct all-to-all as vendor libraries run it: every pair at once, each GPU through its own path."""
    return [matrix_phase(matrix, "direct")]


@ALL_TO_ALL.register("pairwise")
def a2a_pairwise(matrix: np.ndarray, members: list[str], topo: Topology) -> list[Phase]:
    """n-1 rounds; in round r member i sends to (i + r) mod n, each round after the previous."""
    n = matrix.shape[0]
    phases: list[Phase] = []
    for r in range(1, n):
        src = np.arange(n)
        dst = (src + r) % n
        after = (len(phases) - 1,) if phases else ()
        phases.append(Phase(src=src, dst=dst, sizes=matrix[src, dst].astype(float), after=after, name=f"round{r}"))
    return phases


@ALL_REDUCE.register("ring")
def all_reduce_ring(size_bytes: float, members: list[str], topo: Topology) -> list[Phase]:
    """Ring all-reduce: reduce-scatter then all-gather, 2(n-1) steps of size/n to the next member.

    The steps are sequential but keep every ring link busy, so they are one phase whose flows
    carry 2(n-1)/n of the buffer and pay 2(n-1) message latencies.
    """
    n = len(members)
    if n < 2:
        return []
    src = np.arange(n)
    return [Phase(src=src, dst=(src + 1) % n, sizes=np.full(n, 2.0 * (n - 1) / n * size_bytes),
                  messages=2 * (n - 1), name="ring")]


# registers halo, 2dh, bruck (all-to-all) and tree, hierarchical (all-reduce)
from piper_sim.collectives import hierarchical as _hierarchical  # noqa: E402, F401
