"""Structured routing for machines made of identical compute nodes on a switch fabric.

Owns `NodeModel` (one compute node's devices, links and node-local routes, in local names such as
"g0", "nic1", "cpu"), the `SwitchFabric` protocol (where NICs attach, switch-level paths) and
`StructuredRouter`, which composes a GPU-to-GPU route as node-local part + switch path + node-local part
from cached tables. Nothing here calls networkx shortest paths per GPU pair: node-local routes are
solved once on the few devices of one node, switch paths come from the fabric's closed-form rules.
Must not import simpy or torch.

Global names: device `x` of host `h` is "n{h}.x"; GPU i is "n{h}.g{i}", NIC k is "n{h}.nic{k}".
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import networkx as nx

from piper_sim.topology.graph import Topology

WeightedPaths = tuple[tuple[float, tuple[int, ...]], ...]
FlowWeightedPaths = tuple[tuple[float, float, tuple[int, ...]], ...]  # (byte fraction per unit weight, weight, links)
SwitchPaths = tuple[tuple[float, tuple[str, ...]], ...]
MASK64 = (1 << 64) - 1


@dataclass(frozen=True, kw_only=True)
class LocalLink:
    """A full-duplex link inside one node, between two local device names."""

    a: str
    b: str
    bandwidth_bytes_per_s: float
    latency_s: float
    link_kind: str


@dataclass(frozen=True, kw_only=True)
class NodeModel:
    """One compute node: devices (local name, kind, local_index), links and its node-local routes.

    gpu_paths[(i, j)] and nic_paths[(i, k)] are local device names from GPU i to GPU j / NIC k, both
    ends included. gpu_nic[i] is the NIC GPU i uses. With `src_nic_follows_dst` a GPU sending to
    another node leaves through the NIC of the destination's local index (NCCL's PXN on rail fabrics).
    """

    devices: tuple[tuple[str, str, int], ...]
    links: tuple[LocalLink, ...]
    gpus_per_node: int
    nics_per_node: int
    gpu_paths: Mapping[tuple[int, int], tuple[str, ...]]
    nic_paths: Mapping[tuple[int, int], tuple[str, ...]]
    gpu_nic: tuple[int, ...]
    src_nic_follows_dst: bool = False

    def route_nics(self, i: int, j: int) -> tuple[int, int]:
        """(source NIC, destination NIC) for a flow from local GPU i to local GPU j on another node."""
        dst_nic = self.gpu_nic[j]
        return (dst_nic if self.src_nic_follows_dst else self.gpu_nic[i]), dst_nic


def make_node_model(
    devices: Iterable[tuple[str, str, int]],
    links: Iterable[LocalLink],
    *,
    transit_kinds: frozenset[str],
    src_nic_follows_dst: bool = False,
) -> NodeModel:
    """Solve the node-local routes once: fewest hops, then widest bottleneck, then device order.

    Only devices whose kind is in `transit_kinds` may be passed through (e.g. GCDs on Frontier, the
    NVSwitch on DGX); NICs and CPUs are endpoints only. Each GPU uses the NIC it reaches best.
    """
    devices, links = tuple(devices), tuple(links)
    order = {name: n for n, (name, _, _) in enumerate(devices)}
    kinds = {name: kind for name, kind, _ in devices}
    adjacency: dict[str, list[tuple[str, float]]] = {name: [] for name in order}
    for link in links:
        adjacency[link.a].append((link.b, link.bandwidth_bytes_per_s))
        adjacency[link.b].append((link.a, link.bandwidth_bytes_per_s))
    gpus = sorted((idx, name) for name, kind, idx in devices if kind == "gpu")
    nics = sorted((idx, name) for name, kind, idx in devices if kind == "nic")
    gpu_paths: dict[tuple[int, int], tuple[str, ...]] = {}
    nic_paths: dict[tuple[int, int], tuple[str, ...]] = {}
    nic_scores: dict[int, list[tuple[int, float, int]]] = {}
    for i, gpu in gpus:
        best = _best_paths(gpu, adjacency, order, kinds, transit_kinds)
        gpu_paths.update({(i, j): best[name][2] for j, name in gpus if j != i and name in best})
        for k, nic in nics:
            if nic in best:
                hops, neg_bw, path = best[nic]
                nic_paths[(i, k)] = path
                nic_scores.setdefault(i, []).append((hops, neg_bw, k))
    gpu_nic = tuple(min(nic_scores[i])[2] if i in nic_scores else -1 for i, _ in gpus)
    return NodeModel(
        devices=devices,
        links=links,
        gpus_per_node=len(gpus),
        nics_per_node=len(nics),
        gpu_paths=gpu_paths,
        nic_paths=nic_paths,
        gpu_nic=gpu_nic,
        src_nic_follows_dst=src_nic_follows_dst,
    )


def _best_paths(
    src: str,
    adjacency: dict[str, list[tuple[str, float]]],
    order: dict[str, int],
    kinds: dict[str, str],
    transit_kinds: frozenset[str],
) -> dict[str, tuple[int, float, tuple]]:
    """Label-setting search with key (hops, -bottleneck bandwidth, device order of the path)."""
    best: dict[str, tuple[int, float, tuple[str, ...]]] = {}
    heap: list[tuple[int, float, tuple[int, ...], tuple[str, ...]]] = [(0, -float("inf"), (order[src],), (src,))]
    while heap:
        hops, neg_bw, key, path = heapq.heappop(heap)
        node = path[-1]
        if node in best:
            continue
        best[node] = (hops, neg_bw, path)
        if node != src and kinds[node] not in transit_kinds:
            continue
        for nxt, bw in adjacency[node]:
            if nxt not in best:
                heapq.heappush(heap, (hops + 1, max(neg_bw, -bw), key + (order[nxt],), path + (nxt,)))
    return best


def add_node_instances(
    graph: nx.DiGraph, model: NodeModel, num_nodes: int, gpu_attrs: Mapping[int, Mapping[str, object]] | None = None
) -> list[str]:
    """Add `num_nodes` copies of the node to the graph; returns the GPU names in device order."""
    gpus: list[str] = []
    for h in range(num_nodes):
        extra = gpu_attrs.get(h, {}) if gpu_attrs else {}
        for name, kind, idx in model.devices:
            attrs = {"kind": kind, "host": h, "local_index": idx}
            if kind == "gpu":
                attrs.update(extra)
            graph.add_node(f"n{h}.{name}", **attrs)
        for link in model.links:
            a, b = f"n{h}.{link.a}", f"n{h}.{link.b}"
            data = {
                "bandwidth_bytes_per_s": link.bandwidth_bytes_per_s,
                "latency_s": link.latency_s,
                "link_kind": link.link_kind,
            }
            graph.add_edges_from(((a, b), (b, a)), **data)
        gpus.extend(f"n{h}.g{i}" for i in range(model.gpus_per_node))
    return gpus


class SwitchFabric(Protocol):
    """The switch layer of a machine: where NIC k of host h attaches, and switch-level paths."""

    def nic_switch(self, host: int, nic_index: int) -> str: ...

    def switch_paths(self, src: str, dst: str, flow_key: int) -> SwitchPaths:
        """((fraction, switch names from src to dst inclusive), ...), fractions summing to 1."""
        ...


def mix64(*values: int) -> int:
    """A deterministic 64-bit hash of integers (splitmix64 steps); not Python's salted hash()."""
    state = 0x9E3779B97F4A7C15
    for value in values:
        state = (state ^ (value & MASK64)) & MASK64
        state = (state + 0x9E3779B97F4A7C15) & MASK64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        state = z ^ (z >> 31)
    return state


@dataclass(eq=False)
class StructuredRouter:
    """Topology.router for node-model machines: node part + fabric switch path + node part, cached.

    Non-GPU endpoints fall back to the topology's default shortest path.
    """

    node: NodeModel
    fabric: SwitchFabric
    seed: int = 0
    _up: dict[tuple[int, int, int], tuple[int, ...]] = field(default_factory=dict, repr=False)
    _down: dict[tuple[int, int, int], tuple[int, ...]] = field(default_factory=dict, repr=False)
    _switch_ids: dict[tuple[str, ...], tuple[int, ...]] = field(default_factory=dict, repr=False)

    def __call__(self, topo: Topology, src: str, dst: str) -> WeightedPaths:
        return tuple((frac * weight, links) for frac, weight, links in self.weighted(topo, src, dst))

    def weighted(self, topo: Topology, src: str, dst: str) -> FlowWeightedPaths:
        """((byte fraction per unit of weight, flow weight, link ids), ...) (Topology.weighted_paths)."""
        a, b = topo.graph.nodes[src], topo.graph.nodes[dst]
        if a.get("kind") != "gpu" or b.get("kind") != "gpu":
            return ((1.0, 1.0, topo._shortest_links(src, dst)),)
        hs, i, hd, j = a["host"], a["local_index"], b["host"], b["local_index"]
        index = topo.link_index
        if hs == hd:
            return ((1.0, 1.0, _chain_ids(index, [f"n{hs}.{x}" for x in self.node.gpu_paths[(i, j)]])),)
        ks, kd = self.node.route_nics(i, j)
        up = self._up_ids(index, hs, i, ks)
        down = self._down_ids(index, hd, kd, j)
        ends, key = (self.fabric.nic_switch(hs, ks), self.fabric.nic_switch(hd, kd)), mix64(self.seed, hs, i, hd, j)
        weighted = getattr(self.fabric, "weighted_switch_paths", None)
        paths = (
            weighted(*ends, key)
            if weighted
            else tuple((f, 1.0, seq) for f, seq in self.fabric.switch_paths(*ends, key))
        )
        return tuple((frac, weight, up + self._switch_chain(index, seq) + down) for frac, weight, seq in paths)

    def _up_ids(self, index: dict, host: int, i: int, k: int) -> tuple[int, ...]:
        key = (host, i, k)
        if key not in self._up:
            names = [f"n{host}.{x}" for x in self.node.nic_paths[(i, k)]]
            self._up[key] = _chain_ids(index, names + [self.fabric.nic_switch(host, k)])
        return self._up[key]

    def _down_ids(self, index: dict, host: int, k: int, j: int) -> tuple[int, ...]:
        key = (host, k, j)
        if key not in self._down:
            names = [f"n{host}.{x}" for x in reversed(self.node.nic_paths[(j, k)])]
            self._down[key] = _chain_ids(index, [self.fabric.nic_switch(host, k)] + names)
        return self._down[key]

    def _switch_chain(self, index: dict, seq: tuple[str, ...]) -> tuple[int, ...]:
        ids = self._switch_ids.get(seq)
        if ids is None:
            ids = self._switch_ids[seq] = _chain_ids(index, seq)
        return ids


def _chain_ids(index: Mapping[tuple[str, str], int], names: Iterable[str]) -> tuple[int, ...]:
    names = list(names)
    return tuple(index[(u, v)] for u, v in zip(names, names[1:], strict=False))


def dedupe(seq: Iterable[str]) -> tuple[str, ...]:
    """Drop consecutive repeats (a path that enters and leaves the same switch stays there)."""
    out: list[str] = []
    for name in seq:
        if not out or out[-1] != name:
            out.append(name)
    return tuple(out)
