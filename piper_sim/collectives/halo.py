"""Piper's HALO all-to-all (DESIGN.md section 6), as designed: three phases, every NIC busy.

Owns the HALO algorithm, its relay choice (which member of the destination node receives each packed
message) and its pipelining. Registered in the all-to-all registry of piper_sim.collectives.phases
(algorithms.py imports this module). Pure numpy; no simpy or torch.

Members are grouped by host (collectives.hierarchical.host_groups). With one node, HALO is the intra-node
all-to-all: the same single phase (and the same split-size exchange) as flat, so it costs what flat costs.
With H > 1 nodes:

- Phase I ("intra"): the entries whose source and destination share a node, directly; it runs
  concurrently with phase II.
- Phase II ("inter"): every member packs the rows it holds for each other node into one message and
  sends it through its own NIC to a relay on that node. Every member of every node sends, so every NIC
  is busy at any node count. The relay of member a on node B (`relay_table`) is the member of B whose
  NIC sits on the same network switch as a's NIC when B has one (then the message crosses no
  switch-to-switch link: inside a Frontier chassis each node's 4 NICs sit on the chassis' 4 switches);
  otherwise the member with a's local index. Members sharing a NIC go to members sharing a NIC, in order,
  and each member of B relays at most ceil(|A| / |B|) of A's members' messages, so the receiving NICs are
  as evenly loaded as the sending ones.
- Phase III ("redistribute", after II): each relay forwards to every other member of its node the rows
  it received for it, one message per destination (the relay's own rows stay).

Pipelining: phase II messages are cut into S slices of about `chunk_MiB` (at most `max_slices`, from
the topology's `collectives.halo` parameters); slice s of phase II follows slice s - 1, and slice s of
phase III follows slice s of phase II, so the forwarding of one slice overlaps the transfer of the next
and only the last slice's forwarding is exposed. Each slice is its own set of messages (it pays the
per-message overhead and latency again). Every byte of the matrix reaches its destination exactly once
(tests/test_collectives.py checks it on uneven matrices).

The split sizes go first by HALO itself (split_exchange without the node gather): a relay learns the
sizes of what it forwards from the counts it relays, so no intra-node gather of the split matrix is
needed.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from piper_sim.collectives.hierarchical import host_groups
from piper_sim.collectives.params import algorithm_params
from piper_sim.collectives.phases import ALL_TO_ALL, Phase, a2a_flat, split_exchange
from piper_sim.topology.graph import Topology
from piper_sim.topology.structured import StructuredRouter

HALO_SCHEMA: dict[str, object] = {"chunk_MiB": 1.0, "max_slices": 16}


# ---- relay choice -------------------------------------------------------------------------------
def nic_attachments(members: list[str], topo: Topology) -> tuple[np.ndarray, list[str]]:
    """Per member: the index of the NIC it sends through (-1: none known) and that NIC's network switch."""
    graph, router = topo.graph, topo.router
    nic = np.full(len(members), -1, dtype=np.int64)
    switch = [""] * len(members)
    for m, gpu in enumerate(members):
        host, local = int(graph.nodes[gpu]["host"]), int(graph.nodes[gpu].get("local_index", 0))
        if isinstance(router, StructuredRouter):
            nic[m] = router.node.gpu_nic[local]
            switch[m] = router.fabric.nic_switch(host, int(nic[m])) if nic[m] >= 0 else ""
            continue
        name = f"n{host}.nic{local}"
        if name in graph:
            nic[m] = local
            attached = sorted(v for v in graph.successors(name)
                              if graph.nodes[v].get("kind") == "switch" and "host" not in graph.nodes[v])
            switch[m] = attached[0] if attached else ""
    return nic, switch


@lru_cache(maxsize=4096)
def _pairing(num_senders: int, num_receivers: int, same_switch: tuple[tuple[bool, ...], ...]) -> tuple[int, ...]:
    """Receiver position of each sender position: same switch first, else the same local index."""
    cap = math.ceil(num_senders / num_receivers)
    load = [0] * num_receivers
    out = []
    for i in range(num_senders):
        prefs = [j for j in range(num_receivers) if same_switch[i][j]]
        prefs += [(i + t) % num_receivers for t in range(num_receivers)]
        j = next(j for j in prefs if load[j] < cap)
        load[j] += 1
        out.append(j)
    return tuple(out)


def relay_table(groups: list[np.ndarray], switch_id: np.ndarray) -> dict[tuple[int, int], tuple[int, ...]]:
    """(node A, node B) -> receiver member (an index into B's group) of each of A's members, A != B."""
    table = {}
    for a, ga in enumerate(groups):
        for b, gb in enumerate(groups):
            if a != b:
                eq = switch_id[ga][:, None] == switch_id[gb][None, :]
                table[(a, b)] = _pairing(ga.size, gb.size, tuple(map(tuple, eq.tolist())))
    return table


def _switch_ids(members: list[str], topo: Topology) -> np.ndarray:
    """A dense id per member's NIC switch; members with no known switch get ids of their own."""
    _, switch = nic_attachments(members, topo)
    ids: dict[str, int] = {}
    out = np.empty(len(members), dtype=np.int64)
    for m, name in enumerate(switch):
        out[m] = ids.setdefault(name, len(ids)) if name else -1 - m
    return out


# ---- phases -------------------------------------------------------------------------------------
def _uniform_relays(groups: list[np.ndarray], switch_id: np.ndarray) -> np.ndarray:
    """recv[A, B, i]: position in B's group of the relay of member i of A (A == B: -1), all groups of size g.

    The pairing depends on A and B only through their members' NIC switches: it is solved once per pair of
    distinct switch lists and looked up for every node pair."""
    g, h = groups[0].size, len(groups)
    sw = switch_id[np.stack(groups)]  # (h, g)
    kinds, kind = np.unique(sw, axis=0, return_inverse=True)
    kind = kind.reshape(-1)
    table = np.empty((kinds.shape[0], kinds.shape[0], g), dtype=np.int64)
    for a, sa in enumerate(kinds):
        for b, sb in enumerate(kinds):
            eq = sa[:, None] == sb[None, :]
            table[a, b] = _pairing(g, g, tuple(map(tuple, eq.tolist())))
    recv = table[kind[:, None], kind[None, :]]
    recv[np.arange(h), np.arange(h)] = -1
    return recv


Flows = tuple[np.ndarray, np.ndarray, np.ndarray]  # src, dst, bytes


def flows_phase(flows: Flows, name: str, after: tuple[int, ...] = (), scale: float = 1.0) -> Phase:
    """A phase of the given flows, those that move no bytes or stay on their member dropped."""
    src, dst, size = flows
    keep = (size > 0) & (src != dst)
    return Phase(src=src[keep], dst=dst[keep], sizes=size[keep].astype(float) * scale, name=name, after=after)


def _uniform_flows(matrix: np.ndarray, host: np.ndarray, groups: list[np.ndarray],
                   switch_id: np.ndarray) -> tuple[Flows, Flows, Flows]:
    """(phase I, phase II, phase III) flows when every node holds g members (no dense n x n temporaries)."""
    n, g, h = matrix.shape[0], groups[0].size, len(groups)
    gm = np.stack(groups)
    recv = _uniform_relays(groups, switch_id)  # (h, h, g)
    cols = matrix[:, gm.reshape(-1)].reshape(n, h, g)  # cols[a, B, k] = matrix[a, member k of B]
    intra_src = np.repeat(gm.reshape(-1), g)
    intra = (intra_src, np.repeat(gm, g, axis=0).reshape(-1), cols[gm.reshape(-1), host[gm.reshape(-1)]].reshape(-1))
    cols[np.arange(n), host, :] = 0.0  # a node's own rows go by phase I
    local = np.empty(n, dtype=np.int64)
    local[gm.reshape(-1)] = np.tile(np.arange(g), h)
    relay_pos = recv[host, :, local]  # (n, h): position of a's relay on each node B (-1 on a's own node)
    off = relay_pos >= 0
    senders = np.broadcast_to(np.arange(n)[:, None], off.shape)[off]
    relays = gm[np.broadcast_to(np.arange(h)[None, :], off.shape)[off], relay_pos[off]]
    inter = (senders, relays, cols.sum(axis=2)[off])
    onehot = (relay_pos[:, :, None] == np.arange(g)[None, None, :]).astype(float)
    fwd = np.einsum("abj,abk->bjk", onehot, cols)  # fwd[B, j, k]: relay j of B -> member k of B
    forward = (np.repeat(gm, g, axis=1).reshape(-1), np.tile(gm, (1, g)).reshape(-1), fwd.reshape(-1))
    return intra, inter, forward


def _general_flows(matrix: np.ndarray, host: np.ndarray, groups: list[np.ndarray],
                   switch_id: np.ndarray) -> tuple[Flows, Flows, Flows]:
    """The same flows for nodes holding different numbers of members (small groups: loops)."""
    n = matrix.shape[0]
    inter, forward = np.zeros((n, n)), np.zeros((n, n))
    for (a, b), positions in relay_table(groups, switch_id).items():
        for i, j in zip(groups[a].tolist(), positions, strict=True):
            relay = int(groups[b][j])
            inter[i, relay] += matrix[i, groups[b]].sum()
            forward[relay, groups[b]] += matrix[i, groups[b]]
    same = host[:, None] == host[None, :]

    def nonzero(m: np.ndarray) -> Flows:
        src, dst = np.nonzero(m)
        return src, dst, m[src, dst]

    return nonzero(np.where(same, matrix, 0.0)), nonzero(inter), nonzero(forward)


def num_slices(inter_bytes: np.ndarray, chunk_bytes: float, max_slices: int) -> int:
    """Slices of phase II: its largest message over the chunk size, at least 1, at most max_slices."""
    largest = float(inter_bytes.max(initial=0.0))
    return int(min(max_slices, max(1, math.ceil(largest / chunk_bytes)))) if chunk_bytes > 0 else 1


@ALL_TO_ALL.register("halo")
@split_exchange(node_gather=False)
def a2a_halo(matrix: np.ndarray, members: list[str], topo: Topology) -> list[Phase]:
    """Phase I intra-node, concurrent with phase II (striped over every member's own NIC), then phase III."""
    host, groups = host_groups(members, topo)
    if len(groups) == 1:
        return a2a_flat.__wrapped__(matrix, members, topo)
    build = _uniform_flows if len({gr.size for gr in groups}) == 1 else _general_flows
    intra, inter, forward = build(matrix, host, groups, _switch_ids(members, topo))
    params = algorithm_params(topo, "halo", HALO_SCHEMA)
    slices = num_slices(inter[2], float(params["chunk_bytes"]), int(params["max_slices"]))
    phases = [flows_phase(intra, "intra")]
    for s in range(slices):
        tag = "" if slices == 1 else f"[{s + 1}/{slices}]"
        after = (len(phases) - 2,) if s else ()
        phases.append(flows_phase(inter, f"inter{tag}", after=after, scale=1.0 / slices))
        phases.append(flows_phase(forward, f"redistribute{tag}", after=(len(phases) - 1,), scale=1.0 / slices))
    return phases
