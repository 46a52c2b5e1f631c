"""Piper's HALO all-to-all (Dash and Wang 2026, arXiv 2605.05049), as designed: three phases, every NIC busy.

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
(tests/collectives/test_collectives.py checks it on uneven matrices).

The split sizes go first by HALO itself (split_exchange without the node gather): a relay learns the
sizes of what it forwards from the counts it relays, so no intra-node gather of the split matrix is
needed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from piper_sim.collectives.hierarchical import host_groups
from piper_sim.collectives.params import ParamSchema, algorithm_params, register_params
from piper_sim.collectives.phases import ALL_TO_ALL, Phase, a2a_flat, data_phases, matrix_phase, split_exchange
from piper_sim.topology.graph import Topology
from piper_sim.topology.structured import StructuredRouter

HALO_SCHEMA: dict[str, float] = {"chunk_MiB": 1.0, "max_slices": 16}
register_params("halo", ParamSchema(HALO_SCHEMA, positive=("chunk_MiB",)))


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
            attached = sorted(
                v
                for v in graph.successors(name)
                if graph.nodes[v].get("kind") == "switch" and "host" not in graph.nodes[v]
            )
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


def _uniform_flows(
    matrix: np.ndarray, host: np.ndarray, groups: list[np.ndarray], recv: np.ndarray
) -> tuple[Flows, Flows, Flows]:
    """(phase I, phase II, phase III) flows when every node holds g members (no dense n x n temporaries);
    recv: `_uniform_relays`."""
    n, g, h = matrix.shape[0], groups[0].size, len(groups)
    gm = np.stack(groups)
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


def _general_flows(
    matrix: np.ndarray, host: np.ndarray, groups: list[np.ndarray], table: dict[tuple[int, int], tuple[int, ...]]
) -> tuple[Flows, Flows, Flows]:
    """The same flows for nodes holding different numbers of members (small groups: loops); table:
    `relay_table`."""
    n = matrix.shape[0]
    inter, forward = np.zeros((n, n)), np.zeros((n, n))
    for (a, b), positions in table.items():
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


Relays = tuple[np.ndarray, np.ndarray | dict[tuple[int, int], tuple[int, ...]]]


def _host_groups(host: np.ndarray) -> list[np.ndarray]:
    return [np.flatnonzero(host == h) for h in range(int(host.max(initial=-1)) + 1)]


def halo_relays(host: np.ndarray, switch_id: np.ndarray) -> Relays:
    """(relay[m, B]: the member of node B that receives m's phase II message, -1 for m's own node; the
    relay choice in the form the flow builder takes: `_uniform_relays` or `relay_table`), for members on
    hosts `host` with NIC switches `switch_id` (as `halo_plan` takes them). It depends on no matrix: a
    caller planning many matrices over the same members computes it once."""
    groups = _host_groups(host)
    n, h = host.size, len(groups)
    relay = np.full((n, h), -1, dtype=np.int64)
    if len({gr.size for gr in groups}) == 1:
        recv = _uniform_relays(groups, switch_id)  # (h, h, g)
        local = np.empty(n, dtype=np.int64)
        local[np.concatenate(groups)] = np.tile(np.arange(groups[0].size), h)
        pos = recv[host, :, local]
        off = pos >= 0
        relay[off] = np.stack(groups)[np.broadcast_to(np.arange(h)[None, :], off.shape)[off], pos[off]]
        return relay, recv
    table = relay_table(groups, switch_id)
    for (a, b), positions in table.items():
        relay[groups[a], b] = groups[b][list(positions)]
    return relay, table


Key = tuple[int, int]  # (source member, final destination member): one chunk of the matrix


@dataclass(frozen=True, eq=False)
class HaloPlan:
    """HALO's data phases for one matrix, with what each flow carries.

    `phases` is exactly what the registered algorithm returns without its split-size exchange; `kind[p]`
    is phase p's role ("direct" on one node; else "intra", "inter" or "redistribute") and `slice[p]` its
    slice (0 for "direct" and "intra"). A flow of a sliced phase carries slice s of each chunk it names
    (`slice_rows`). The torch backend runs the plan as it is (torch_backend/a2a_algorithms.py)."""

    phases: list[Phase]
    kind: list[str]
    slice: list[int]
    slices: int
    host: np.ndarray  # host group of every member (0, 1, ... in order of first appearance)
    relay: np.ndarray  # relay[m, B]: the member of node B that receives m's phase II message (-1: m is on B)

    def carries(self, p: int, src: int, dst: int) -> list[Key]:
        """The chunks (source, final destination) flow src -> dst of phase p carries, in order."""
        kind = self.kind[p]
        if kind in ("direct", "intra"):
            return [(src, dst)]
        if kind == "inter":  # every chunk src holds for dst's node, the relay's own included
            return [(src, int(k)) for k in np.flatnonzero(self.host == self.host[dst])]
        b = self.host[dst]  # redistribute: every chunk for dst that src relayed
        return [(int(a), dst) for a in np.flatnonzero((self.relay[:, b] == src) & (self.host != b))]


def slice_rows(rows: int, s: int, slices: int) -> tuple[int, int]:
    """Rows [start, end) of a chunk of `rows` rows that its slice s of `slices` carries (1/slices of it, the
    rows being whole: parts differ by at most one row)."""
    return rows * s // slices, rows * (s + 1) // slices


def halo_plan(
    matrix: np.ndarray,
    host: np.ndarray,
    switch_id: np.ndarray,
    chunk_bytes: float,
    max_slices: int,
    slices: int | None = None,
    relays: Relays | None = None,
) -> HaloPlan:
    """HALO's data phases for a bytes matrix over members on hosts `host` (0, 1, ... in order of first
    appearance) whose NICs sit on switches `switch_id` (equal ids: the same switch; each member with none
    known its own id). slices: phase II's slice count, None to derive it from the matrix (`num_slices`);
    relays: `halo_relays(host, switch_id)` when the caller has it."""
    groups = _host_groups(host)
    if len(groups) <= 1:
        relay = np.full((host.size, len(groups)), -1, dtype=np.int64)
        return HaloPlan([matrix_phase(matrix, "direct")], ["direct"], [0], 1, host, relay)
    relay, choice = relays if relays is not None else halo_relays(host, switch_id)
    if isinstance(choice, np.ndarray):
        intra, inter, forward = _uniform_flows(matrix, host, groups, choice)
    else:
        intra, inter, forward = _general_flows(matrix, host, groups, choice)
    if slices is None:
        slices = num_slices(inter[2], chunk_bytes, max_slices)
    phases, kind, index = [flows_phase(intra, "intra")], ["intra"], [0]
    for s in range(slices):
        tag = "" if slices == 1 else f"[{s + 1}/{slices}]"
        after = (len(phases) - 2,) if s else ()
        phases.append(flows_phase(inter, f"inter{tag}", after=after, scale=1.0 / slices))
        phases.append(flows_phase(forward, f"redistribute{tag}", after=(len(phases) - 1,), scale=1.0 / slices))
        kind += ["inter", "redistribute"]
        index += [s, s]
    return HaloPlan(phases, kind, index, slices, host, relay)


@dataclass(frozen=True)
class HaloMachine:
    """What HALO needs to know of the machine beyond each member's host, keyed by global rank: the switch of
    each rank's NIC (ranks with none known left out) and the pipelining parameters (`HALO_SCHEMA`)."""

    switch_of: dict[int, int] = field(default_factory=dict)
    chunk_bytes: float = float(HALO_SCHEMA["chunk_MiB"]) * 2.0**20
    max_slices: int = int(HALO_SCHEMA["max_slices"])

    def switch_ids(self, ranks: list[int] | tuple[int, ...]) -> np.ndarray:
        """Switch ids of a call's members, as `_switch_ids` numbers them (unknown: -1 - member index)."""
        return np.array([self.switch_of.get(r, -1 - m) for m, r in enumerate(ranks)], dtype=np.int64)


def halo_machine(gpus: list[str], topo: Topology) -> HaloMachine:
    """The HaloMachine of ranks placed on gpus (rank r on gpus[r]), for the torch backend."""
    params = algorithm_params(topo, "halo")
    ids = _switch_ids(gpus, topo)
    return HaloMachine(
        {r: int(i) for r, i in enumerate(ids.tolist()) if i >= 0},
        float(params["chunk_bytes"]),
        int(params["max_slices"]),
    )


@ALL_TO_ALL.register("halo")
@split_exchange(node_gather=False)
def a2a_halo(matrix: np.ndarray, members: list[str], topo: Topology) -> list[Phase]:
    """Phase I intra-node, concurrent with phase II (striped over every member's own NIC), then phase III."""
    host, groups = host_groups(members, topo)
    if len(groups) == 1:
        return data_phases(a2a_flat, matrix, members, topo)
    params = algorithm_params(topo, "halo")
    return halo_plan(
        matrix, host, _switch_ids(members, topo), float(params["chunk_bytes"]), int(params["max_slices"])
    ).phases
