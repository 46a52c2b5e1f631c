"""The vendor libraries' collectives, RCCL and NCCL: the all-to-all as ncclAllToAll runs it (grouped
point-to-point), and the ring all-reduce, reduce-scatter and all-gather at the library's copy efficiency.

Owns the `rccl` and `nccl` all-to-all models (registered in piper_sim.collectives.phases' registry), the
`rccl` and `nccl` ring models (registered as all-reduce, reduce-scatter and all-gather: the
`collectives.all_reduce` choice) and broadcast models (the same rings as chains from the root, registered in
broadcast.BROADCAST); algorithms.py imports this module. Their parameters are data: the
topology's `collectives.rccl` / `collectives.nccl` entry, one set per library and machine, each value's
source in the data file the entry names (traces/collectives/). Pure numpy; no simpy or torch.

What the libraries do (ROCm/rccl src/collectives.cc ncclAllToAll; NVIDIA/nccl the same): a group of one
ncclSend and one ncclRecv per rank, the rank itself included (RCCL calls this a fan-out: everyone sends
to and receives from everyone). The group is scheduled as point-to-point operations per peer, a rank's
peers taken in rounds (src/enqueue.cc, the p2p schedule); a bounded number of peers is in flight at once
(`peers_in_flight`: the p2p channels over the channels each peer uses, times the operations a channel
runs at once); each peer's bytes move in chunks (`net_chunk_MiB`: NCCL_P2P_NET_CHUNKSIZE across the
network, `intra_chunk_MiB`: NCCL_P2P_NVL_CHUNKSIZE over NVLink / xGMI), each chunk one operation of the
rank's proxy; each GPU sends through the NIC the library picks for it, which is the topology's route
(Frontier: the GCD's nearest NIC; DGX H100: PXN, the NIC of the destination's rail).

The model: one phase with every pair's flow (the max-min network takes them together, as the rounds of a
well-spread schedule load the same links on average: the peer schedule's fluid mean), which pays before its
flows
- `per_peer_us` for each of the rank's n - 1 peers, posted one after another (a send and a receive), and
- `per_chunk_us` for each chunk the busiest rank's proxy handles (its bytes to each peer over the
  chunk size, rounded up), and
- one path latency per round of peers: ceil((n - 1) / peers_in_flight) rounds.
Chunks to peers on the same node cost `intra_per_chunk_us` each where the machine sets it (NCCL's P2P
transport over NVLink is driven by the GPU kernel, not by the proxy thread), else `per_chunk_us`.
The library's copies reach a fraction of a link's rate (`intra_efficiency` on the node's links,
`net_efficiency` through the NIC: the protocol's payload per packet, e.g. NCCL's Simple protocol over
NVLink at 128-byte stores); a flow's bytes are charged as bytes / efficiency, so a link it saturates
carries the library's payload at efficiency x capacity (link bytes then count the wire overhead too).
Both default to 1 (no loss), which keeps the flows exactly flat's.

The topology's generic per-message overhead is not charged again (the phase's overhead_s is 0). A
collective alone on the network therefore takes what the rounds would: the same bytes on the same links,
plus the library's costs, which are what separate it from the ideal `flat`.

The ring models are the library's ring algorithm (NCCL and RCCL pick it for large buffers): the buffer split
over several rings (the library's channels): the machine's own rings through a node where it lists them
(`rings`, orders of a node's GPUs by local index: RCCL's for the MI250X node), else rings that leave each host
through different members, so every NIC carries one ring (ring_orders; the textbook `ring` is one ring in
member order, whose node crossings share one NIC each). Each ring's steps are `ring`'s (2(n - 1) steps of 1/n
of its share for an all-reduce, n - 1 for reduce-scatter or all-gather), each flow's bytes charged over the
same efficiencies (a ring step is a point-to-point copy with the library's protocol). So a ring whose busiest
hop is an NVLink or xGMI link shows busbw intra_efficiency x its capacity, one whose busiest hops are the NICs
net_efficiency x their sum per host. Not modelled: NVLink SHARP (NVLS, in-switch reduction on H100 NVSwitch
systems) and the tree algorithm; where the library would pick them the ring model is a lower bound on busbw.
"""

from __future__ import annotations

import functools
import math
import weakref
from dataclasses import replace
from typing import Any

import numpy as np

from piper_sim.collectives.broadcast import BROADCAST, chain_hops
from piper_sim.collectives.hierarchical import host_groups
from piper_sim.collectives.params import ParamSchema, algorithm_params, check_fraction, check_units, register_params
from piper_sim.collectives.phases import ALL_REDUCE, ALL_TO_ALL, Phase, matrix_phase, split_exchange
from piper_sim.collectives.sharded import ALL_GATHER, REDUCE_SCATTER, Sharded
from piper_sim.errors import ConfigError
from piper_sim.topology.graph import Topology
from piper_sim.topology.placement import gpus_by_host

VENDOR_SCHEMA: dict[str, object] = {
    "peers_in_flight": ...,
    "per_peer_us": ...,
    "per_chunk_us": ...,
    "net_chunk_MiB": 0.125,
    "intra_chunk_MiB": 0.5,
    "intra_per_chunk_us": None,
    "intra_efficiency": 1.0,
    "net_efficiency": 1.0,
    "rings": None,
    "compute_units": None,  # SMs (CUs) its kernels hold while they run; None: not modelled (sim/busy_units.py)
}
LIBRARIES = ("rccl", "nccl")


def vendor_params(topo: Topology, library: str) -> dict[str, Any]:
    """The library's parameters on this machine (SI keys), checked when read (_check_vendor)."""
    return algorithm_params(topo, library)


def _check_vendor(topo: Topology, p: dict, library: str) -> None:
    """Efficiencies in (0, 1]; rings through one node, each visiting every GPU of the machine's nodes once."""
    for key in ("intra_efficiency", "net_efficiency"):
        check_fraction(p[key], f"topology.collectives.{library}.{key}")
    check_units(p["compute_units"], f"topology.collectives.{library}.compute_units")
    per_node = max((len(gpus) for gpus in gpus_by_host(topo).values()), default=0)
    p["rings"] = _node_rings(p["rings"], f"topology.collectives.{library}.rings", per_node)


def _node_rings(value: object, where: str, per_node: int) -> tuple[tuple[int, ...], ...] | None:
    """The machine's rings through one node, each an order of the node's GPUs by local index ("0 1 5 4 ...")."""
    if value is None or (isinstance(value, tuple) and all(isinstance(r, tuple) for r in value)):
        return value
    allowed = f"a list of rings, each a permutation of the node's {per_node} local GPU indices written as '0 1 3 2 ...'"
    if not isinstance(value, list) or not value or not all(isinstance(r, str) for r in value):
        raise ConfigError(where, value, allowed)
    try:
        rings = tuple(tuple(int(x) for x in r.split()) for r in value)
    except ValueError:
        raise ConfigError(where, value, allowed) from None
    if any(sorted(r) != list(range(per_node)) for r in rings):
        raise ConfigError(where, value, allowed + " (all of one node, each index once)")
    return rings


for _library in LIBRARIES:
    register_params(
        _library,
        ParamSchema(
            VENDOR_SCHEMA,
            integers=("peers_in_flight",),
            positive=("net_chunk_MiB", "intra_chunk_MiB"),
            check=functools.partial(_check_vendor, library=_library),
        ),
    )


def _remote(src: np.ndarray, dst: np.ndarray, members: list[str], topo: Topology) -> np.ndarray:
    host = np.array([topo.host_of(m) for m in members])
    return host[src] != host[dst]


def vendor_costs(
    src: np.ndarray, dst: np.ndarray, sizes: np.ndarray, members: list[str], topo: Topology, library: str
) -> tuple[float, int]:
    """(host-side cost before the flows, rounds of peers) of the library's all-to-all of these flows."""
    p = vendor_params(topo, library)
    n = len(members)
    remote = _remote(src, dst, members, topo)
    chunk = np.where(remote, float(p["net_chunk_bytes"]), float(p["intra_chunk_bytes"]))
    intra_cost = p["per_chunk_s"] if p["intra_per_chunk_s"] is None else p["intra_per_chunk_s"]
    cost = np.ceil(sizes / chunk) * np.where(remote, float(p["per_chunk_s"]), float(intra_cost))
    busiest = float(np.bincount(src, weights=cost, minlength=n).max(initial=0.0))
    peers = n - 1
    rounds = math.ceil(peers / int(p["peers_in_flight"])) if peers else 0
    return peers * float(p["per_peer_s"]) + busiest, rounds


def charged_sizes(
    src: np.ndarray, dst: np.ndarray, sizes: np.ndarray, members: list[str], topo: Topology, library: str
) -> np.ndarray:
    """Each flow's bytes over the library's efficiency on its path (the same array when both are 1)."""
    p = vendor_params(topo, library)
    intra, net = float(p["intra_efficiency"]), float(p["net_efficiency"])
    if intra == 1.0 and net == 1.0:
        return sizes
    return sizes / np.where(_remote(src, dst, members, topo), net, intra)


def vendor_all_to_all(library: str):
    """The registered model of one library (the same decomposition; the parameters are the library's)."""

    def model(matrix: np.ndarray, members: list[str], topo: Topology) -> list[Phase]:
        flows = matrix_phase(matrix, "p2p")
        delay, rounds = vendor_costs(flows.src, flows.dst, flows.sizes, members, topo, library)
        sizes = charged_sizes(flows.src, flows.dst, flows.sizes, members, topo, library)
        return [replace(flows, sizes=sizes, overhead_s=0.0, delay_s=delay, messages=max(rounds, 1))]

    model.__name__ = model.__qualname__ = f"a2a_{library}"
    model.__doc__ = f"{library.upper()}'s all-to-all: grouped point-to-point per peer (module docstring)."
    return model


_HOST_GPUS: weakref.WeakKeyDictionary[Topology, dict[int, list[str]]] = weakref.WeakKeyDictionary()


def _host_gpus(topo: Topology) -> dict[int, list[str]]:
    """Each host's GPUs in the topology's order (placement.gpus_by_host, kept per topology)."""
    hit = _HOST_GPUS.get(topo)
    if hit is None:
        hit = _HOST_GPUS[topo] = gpus_by_host(topo)
    return hit


def ring_orders(
    members: list[str], topo: Topology, node_rings: tuple[tuple[int, ...], ...] | None = None
) -> list[np.ndarray]:
    """The library's rings (channels) over the members, as member-index orders (module docstring).

    Where the members are whole nodes and the machine lists its rings through a node (`node_rings`: the
    library's own, e.g. RCCL's for a Frontier node), each ring runs every node in that order and goes on to the
    next node. Else, when the members span several hosts with the same number g > 1 on each: one ring per
    member of a host; ring c enters host h at its member (c - h) mod g, visits the host's members in order and
    leaves from the one before, so the next host is entered on the same local index (the same rail) and every
    member's NIC carries one ring out. Else one ring in the members' order."""
    _, groups = host_groups(members, topo)
    by_local = _whole_nodes(members, topo, groups, len(node_rings[0])) if node_rings else None
    if by_local is not None:
        assert node_rings is not None  # by_local comes from them
        return [np.array([local[i] for local in by_local for i in ring]) for ring in node_rings]
    g = groups[0].size
    if len(groups) < 2 or g < 2 or any(group.size != g for group in groups):
        return [np.arange(len(members))]
    return [np.array([group[(c - h + i) % g] for h, group in enumerate(groups) for i in range(g)]) for c in range(g)]


def _whole_nodes(
    members: list[str], topo: Topology, groups: list[np.ndarray], node_size: int
) -> list[dict[int, int]] | None:
    """Per host group, local GPU index -> member index, when every group is a whole node of node_size GPUs."""
    hosts = _host_gpus(topo)
    out = []
    for group in groups:
        gpus = hosts[topo.host_of(members[group[0]])]
        if group.size != node_size or len(gpus) != node_size:
            return None
        out.append({gpus.index(members[m]): m for m in group})
    return out


def rings_phase(
    library: str,
    size_bytes: float,
    members: list[str],
    topo: Topology,
    *,
    per_ring: float,
    messages: int,
    name: str,
    chain: bool = False,
) -> list[Phase]:
    """One phase of one flow per pair of neighbours on the library's rings (chain: the chains that follow them from
    member 0, broadcast.chain_hops), each ring carrying per_ring x its share of the buffer over each of its hops (the
    rings' shares summed where they share a hop), bytes charged over the library's efficiency."""
    n = len(members)
    if n < 2:
        return []
    rings = ring_orders(members, topo, vendor_params(topo, library)["rings"])
    hops = [chain_hops(ring) if chain else (ring, np.roll(ring, -1)) for ring in rings]
    pairs, count = np.unique(np.concatenate([src * n + dst for src, dst in hops]), return_counts=True)
    src, dst = pairs // n, pairs % n
    sizes = count * (per_ring * size_bytes / len(rings))
    return [
        Phase(
            src=src, dst=dst, sizes=charged_sizes(src, dst, sizes, members, topo, library), messages=messages, name=name
        )
    ]


def vendor_ring(library: str, steps: int, name: str) -> Sharded:
    """The library's ring collective of `steps` passes (2: all-reduce; 1: reduce-scatter or all-gather): every
    ring carries its share of the buffer, each pass n - 1 steps of 1/n of it to the next member."""

    def model(size_bytes: float, members: list[str], topo: Topology) -> list[Phase]:
        n = len(members)
        return rings_phase(
            library, size_bytes, members, topo, per_ring=steps * (n - 1) / n, messages=steps * (n - 1), name=name
        )

    model.__name__ = model.__qualname__ = f"{name.replace('-', '_')}_{library}"
    model.__doc__ = f"{library.upper()}'s {name}: its rings at its copy efficiency (module docstring)."
    return model


def vendor_broadcast(library: str) -> Sharded:
    """The library's broadcast: its rings as chains from the root (member 0), each carrying its share of the whole
    buffer, pipelined (broadcast.py): n - 1 sequential messages fill the pipeline."""

    def model(size_bytes: float, members: list[str], topo: Topology) -> list[Phase]:
        return rings_phase(
            library, size_bytes, members, topo, per_ring=1.0, messages=len(members) - 1, name="chain", chain=True
        )

    model.__name__ = model.__qualname__ = f"broadcast_{library}"
    model.__doc__ = f"{library.upper()}'s broadcast: chains along its rings at its copy efficiency."
    return model


for _library in LIBRARIES:
    ALL_TO_ALL.register(_library)(split_exchange(node_gather=False)(vendor_all_to_all(_library)))
    for _registry, _steps, _name in (
        (ALL_REDUCE, 2, "ring"),
        (REDUCE_SCATTER, 1, "ring-reduce-scatter"),
        (ALL_GATHER, 1, "ring-all-gather"),
    ):
        _registry.register(_library)(vendor_ring(_library, _steps, _name))
    BROADCAST.register(_library)(vendor_broadcast(_library))
