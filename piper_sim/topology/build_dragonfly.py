"""The dragonfly switch fabric (HPE Slingshot style) and the generic "dragonfly" builder.

Owns DragonflySpec/DragonflyFabric (switches, local and global links, NIC attachment, minimal /
Valiant / adaptive switch paths) and the shared parameter reading used by the Frontier and LUMI
builders. Must not import simpy or torch.

Structure (Kim et al., "Technology-Driven, Highly-Scalable Dragonfly Topology", ISCA 2008; Slingshot:
De Sensi et al., SC 2020): groups of `switches_per_group` switches joined all-to-all by local links;
`global_links_per_group_pair` global links between every pair of groups. Switch s of group g is
"g{g}.sw{s}". Host h sits in group h // (switches_per_group * nodes_per_switch) on home switch
(h mod nodes_per_group) // nodes_per_switch. With nic_switch_spread, NIC k of a host on home switch s
goes to switch base + (s + k) mod K of its block of K = nics_per_node switches (an HPE Cray EX
chassis: 16 nodes, 4 switches, each node's 4 NICs on 4 different switches, as LUMI documents);
otherwise all NICs of a node are on its home switch. Global link l between groups g and p leaves
switch (r * L + l) mod S of group g, r being p's rank among g's peers: links spread evenly, deterministic.

Routing (switch-to-switch hops): "minimal" = local, global, local (<= 3), split equally over the L
global links of the group pair; "valiant" = through an intermediate group (<= 5; inside one group,
through an intermediate switch), chosen per GPU pair by a seeded hash; "adaptive" = a fixed split,
adaptive_minimal_fraction on the minimal paths and the rest on the Valiant path (a fluid stand-in for
Slingshot's per-packet adaptive routing). With fewer than 3 groups Valiant falls back to minimal.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import networkx as nx

from piper_sim.errors import ConfigError
from piper_sim.topology.builders import num_nodes_for, register_builder
from piper_sim.topology.graph import NetworkParams, Topology
from piper_sim.topology.structured import (
    LocalLink,
    NodeModel,
    StructuredRouter,
    SwitchPaths,
    add_node_instances,
    dedupe,
    make_node_model,
)
from piper_sim.units import positive_int, read_params, si_key

ROUTING_MODES = ("minimal", "valiant", "adaptive")
WHERE = "topology.params."

# Defaults are Slingshot-11 numbers (200 Gb/s ports = 25 GB/s; see topologies/frontier.yaml sources).
FABRIC_SCHEMA: dict[str, object] = {
    "num_nodes": None, "num_groups": None, "max_nodes": None,
    "switches_per_group": 32, "nodes_per_switch": 4, "nic_switch_spread": True,
    "local_bandwidth_GBps": 25.0, "local_latency_us": 0.1,
    "global_links_per_group_pair": 4, "global_bandwidth_GBps": 25.0, "global_latency_us": 0.5,
    "nic_bandwidth_GBps": 25.0, "nic_latency_us": 0.1, "switch_latency_us": 0.35,
    "routing": "minimal", "adaptive_minimal_fraction": 0.5, "seed": 0, "message_overhead_us": 2.0,
}


@dataclass(frozen=True, kw_only=True)
class DragonflySpec:
    num_groups: int
    switches_per_group: int
    nodes_per_switch: int
    nics_per_node: int
    nic_switch_spread: bool
    global_links_per_group_pair: int
    routing: str = "minimal"
    adaptive_minimal_fraction: float = 0.5

    @property
    def nodes_per_group(self) -> int:
        return self.switches_per_group * self.nodes_per_switch


class DragonflyFabric:
    """Switch layer of a dragonfly; implements structured.SwitchFabric."""

    def __init__(self, spec: DragonflySpec) -> None:
        self.spec = spec
        self._where = {self.switch_name(g, s): (g, s)
                       for g in range(spec.num_groups) for s in range(spec.switches_per_group)}
        self._minimal_cache: dict[tuple[str, str], SwitchPaths] = {}

    @staticmethod
    def switch_name(group: int, switch_index: int) -> str:
        return f"g{group}.sw{switch_index}"

    def locate(self, switch: str) -> tuple[int, int]:
        """(group, switch index) of a switch name."""
        return self._where[switch]

    def home(self, host: int) -> tuple[int, int]:
        group, local = divmod(host, self.spec.nodes_per_group)
        return group, local // self.spec.nodes_per_switch

    def nic_switch(self, host: int, nic_index: int) -> str:
        group, s = self.home(host)
        if self.spec.nic_switch_spread:
            size, k = self.spec.switches_per_group, self.spec.nics_per_node
            s = s - s % k + (s + nic_index) % k if k <= size and size % k == 0 else (s + nic_index) % size
        return self.switch_name(group, s)

    def global_endpoint(self, group: int, peer: int, link: int) -> int:
        """Switch index in `group` where global link `link` to group `peer` lands."""
        rank = peer if peer < group else peer - 1
        return (rank * self.spec.global_links_per_group_pair + link) % self.spec.switches_per_group

    def gpu_attrs(self, num_nodes: int) -> dict[int, dict[str, object]]:
        """Locality attributes for each host's GPUs: dragonfly group and home switch."""
        return {h: {"group": self.home(h)[0], "switch": self.switch_name(*self.home(h))} for h in range(num_nodes)}

    # ---- graph -------------------------------------------------------------------------------
    def add_switches(self, graph: nx.DiGraph, p: dict) -> None:
        """Switches, all-to-all local links inside each group, global links between groups."""
        spec, sw = self.spec, self.switch_name
        local = {"bandwidth_bytes_per_s": p["local_bandwidth_bytes_per_s"], "link_kind": "local",
                 "latency_s": p["local_latency_s"] + p["switch_latency_s"]}
        for name, (g, s) in self._where.items():
            graph.add_node(name, kind="switch", group=g, switch_index=s)
        for g in range(spec.num_groups):
            for s in range(spec.switches_per_group):
                for t in range(s + 1, spec.switches_per_group):
                    graph.add_edges_from(((sw(g, s), sw(g, t)), (sw(g, t), sw(g, s))), **local)
        bandwidth = p["global_bandwidth_bytes_per_s"]
        latency = p["global_latency_s"] + p["switch_latency_s"]
        for g in range(spec.num_groups):
            for peer in range(g + 1, spec.num_groups):
                for link in range(spec.global_links_per_group_pair):
                    a = sw(g, self.global_endpoint(g, peer, link))
                    b = sw(peer, self.global_endpoint(peer, g, link))
                    for u, v in ((a, b), (b, a)):
                        if graph.has_edge(u, v):  # more links per pair than switches: parallel cables
                            graph.edges[u, v]["bandwidth_bytes_per_s"] += bandwidth
                            graph.edges[u, v]["num_links"] += 1
                        else:
                            graph.add_edge(u, v, bandwidth_bytes_per_s=bandwidth, latency_s=latency,
                                           link_kind="global", num_links=1)

    # ---- routing -----------------------------------------------------------------------------
    def switch_paths(self, src: str, dst: str, flow_key: int) -> SwitchPaths:
        if src == dst:
            return ((1.0, (src,)),)
        mode = self.spec.routing
        if mode == "minimal":
            return self.minimal_paths(src, dst)
        detour = self.valiant_path(src, dst, flow_key)
        if detour is None:
            return self.minimal_paths(src, dst)
        if mode == "valiant":
            return ((1.0, detour),)
        frac = self.spec.adaptive_minimal_fraction
        if frac >= 1.0:
            return self.minimal_paths(src, dst)
        if frac <= 0.0:
            return ((1.0, detour),)
        return tuple((frac * w, seq) for w, seq in self.minimal_paths(src, dst)) + ((1.0 - frac, detour),)

    def minimal_paths(self, src: str, dst: str) -> SwitchPaths:
        """Local-global-local over each global link of the group pair, equal split (cached)."""
        cached = self._minimal_cache.get((src, dst))
        if cached is not None:
            return cached
        (g1, s1), (g2, s2) = self._where[src], self._where[dst]
        if g1 == g2:
            paths: SwitchPaths = ((1.0, (src, dst)),)
        else:
            links = self.spec.global_links_per_group_pair
            counts = Counter(self._via(g1, s1, g2, s2, link, link) for link in range(links))
            paths = tuple((n / links, seq) for seq, n in sorted(counts.items()))
        self._minimal_cache[(src, dst)] = paths
        return paths

    def valiant_path(self, src: str, dst: str, flow_key: int) -> tuple[str, ...] | None:
        """Path through a hashed intermediate group (or switch, inside one group); None if none exists."""
        spec, sw = self.spec, self.switch_name
        (g1, s1), (g2, s2) = self._where[src], self._where[dst]
        if g1 == g2:
            if spec.switches_per_group < 3:
                return None
            mid = _nth_excluding(flow_key % (spec.switches_per_group - 2), {s1, s2})
            return (src, sw(g1, mid), dst)
        if spec.num_groups < 3:
            return None
        mid_group = _nth_excluding(flow_key % (spec.num_groups - 2), {g1, g2})
        links = spec.global_links_per_group_pair
        first, second = (flow_key >> 20) % links, (flow_key >> 40) % links
        a1, b1 = self.global_endpoint(g1, mid_group, first), self.global_endpoint(mid_group, g1, first)
        a2, b2 = self.global_endpoint(mid_group, g2, second), self.global_endpoint(g2, mid_group, second)
        return dedupe((src, sw(g1, a1), sw(mid_group, b1), sw(mid_group, a2), sw(g2, b2), dst))

    def _via(self, g1: int, s1: int, g2: int, s2: int, out_link: int, in_link: int) -> tuple[str, ...]:
        sw = self.switch_name
        a, b = self.global_endpoint(g1, g2, out_link), self.global_endpoint(g2, g1, in_link)
        return dedupe((sw(g1, s1), sw(g1, a), sw(g2, b), sw(g2, s2)))


def _nth_excluding(n: int, excluded: set[int]) -> int:
    """The n-th non-negative integer not in `excluded`."""
    for e in sorted(excluded):
        if n >= e:
            n += 1
    return n


# ---- parameters --------------------------------------------------------------------------------
def positive_bandwidths(raw: dict, p: dict, schema: dict, where: str = WHERE) -> None:
    """Bandwidth keys (unit GBps/Gbps/...) must be > 0 when given; read_params already rejects < 0."""
    for key in schema:
        si = si_key(key)
        if si.endswith("bytes_per_s") and p.get(si) is not None and not p[si] > 0:
            raise ConfigError(f"{where}{key}", raw.get(key, schema[key]), "a positive number")


def read_dragonfly_spec(p: dict, num_nodes: int, nics_per_node: int, where: str = WHERE) -> DragonflySpec:
    """Check the fabric parameters (already unit-converted) and size the groups for `num_nodes`."""
    switches = positive_int(f"{where}switches_per_group", p["switches_per_group"])
    per_switch = positive_int(f"{where}nodes_per_switch", p["nodes_per_switch"])
    links = positive_int(f"{where}global_links_per_group_pair", p["global_links_per_group_pair"])
    if not isinstance(p["nic_switch_spread"], bool):
        raise ConfigError(f"{where}nic_switch_spread", p["nic_switch_spread"], "true or false")
    if p["routing"] not in ROUTING_MODES:
        raise ConfigError(f"{where}routing", p["routing"], f"one of {', '.join(ROUTING_MODES)}")
    frac = p["adaptive_minimal_fraction"]
    if isinstance(frac, bool) or not isinstance(frac, int | float) or not 0.0 <= frac <= 1.0:
        raise ConfigError(f"{where}adaptive_minimal_fraction", frac, "a number in [0, 1]")
    if isinstance(p["seed"], bool) or not isinstance(p["seed"], int):
        raise ConfigError(f"{where}seed", p["seed"], "an integer")
    if p["max_nodes"] is not None and num_nodes > positive_int(f"{where}max_nodes", p["max_nodes"]):
        raise ConfigError("topology", f"{num_nodes} nodes", f"at most max_nodes = {p['max_nodes']} nodes")
    needed = math.ceil(num_nodes / (switches * per_switch))
    groups = needed
    if p["num_groups"] is not None:
        groups = positive_int(f"{where}num_groups", p["num_groups"])
        if groups < needed:
            raise ConfigError(f"{where}num_groups", groups, f"at least {needed} groups for {num_nodes} nodes")
    return DragonflySpec(num_groups=groups, switches_per_group=switches, nodes_per_switch=per_switch,
                         nics_per_node=nics_per_node, nic_switch_spread=p["nic_switch_spread"],
                         global_links_per_group_pair=links, routing=p["routing"],
                         adaptive_minimal_fraction=float(frac))


def build_on_dragonfly(name: str, node: NodeModel, p: dict, num_gpus: int | None,
                       where: str = WHERE) -> Topology:
    """Hosts of `node`, sized by num_nodes or the GPU count, on a dragonfly fabric; structured routing."""
    num_nodes = num_nodes_for(where, num_gpus, node.gpus_per_node, p["num_nodes"])
    fabric = DragonflyFabric(read_dragonfly_spec(p, num_nodes, node.nics_per_node, where))
    graph = nx.DiGraph()
    gpus = add_node_instances(graph, node, num_nodes, fabric.gpu_attrs(num_nodes))
    fabric.add_switches(graph, p)
    nic = {"bandwidth_bytes_per_s": p["nic_bandwidth_bytes_per_s"], "link_kind": "nic",
           "latency_s": p["nic_latency_s"] + p["switch_latency_s"]}
    for h in range(num_nodes):
        for k in range(node.nics_per_node):
            a, b = f"n{h}.nic{k}", fabric.nic_switch(h, k)
            graph.add_edges_from(((a, b), (b, a)), **nic)
    return Topology(name=name, graph=graph, gpus=gpus, router=StructuredRouter(node=node, fabric=fabric,
                                                                               seed=p["seed"]),
                    params=NetworkParams(message_overhead_s=p["message_overhead_s"]))


# ---- generic builder ---------------------------------------------------------------------------
GENERIC_SCHEMA: dict[str, object] = {
    **FABRIC_SCHEMA, "gpus_per_node": 4, "nics_per_node": None,
    "intra_bandwidth_GBps": 100.0, "intra_latency_us": 1.0,
    "gpu_nic_bandwidth_GBps": 50.0, "gpu_nic_latency_us": 0.0,
}


def simple_node(gpus_per_node: int, nics_per_node: int, p: dict) -> NodeModel:
    """GPUs on a non-blocking node switch ("intra"); GPU i wired to NIC i * nics // gpus ("gpu_nic")."""
    devices = [("sw", "switch", 0)] + [(f"g{i}", "gpu", i) for i in range(gpus_per_node)]
    devices += [(f"nic{k}", "nic", k) for k in range(nics_per_node)]
    links = [LocalLink(a=f"g{i}", b="sw", bandwidth_bytes_per_s=p["intra_bandwidth_bytes_per_s"],
                       latency_s=p["intra_latency_s"] / 2, link_kind="intra") for i in range(gpus_per_node)]
    links += [LocalLink(a=f"g{i}", b=f"nic{i * nics_per_node // gpus_per_node}",
                        bandwidth_bytes_per_s=p["gpu_nic_bandwidth_bytes_per_s"],
                        latency_s=p["gpu_nic_latency_s"], link_kind="gpu_nic") for i in range(gpus_per_node)]
    return make_node_model(devices, links, transit_kinds=frozenset({"switch"}))


@register_builder("dragonfly")
def build_dragonfly(raw: dict, num_gpus: int | None) -> Topology:
    """Generic dragonfly: simple nodes (node switch, NICs shared evenly by GPUs) on a dragonfly fabric."""
    p = read_params(raw, GENERIC_SCHEMA, WHERE)
    positive_bandwidths(raw, p, GENERIC_SCHEMA)
    gpus_per_node = positive_int(f"{WHERE}gpus_per_node", p["gpus_per_node"])
    nics = positive_int(f"{WHERE}nics_per_node", gpus_per_node if p["nics_per_node"] is None else p["nics_per_node"])
    if nics > gpus_per_node:
        raise ConfigError(f"{WHERE}nics_per_node", nics, f"at most gpus_per_node = {gpus_per_node}")
    return build_on_dragonfly("dragonfly", simple_node(gpus_per_node, nics, p), p, num_gpus)
