"""Collective algorithms: a collective becomes phases of point-to-point flows with dependencies.

Owns Phase, the registries of all-to-all and all-reduce algorithms, the split-size exchange and the
single-level algorithms (flat and pairwise all-to-all, ring all-reduce); the topology-aware ones are in
hierarchical.py, and algorithms.py is where both are looked up. Pure numpy; no simpy or torch.
An all-to-all algorithm maps (traffic matrix bytes[src member, dst member], member GPUs, topology)
to phases; an all-reduce algorithm maps (bytes per member, member GPUs, topology) to phases.
Every phase's flows are (src member, dst member, bytes); `messages` is how many messages each flow
sends one after another (each pays latency and per-message overhead); `after` lists the phases
that must end before this one starts. Flows from a member to itself are local copies and dropped.
A phase may name its own costs: `overhead_s` replaces the topology's per-message overhead (a library
model that prices its messages itself sets 0), and `delay_s` is a fixed cost paid before the flows
(network.phase_run.phase_delay_s).

Uneven all-to-alls first tell the receivers how many rows come (`split_exchange`), as the torch
backend's implementations do: the counts (one int64 per pair) go by the same algorithm; pairwise
and 2dh then also gather, inside each node, every member's row and column of the split matrix (a ring).
These metadata phases are latency-bound and precede the data phases.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace

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
    overhead_s: float | None = None  # per-message overhead; None: the topology's message_overhead_s
    delay_s: float = 0.0  # a fixed cost before the flows start (e.g. a library's host-side posting)


AllToAll = Callable[[np.ndarray, list[str], Topology], list[Phase]]
AllReduce = Callable[[float, list[str], Topology], list[Phase]]
ALL_TO_ALL: Registry[AllToAll] = Registry("collectives.all_to_all")
ALL_REDUCE: Registry[AllReduce] = Registry("collectives.all_reduce")


def matrix_phase(matrix: np.ndarray, name: str = "", after: tuple[int, ...] = (), messages: int = 1) -> Phase:
    """One phase moving every off-diagonal nonzero entry of a bytes matrix."""
    moves = matrix != 0
    np.fill_diagonal(moves, False)
    src, dst = np.nonzero(moves)  # row-major, the order of matrix[moves]
    return Phase(src=src, dst=dst, sizes=matrix[moves].astype(float), name=name, after=after, messages=messages)


SPLIT_BYTES = 8  # one int64 row count per (source, destination)


def split_exchange(node_gather: bool) -> Callable[[AllToAll], AllToAll]:
    """Decorator: the algorithm's phases run after the exchange of split sizes, as the torch backend does.

    The counts (one int64 per pair) travel by the algorithm itself (phases named "splits:<phase>"): a
    fixed-size exchange needs no sizes of its own. Keyword options of the algorithm (deepep's fanout) reach its data
    phases only. With node_gather, a ring all_gather inside every node
    of each member's row and column of the split matrix (2 n int64, phase "splits:node") follows, so
    each member knows every chunk to or from its node, as the multi-phase algorithms need
    (`torch_backend.a2a_algorithms.AllToAllCall.holding`). Phases that waited for nothing now wait for it.
    """

    def wrap(algorithm: AllToAll) -> AllToAll:
        @functools.wraps(algorithm)
        def with_splits(matrix: np.ndarray, members: list[str], topo: Topology, **options) -> list[Phase]:
            phases = algorithm(matrix, members, topo, **options)
            n = matrix.shape[0]
            if n < 2 or not phases:
                return phases
            meta = [
                replace(p, name=f"splits:{p.name}")
                for p in algorithm(np.full((n, n), float(SPLIT_BYTES)), members, topo)
            ]
            if node_gather:
                host = np.array([topo.host_of(m) for m in members])
                rings = [g for g in (np.flatnonzero(host == h) for h in dict.fromkeys(host.tolist())) if g.size > 1]
                if rings:
                    steps = max(g.size for g in rings) - 1
                    src = np.concatenate(rings)
                    dst = np.concatenate([np.roll(g, -1) for g in rings])
                    meta.append(
                        Phase(
                            src=src,
                            dst=dst,
                            sizes=np.full(src.size, 2.0 * SPLIT_BYTES * n * steps),
                            messages=steps,
                            after=tuple(range(len(meta))),
                            name="splits:node",
                        )
                    )
            last = tuple(range(len(meta)))
            return meta + [replace(p, after=tuple(a + len(meta) for a in p.after) or last) for p in phases]

        return with_splits

    return wrap


def data_phases(algorithm: AllToAll, matrix: np.ndarray, members: list[str], topo: Topology) -> list[Phase]:
    """The algorithm's data phases alone (without the split-size exchange its registered form adds)."""
    return getattr(algorithm, "__wrapped__", algorithm)(matrix, members, topo)


def split_phases(phases: list[Phase]) -> tuple[list[Phase], list[Phase]]:
    """(the split-size exchange phases, the data phases with `after` renumbered among themselves).

    Every data phase waits for the exchange, so a collective alone takes the exchange's time plus the
    data phases' time; studies time the two apart (the exchange does not scale with the buffer)."""
    k = 0
    while k < len(phases) and phases[k].name.startswith("splits:"):
        k += 1
    return phases[:k], [replace(p, after=tuple(a - k for a in p.after if a >= k)) for p in phases[k:]]


@ALL_TO_ALL.register("flat")
@split_exchange(node_gather=False)
def a2a_flat(matrix: np.ndarray, members: list[str], topo: Topology) -> list[Phase]:
    """Direct all-to-all as vendor libraries run it: every pair at once, each GPU through its own path."""
    return [matrix_phase(matrix, "direct")]


@ALL_TO_ALL.register("pairwise")
@split_exchange(node_gather=True)
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
    return [
        Phase(
            src=src,
            dst=(src + 1) % n,
            sizes=np.full(n, 2.0 * (n - 1) / n * size_bytes),
            messages=2 * (n - 1),
            name="ring",
        )
    ]
