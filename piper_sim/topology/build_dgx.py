"""The "dgx-superpod" builder: 8-GPU (or rack-scale) nodes on a rail-optimized InfiniBand fat-tree.

Owns the node models (GPUs on one NVSwitch domain, or a fully connected xGMI mesh) and the rail-optimized
two-level tree with its ECMP routing. Must not import simpy or torch.

Numbers (NVIDIA DGX SuperPOD Reference Architecture, DGX H100; DGX H100 User Guide): 8 H100 per node
on NVSwitch, 450 GB/s per GPU per direction (NVLink 4, 900 GB/s bidirectional) -> "nvlink" links to a
node switch "nvsw"; 8 ConnectX-7 400 Gb/s (50 GB/s) InfiniBand NICs, NIC r wired to GPU r ("gpu_nic",
PCIe Gen5 x16, 64 GB/s: derived). Scalable units (SU) of 32 nodes; rail-optimized: NIC r of every node
of SU u goes to leaf switch "su{u}.leaf{r}" ("nic"); every leaf links to every spine "spine{s}" ("up"
links). Spine count and uplinks: the RA's 4-SU compute fabric has 16 spines and 32 uplinks per leaf
(non-blocking); here uplinks_per_leaf (default nodes_per_su, non-blocking) are spread evenly over
num_spines, so one leaf-spine link carries uplinks_per_leaf * uplink_bandwidth / num_spines. Larger
SuperPODs add a core layer; this two-level tree idealizes them as non-blocking.

Node fabric (`node_fabric`): "nvswitch" (above; DGX H100/H200/B200, and a GB200 NVL72 rack as one node of 72
GPUs whose NVLink switch trays are one non-blocking switch "nvsw") or "mesh": every GPU pair linked directly
("xgmi" links of xgmi_link_bandwidth_GBps per direction, an MI300X platform's 7 Infinity Fabric links per GPU).

Routing: same leaf -> leaf only; otherwise ECMP, an equal split over all spines, which is exactly one bundle of
a leaf's uplinks (RailFatTree: the spine layer is built as that bundle). A GPU sends through its
own rail's NIC ("spine" mode, cross-rail traffic crosses a spine), or, with cross_rail: pxn, first over
NVLink to the GPU on the destination's rail (NCCL PXN), so traffic stays on one rail.
"""

from __future__ import annotations

import math

import networkx as nx

from piper_sim.errors import ConfigError
from piper_sim.topology.build_dragonfly import WHERE, positive_bandwidths
from piper_sim.topology.builders import num_nodes_for, register_builder, size_notes
from piper_sim.topology.graph import NetworkParams, Topology
from piper_sim.topology.size import check_machine_size, host_key
from piper_sim.topology.spread import WeightedSwitchPaths
from piper_sim.topology.structured import (
    LocalLink,
    NodeModel,
    StructuredRouter,
    SwitchPaths,
    add_node_instances,
    make_node_model,
)
from piper_sim.units import positive_int, read_params

CROSS_RAIL_MODES = ("spine", "pxn")
NODE_FABRICS = ("nvswitch", "mesh")
DGX_SCHEMA: dict[str, object] = {
    "num_nodes": None,
    "gpus_per_node": 8,
    "nodes_per_su": 32,
    "num_spines": 16,
    "uplinks_per_leaf": None,
    "node_fabric": "nvswitch",
    "nvlink_bandwidth_GBps": 450.0,
    "nvlink_latency_us": 0.5,
    "xgmi_link_bandwidth_GBps": 64.0,
    "xgmi_latency_us": 0.5,
    "gpu_nic_bandwidth_GBps": 64.0,
    "gpu_nic_latency_us": 0.5,
    "nic_bandwidth_GBps": 50.0,
    "nic_latency_us": 0.1,
    "uplink_bandwidth_GBps": 50.0,
    "uplink_latency_us": 0.1,
    "switch_latency_us": 0.13,
    "cross_rail": "spine",
    "message_overhead_us": 2.0,
}


class RailFatTree:
    """Leaves per (SU, rail) and a spine layer; implements structured.SwitchFabric.

    ECMP splits every cross-leaf flow equally over the spines, each path a 1/num_spines share of the flow in the
    max-min sharing (a flow's hashed connections spread over the spines: together they count as one flow on the
    links they share, as a dragonfly's mean-field detours do). Every such flow then loads each spine alike, so by
    symmetry each carries 1/num_spines of every flow at one rate, and the spine layer is exactly one bundle per
    leaf: bundled (the default) builds one "spines" node whose link from and to each leaf has the capacity of all
    the leaf's uplinks (utilization that of each of them, bytes their sum); per spine (bundled False) keeps every
    spine and path (tests/topology/test_spine_bundle.py holds the two to the same run)."""

    def __init__(self, *, nodes_per_su: int, num_rails: int, num_spines: int, bundled: bool = True) -> None:
        self.nodes_per_su, self.num_rails, self.num_spines, self.bundled = nodes_per_su, num_rails, num_spines, bundled
        self._cache: dict[tuple[str, str], WeightedSwitchPaths] = {}

    def su_of(self, host: int) -> int:
        return host // self.nodes_per_su

    def nic_switch(self, host: int, nic_index: int) -> str:
        return f"su{self.su_of(host)}.leaf{nic_index}"

    def spines(self) -> list[str]:
        return ["spines"] if self.bundled else [f"spine{s}" for s in range(self.num_spines)]

    def weighted_switch_paths(self, src: str, dst: str, flow_key: int) -> WeightedSwitchPaths:
        """((byte fraction per unit of weight, flow weight, switches), ...): through the bundle, or an equal split
        over the spines, each path 1/num_spines of the flow's bytes and of its weight."""
        if src == dst:
            return ((1.0, 1.0, (src,)),)
        cached = self._cache.get((src, dst))
        if cached is None:
            spines = self.spines()
            share = 1.0 / len(spines)
            cached = self._cache[(src, dst)] = tuple((1.0, share, (src, spine, dst)) for spine in spines)
        return cached

    def switch_paths(self, src: str, dst: str, flow_key: int) -> SwitchPaths:
        return tuple((f * w, seq) for f, w, seq in self.weighted_switch_paths(src, dst, flow_key))

    def add_switches(self, graph: nx.DiGraph, num_sus: int, p: dict, uplinks_per_leaf: int) -> None:
        spines = self.spines()
        bandwidth = uplinks_per_leaf * p["uplink_bandwidth_bytes_per_s"] / len(spines)
        latency = p["uplink_latency_s"] + p["switch_latency_s"]
        for spine in spines:
            graph.add_node(spine, kind="switch")
        for u in range(num_sus):
            for r in range(self.num_rails):
                leaf = f"su{u}.leaf{r}"
                graph.add_node(leaf, kind="switch", group=u, rail=r)
                for spine in spines:
                    graph.add_edges_from(
                        ((leaf, spine), (spine, leaf)),
                        bandwidth_bytes_per_s=bandwidth,
                        latency_s=latency,
                        link_kind="up",
                    )


def dgx_node(gpus_per_node: int, p: dict, *, pxn: bool) -> NodeModel:
    """GPUs on one NVSwitch domain ("nvsw") or a full xGMI mesh (node_fabric), NIC r on GPU r."""
    devices = [(f"g{i}", "gpu", i) for i in range(gpus_per_node)]
    devices += [(f"nic{i}", "nic", i) for i in range(gpus_per_node)]
    if p["node_fabric"] == "mesh":
        links = [
            LocalLink(
                a=f"g{i}",
                b=f"g{j}",
                bandwidth_bytes_per_s=p["xgmi_link_bandwidth_bytes_per_s"],
                latency_s=p["xgmi_latency_s"],
                link_kind="xgmi",
            )
            for i in range(gpus_per_node)
            for j in range(i + 1, gpus_per_node)
        ]
    else:
        devices.insert(0, ("nvsw", "switch", 0))
        links = [
            LocalLink(
                a=f"g{i}",
                b="nvsw",
                bandwidth_bytes_per_s=p["nvlink_bandwidth_bytes_per_s"],
                latency_s=p["nvlink_latency_s"] / 2,
                link_kind="nvlink",
            )
            for i in range(gpus_per_node)
        ]
    links += [
        LocalLink(
            a=f"g{i}",
            b=f"nic{i}",
            bandwidth_bytes_per_s=p["gpu_nic_bandwidth_bytes_per_s"],
            latency_s=p["gpu_nic_latency_s"],
            link_kind="gpu_nic",
        )
        for i in range(gpus_per_node)
    ]
    return make_node_model(devices, links, transit_kinds=frozenset({"switch", "gpu"}), src_nic_follows_dst=pxn)


@register_builder("dgx-superpod")
def build_dgx_superpod(raw: dict, num_gpus: int | None, *, bundled_spines: bool = True) -> Topology:
    """DGX SuperPOD (or a cluster built like one): rail-optimized leaves per SU, a spine layer, ECMP; sized by the
    GPU count. bundled_spines: the spine layer as one bundle per leaf (RailFatTree; the same run as every spine)."""
    p = read_params(raw, DGX_SCHEMA, WHERE)
    positive_bandwidths(raw, p, DGX_SCHEMA)
    gpus_per_node = positive_int(f"{WHERE}gpus_per_node", p["gpus_per_node"])
    per_su = positive_int(f"{WHERE}nodes_per_su", p["nodes_per_su"])
    spines = positive_int(f"{WHERE}num_spines", p["num_spines"])
    uplinks = positive_int(
        f"{WHERE}uplinks_per_leaf", per_su if p["uplinks_per_leaf"] is None else p["uplinks_per_leaf"]
    )
    for key, allowed in (("cross_rail", CROSS_RAIL_MODES), ("node_fabric", NODE_FABRICS)):
        if p[key] not in allowed:
            raise ConfigError(f"{WHERE}{key}", p[key], f"one of {', '.join(allowed)}")
    num_nodes = num_nodes_for(WHERE, num_gpus, gpus_per_node, p["num_nodes"])
    num_sus = math.ceil(num_nodes / per_su)
    node_links = gpus_per_node * (gpus_per_node - 1 if p["node_fabric"] == "mesh" else 2) + 2 * gpus_per_node
    terms = {
        host_key(p, gpus_per_node, num_gpus): num_nodes * (node_links + 2 * gpus_per_node),
        "gpus_per_node": gpus_per_node**2,
        "num_spines": 2 * num_sus * gpus_per_node * (1 if bundled_spines else spines),  # a bundle: one per leaf
    }
    check_machine_size(
        "dgx-superpod", terms, num_gpus, {"num_nodes": num_nodes, "gpus_per_node": gpus_per_node, "num_spines": spines}
    )
    node = dgx_node(gpus_per_node, p, pxn=p["cross_rail"] == "pxn")
    fabric = RailFatTree(nodes_per_su=per_su, num_rails=gpus_per_node, num_spines=spines, bundled=bundled_spines)
    graph = nx.DiGraph()
    attrs = {h: {"group": fabric.su_of(h), "switch": f"su{fabric.su_of(h)}"} for h in range(num_nodes)}
    gpus = add_node_instances(graph, node, num_nodes, attrs)
    fabric.add_switches(graph, num_sus, p, uplinks)
    nic = {
        "bandwidth_bytes_per_s": p["nic_bandwidth_bytes_per_s"],
        "link_kind": "nic",
        "latency_s": p["nic_latency_s"] + p["switch_latency_s"],
    }
    for h in range(num_nodes):
        for r in range(gpus_per_node):
            a, b = f"n{h}.nic{r}", fabric.nic_switch(h, r)
            graph.add_edges_from(((a, b), (b, a)), **nic)
    return Topology(
        name="dgx-superpod",
        graph=graph,
        gpus=gpus,
        router=StructuredRouter(node=node, fabric=fabric),
        params=NetworkParams(message_overhead_s=p["message_overhead_s"]),
        notes=size_notes(p["num_nodes"], num_nodes),
    )
