"""Topology-aware collectives: 2D hierarchical and Bruck all-to-all; tree and hierarchical all-reduce (HALO: halo.py).

Registered into the registries of `piper_sim.collectives.phases` (algorithms.py imports this module). Members are
grouped by host (`graph.nodes[gpu]["host"]`); a member's local index is its rank among the members of
its host, in member order. Pure numpy; no simpy or torch.
"""

from __future__ import annotations

import numpy as np

from piper_sim.collectives.phases import (
    ALL_REDUCE,
    ALL_TO_ALL,
    Phase,
    a2a_flat,
    all_reduce_ring,
    data_phases,
    matrix_phase,
    split_exchange,
)
from piper_sim.topology.graph import Topology


def host_groups(members: list[str], topo: Topology) -> tuple[np.ndarray, list[np.ndarray]]:
    """(host group id of every member, member indices of every group in member order).

    Group ids number the distinct hosts in order of first appearance among the members.
    """
    ids: dict[int, int] = {}
    host = np.array([ids.setdefault(topo.host_of(m), len(ids)) for m in members], dtype=np.int64)
    groups = [np.flatnonzero(host == h) for h in range(len(ids))]
    return host, groups


def local_index(host: np.ndarray, groups: list[np.ndarray]) -> np.ndarray:
    local = np.empty(host.size, dtype=np.int64)
    for group in groups:
        local[group] = np.arange(group.size)
    return local


def _empty(name: str, after: tuple[int, ...] = ()) -> Phase:
    return Phase(
        src=np.zeros(0, dtype=np.int64), dst=np.zeros(0, dtype=np.int64), sizes=np.zeros(0), name=name, after=after
    )


# ---- 2D hierarchical -----------------------------------------------------------------------------
def _uniform_groups(groups: list[np.ndarray]) -> bool:
    return len({g.size for g in groups}) == 1


@ALL_TO_ALL.register("2dh")
@split_exchange(node_gather=True)
def a2a_2dh(matrix: np.ndarray, members: list[str], topo: Topology) -> list[Phase]:
    """Tutel-style 2D hierarchical all-to-all, three sequential phases.

    Phase 1 ("align", intra-node): member i of node A sends to local member j of A every row it holds
    for the members with local index j on all nodes. Phase 2 ("inter", after 1): all-to-all among the
    members with the same local index: (A, j) sends to (B, j) the rows it collected for (B, j), one
    message per node pair and local index. Phase 3 ("relayout", after 2): what (B, j) received is
    already its own, so the intra-node redistribution moves no bytes across GPUs; it is the local
    stride copy of Tutel (an HBM copy, not modelled by the flow network) and is an empty phase.
    Requires the same number of members on every node; otherwise falls back to "flat".
    """
    host, groups = host_groups(members, topo)
    if not _uniform_groups(groups):
        return data_phases(a2a_flat, matrix, members, topo)  # the 2dh split exchange stays
    n = matrix.shape[0]
    g = groups[0].size
    local = local_index(host, groups)
    member_at = np.empty((len(groups), g), dtype=np.int64)
    member_at[host, local] = np.arange(n)
    # align: src member i -> same-node member with local index of the destination
    by_local = np.zeros((n, g))
    np.add.at(by_local.T, local, matrix.T)  # by_local[i, j] = sum over d with local[d]==j of matrix[i, d]
    align = np.zeros((n, n))
    align[np.arange(n)[:, None], member_at[host][:, :]] = by_local
    # inter: (A, j) -> (B, j) carries sum over i on A of matrix[(A, i), (B, j)]
    node_to_member = np.zeros((len(groups), n))
    np.add.at(node_to_member, host, matrix)
    inter = np.zeros((n, n))
    inter[member_at[:, local], np.arange(n)[None, :]] = node_to_member
    return [matrix_phase(align, "align"), matrix_phase(inter, "inter", after=(0,)), _empty("relayout", (1,))]


# ---- Bruck ---------------------------------------------------------------------------------------
@ALL_TO_ALL.register("bruck")
@split_exchange(node_gather=False)
def a2a_bruck(matrix: np.ndarray, members: list[str], topo: Topology) -> list[Phase]:
    """Bruck's all-to-all: ceil(log2 n) sequential rounds for small messages.

    The block from s to d has offset r = (d - s) mod n; in round k it moves +2^k if bit k of r is set,
    so in round k member i sends to (i + 2^k) mod n every block it holds with bit k set (about half
    of the data, forwarded blocks included). Pays log2 n message latencies instead of n - 1 (pairwise)
    at the cost of moving each byte up to log2 n times.
    """
    n = matrix.shape[0]
    src, dst = np.nonzero(matrix)
    off = src != dst
    src, dst = src[off], dst[off]
    size = matrix[src, dst].astype(float)
    offset = (dst - src) % n
    phases: list[Phase] = []
    k = 0
    while (1 << k) < n:
        moving = (offset >> k) & 1 == 1
        pos = (src + (offset & ((1 << k) - 1))) % n
        sent = np.bincount(pos[moving], weights=size[moving], minlength=n)
        senders = np.flatnonzero(sent)
        after = (len(phases) - 1,) if phases else ()
        phases.append(
            Phase(src=senders, dst=(senders + (1 << k)) % n, sizes=sent[senders], after=after, name=f"round{k}")
        )
        k += 1
    return phases


# ---- all-reduce ----------------------------------------------------------------------------------
@ALL_REDUCE.register("tree")
def all_reduce_tree(size_bytes: float, members: list[str], topo: Topology) -> list[Phase]:
    """Tree all-reduce: reduce to member 0 then broadcast, 2 ceil(log2 n) sequential phases of size bytes.

    The tree is binomial (the binary-tree schedule with one child per round): in reduce round k, each
    member i with i mod 2^(k+1) == 2^k sends the whole buffer to i - 2^k; broadcast runs the rounds
    in reverse with the flows reversed. Latency-friendly for small buffers, bandwidth-poor for big ones.
    """
    n = len(members)
    rounds: list[tuple[np.ndarray, np.ndarray]] = []
    k = 0
    while (1 << k) < n:
        child = np.arange(1 << k, n, 1 << (k + 1))
        rounds.append((child, child - (1 << k)))
        k += 1
    flows = rounds + [(parent, child) for child, parent in reversed(rounds)]
    phases: list[Phase] = []
    for r, (src, dst) in enumerate(flows):
        after = (len(phases) - 1,) if phases else ()
        name = f"reduce{r}" if r < len(rounds) else f"bcast{r - len(rounds)}"
        phases.append(Phase(src=src, dst=dst, sizes=np.full(src.size, float(size_bytes)), after=after, name=name))
    return phases


def _rings(groups: list[np.ndarray], size: float, messages: int, name: str, after: tuple[int, ...]) -> Phase:
    src = np.concatenate([g for g in groups if g.size > 1] or [np.zeros(0, dtype=np.int64)])
    dst = np.concatenate([np.roll(g, -1) for g in groups if g.size > 1] or [np.zeros(0, dtype=np.int64)])
    return Phase(src=src, dst=dst, sizes=np.full(src.size, size), messages=messages, after=after, name=name)


@ALL_REDUCE.register("hierarchical")
def all_reduce_hierarchical(size_bytes: float, members: list[str], topo: Topology) -> list[Phase]:
    """Hierarchical all-reduce over g members per node and H nodes, three sequential phases.

    1 ("reduce_scatter"): ring reduce-scatter inside each node, g - 1 steps of size/g.
    2 ("inter"): ring all-reduce among the members with the same local index on 1/g of the buffer,
    2(H - 1) steps of size/(g H). 3 ("all_gather"): ring all-gather inside each node, g - 1 steps.
    Each ring is one phase (as in "ring") carrying its total bytes and paying its step latencies.
    Requires the same number of members on every node; otherwise falls back to "ring".
    """
    host, groups = host_groups(members, topo)
    if len(members) < 2:
        return []
    if not _uniform_groups(groups):
        return all_reduce_ring(size_bytes, members, topo)
    g, h = groups[0].size, len(groups)
    local = local_index(host, groups)
    phases: list[Phase] = []
    if g > 1:
        phases.append(_rings(groups, (g - 1) / g * size_bytes, g - 1, "reduce_scatter", ()))
    if h > 1:
        same_local = [np.flatnonzero(local == j) for j in range(g)]
        after = (len(phases) - 1,) if phases else ()
        phases.append(_rings(same_local, 2.0 * (h - 1) / h * size_bytes / g, 2 * (h - 1), "inter", after))
    if g > 1:
        phases.append(_rings(groups, (g - 1) / g * size_bytes, g - 1, "all_gather", (len(phases) - 1,)))
    return phases
