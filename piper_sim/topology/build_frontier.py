"""Frontier and LUMI: the MI250X node (exact xGMI graph) on a Slingshot-11 dragonfly.

Owns the Frontier node model and the "frontier" and "lumi" builders. Must not import simpy or torch.

Node (OLCF Frontier User Guide, "Frontier Compute Nodes" and its node diagram):
8 GCDs "g0".."g7" (4 MI250X). xGMI links are 50 GB/s per direction each; the two GCDs of one MI250X,
pairs (0,1) (2,3) (4,5) (6,7), share 4 links (200 GB/s); pairs 0-6 and 2-4 have 2 links (100 GB/s);
pairs 0-2, 1-3, 1-5, 3-7, 4-6, 5-7 have 1 link (50 GB/s); other pairs have no direct link and route
over 2 hops through the GCD that gives the widest bottleneck (ties: lower GCD index). A CPU "cpu" is
linked to every GCD at 36 GB/s per direction ("cpu"; never a transit hop for GPU traffic). Four
Slingshot-11 NICs "nic0".."nic3", 25 GB/s per direction, hang off GCDs 1, 3, 5, 7 ("gpu_nic", PCIe Gen4
ESM, 50 GB/s: derived, not a bottleneck); each GCD uses the NIC it reaches best, so GCD 0 leaves through
GCD 1's NIC (the two GCDs of an MI250X share its NIC; LUMI docs: "one interface directly connected to
each GPU").

Network: dragonfly of piper_sim.topology.build_dragonfly with Frontier's numbers (one group per
cabinet: 128 nodes on 32 Rosetta switches, 4 nodes per switch, 200 Gb/s ports; about 4 global links
per group pair; 77 cabinets, 9,856 nodes). LUMI-G: same node and NIC design and group size; 2,560 nodes
in 20 groups (LUMI docs); global links per group pair derived from the documented 276 TB/s LUMI-G global
bandwidth (see topologies/lumi.yaml).
"""

from __future__ import annotations

from piper_sim.errors import ConfigError
from piper_sim.topology.build_dragonfly import FABRIC_SCHEMA, WHERE, build_on_dragonfly, positive_bandwidths
from piper_sim.topology.builders import register_builder
from piper_sim.topology.graph import Topology
from piper_sim.topology.structured import LocalLink, NodeModel, make_node_model
from piper_sim.units import read_params

NUM_GCDS = 8
# Number of 50 GB/s xGMI links between GCD pairs (OLCF Frontier User Guide node diagram).
FRONTIER_XGMI_LINKS: dict[tuple[int, int], int] = {
    (0, 1): 4,
    (2, 3): 4,
    (4, 5): 4,
    (6, 7): 4,
    (0, 6): 2,
    (2, 4): 2,
    (0, 2): 1,
    (1, 3): 1,
    (1, 5): 1,
    (3, 7): 1,
    (4, 6): 1,
    (5, 7): 1,
}
FRONTIER_NIC_GCDS = (1, 3, 5, 7)

NODE_SCHEMA: dict[str, object] = {
    "xgmi_link_bandwidth_GBps": 50.0,
    "xgmi_latency_us": 0.5,
    "cpu_bandwidth_GBps": 36.0,
    "cpu_latency_us": 1.0,
    "nic_gcds": list(FRONTIER_NIC_GCDS),
    "gpu_nic_bandwidth_GBps": 50.0,
    "gpu_nic_latency_us": 0.5,
}
FRONTIER_SCHEMA: dict[str, object] = {
    **FABRIC_SCHEMA,
    **NODE_SCHEMA,
    "max_nodes": 9856,
    "global_links_per_group_pair": 4,
}
LUMI_SCHEMA: dict[str, object] = {**FABRIC_SCHEMA, **NODE_SCHEMA, "max_nodes": 2560, "global_links_per_group_pair": 29}


def read_nic_gcds(value: object, where: str = WHERE) -> tuple[int, ...]:
    """The GCD each NIC is attached to: distinct indices of existing GCDs."""
    key = f"{where}nic_gcds"
    if not isinstance(value, list | tuple) or not value:
        raise ConfigError(key, value, f"a non-empty list of GCD indices in 0..{NUM_GCDS - 1}")
    for gcd in value:
        if isinstance(gcd, bool) or not isinstance(gcd, int) or not 0 <= gcd < NUM_GCDS:
            raise ConfigError(key, gcd, f"a GCD index in 0..{NUM_GCDS - 1} (a NIC must attach to an existing GCD)")
    if len(set(value)) != len(value):
        raise ConfigError(key, value, "distinct GCD indices (one NIC per GCD)")
    return tuple(value)


def frontier_node(p: dict, nic_gcds: tuple[int, ...] = FRONTIER_NIC_GCDS) -> NodeModel:
    """The MI250X node: 8 GCDs on the xGMI graph, a CPU, NIC k on GCD nic_gcds[k]."""
    devices = [(f"g{i}", "gpu", i) for i in range(NUM_GCDS)] + [("cpu", "cpu", 0)]
    devices += [(f"nic{k}", "nic", k) for k in range(len(nic_gcds))]
    links = [
        LocalLink(
            a=f"g{a}",
            b=f"g{b}",
            bandwidth_bytes_per_s=n * p["xgmi_link_bandwidth_bytes_per_s"],
            latency_s=p["xgmi_latency_s"],
            link_kind="xgmi",
        )
        for (a, b), n in FRONTIER_XGMI_LINKS.items()
    ]
    links += [
        LocalLink(
            a=f"g{i}",
            b="cpu",
            bandwidth_bytes_per_s=p["cpu_bandwidth_bytes_per_s"],
            latency_s=p["cpu_latency_s"],
            link_kind="cpu",
        )
        for i in range(NUM_GCDS)
    ]
    links += [
        LocalLink(
            a=f"g{gcd}",
            b=f"nic{k}",
            bandwidth_bytes_per_s=p["gpu_nic_bandwidth_bytes_per_s"],
            latency_s=p["gpu_nic_latency_s"],
            link_kind="gpu_nic",
        )
        for k, gcd in enumerate(nic_gcds)
    ]
    return make_node_model(devices, links, transit_kinds=frozenset({"gpu"}))


def build_mi250x_dragonfly(name: str, raw: dict, num_gpus: int | None, schema: dict) -> Topology:
    p = read_params(raw, schema, WHERE)
    positive_bandwidths(raw, p, schema)
    node = frontier_node(p, read_nic_gcds(p["nic_gcds"]))
    return build_on_dragonfly(name, node, p, num_gpus)


@register_builder("frontier")
def build_frontier(raw: dict, num_gpus: int | None) -> Topology:
    """OLCF Frontier: MI250X nodes on Slingshot-11 (defaults are Frontier's numbers)."""
    return build_mi250x_dragonfly("frontier", raw, num_gpus, FRONTIER_SCHEMA)


@register_builder("lumi")
def build_lumi(raw: dict, num_gpus: int | None) -> Topology:
    """LUMI-G: Frontier's node and NIC design; 20 groups of 128 nodes (defaults are LUMI-G's numbers)."""
    return build_mi250x_dragonfly("lumi", raw, num_gpus, LUMI_SCHEMA)
