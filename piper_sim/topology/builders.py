"""Topology builders: registry plus the uniform cluster and the two-level fat-tree.

A builder is `f(params: dict, num_gpus: int | None) -> Topology`; params are the raw YAML
mapping (unit-suffixed keys), converted here with units.read_params. Builders for Frontier,
dragonfly, LUMI and DGX SuperPOD live in their own modules and register here too.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable

import networkx as nx

from piper_sim.errors import ConfigError
from piper_sim.registry import Registry
from piper_sim.topology.graph import NetworkParams, Topology
from piper_sim.topology.size import check_machine_size, host_key
from piper_sim.units import positive_int, read_params

Builder = Callable[[dict, "int | None"], Topology]
BUILDERS: Registry[Builder] = Registry("topology.builder")
register_builder = BUILDERS.register


def add_duplex(
    graph: nx.DiGraph, a: str, b: str, *, bandwidth_bytes_per_s: float, latency_s: float, link_kind: str
) -> None:
    """Two directed links a->b and b->a with the same capacity (full duplex)."""
    for u, v in ((a, b), (b, a)):
        graph.add_edge(u, v, bandwidth_bytes_per_s=bandwidth_bytes_per_s, latency_s=latency_s, link_kind=link_kind)


def num_nodes_for(where: str, num_gpus: int | None, gpus_per_node: int, given: int | None) -> int:
    if given is not None:
        nodes = positive_int(f"{where}num_nodes", given)
        if num_gpus is not None and num_gpus > nodes * gpus_per_node:
            raise ConfigError(
                f"{where}num_nodes", nodes, f"at least {math.ceil(num_gpus / gpus_per_node)} nodes for {num_gpus} GPUs"
            )
        return nodes
    if num_gpus is None:
        raise ConfigError(f"{where}num_nodes", None, "a value when the GPU count is not known")
    return math.ceil(num_gpus / gpus_per_node)


def size_notes(given: int | None, nodes: int) -> list[str]:
    """A topology's note when its node count came from the job (num_nodes not given)."""
    if given is not None:
        return []
    return [
        f"machine size not given (num_nodes): only the job's {nodes} node(s) exist, so placement has no "
        "other nodes to choose"
    ]


HOST_LINKS_PER_GPU = 6  # add_hosts and a NIC's link to the network: GPU-switch, GPU-NIC, NIC-network, both ways


def add_hosts(graph: nx.DiGraph, num_nodes: int, gpus_per_node: int, p: dict) -> list[str]:
    """Hosts with a non-blocking node switch and one NIC per GPU; returns GPU names."""
    gpus = []
    for h in range(num_nodes):
        switch = f"n{h}.sw"
        graph.add_node(switch, kind="switch", host=h)
        for g in range(gpus_per_node):
            gpu, nic = f"n{h}.g{g}", f"n{h}.nic{g}"
            graph.add_node(gpu, kind="gpu", host=h, local_index=g)
            graph.add_node(nic, kind="nic", host=h, local_index=g)
            add_duplex(
                graph,
                gpu,
                switch,
                bandwidth_bytes_per_s=p["intra_bandwidth_bytes_per_s"],
                latency_s=p["intra_latency_s"],
                link_kind="intra",
            )
            add_duplex(
                graph,
                gpu,
                nic,
                bandwidth_bytes_per_s=p["nic_bandwidth_bytes_per_s"],
                latency_s=0.0,
                link_kind="gpu_nic",
            )
            gpus.append(gpu)
    return gpus


HOST_SCHEMA = {
    "num_nodes": None,
    "gpus_per_node": 8,
    "intra_bandwidth_GBps": ...,
    "intra_latency_us": 1.0,
    "nic_bandwidth_GBps": ...,
    "nic_latency_us": 1.0,
    "switch_latency_us": 0.5,
    "message_overhead_us": 0.0,
}


@register_builder("uniform")
def build_uniform(raw: dict, num_gpus: int | None) -> Topology:
    """N nodes x G GPUs; a node switch inside each node; one NIC per GPU into one network switch."""
    p = read_params(raw, HOST_SCHEMA, "topology.params.")
    gpus_per_node = positive_int("topology.params.gpus_per_node", p["gpus_per_node"])
    nodes = num_nodes_for("topology.params.", num_gpus, gpus_per_node, p["num_nodes"])
    check_machine_size(
        "uniform",
        {host_key(p, gpus_per_node, num_gpus): nodes * gpus_per_node * HOST_LINKS_PER_GPU},
        num_gpus,
        {"num_nodes": nodes, "gpus_per_node": gpus_per_node},
    )
    graph = nx.DiGraph()
    gpus = add_hosts(graph, nodes, gpus_per_node, p)
    graph.add_node("net.sw", kind="switch")
    for h in range(nodes):
        for g in range(gpus_per_node):
            add_duplex(
                graph,
                f"n{h}.nic{g}",
                "net.sw",
                bandwidth_bytes_per_s=p["nic_bandwidth_bytes_per_s"],
                latency_s=p["nic_latency_s"] + p["switch_latency_s"],
                link_kind="nic",
            )
    return Topology(
        name="uniform",
        graph=graph,
        gpus=gpus,
        router=uniform_router,
        params=NetworkParams(message_overhead_s=p["message_overhead_s"]),
    )


def uniform_router(topo: Topology, src: str, dst: str) -> tuple[tuple[float, tuple[int, ...]], ...]:
    """Structural routes of the uniform cluster (no graph search): through the node switch inside a
    node, else GPU -> its NIC -> network switch -> NIC -> GPU. Non-GPU endpoints use shortest paths."""
    ends = _uniform_ends(topo)
    a, b = ends.get(src), ends.get(dst)
    if a is None or b is None:
        return ((1.0, topo._shortest_links(src, dst)),)
    if a[0] == b[0]:  # same host: GPU -> node switch -> GPU
        return ((1.0, (a[1], b[2])),)
    return ((1.0, (a[3], a[4], b[5], b[6])),)


_UNIFORM_ENDS: weakref.WeakKeyDictionary[Topology, dict[str, tuple[int, ...]]] = weakref.WeakKeyDictionary()


def _uniform_ends(topo: Topology) -> dict[str, tuple[int, ...]]:
    """Per GPU of a uniform cluster: (host, GPU -> node switch, node switch -> GPU, GPU -> NIC, NIC -> network
    switch, network switch -> NIC, NIC -> GPU) link ids (once per topology)."""
    hit = _UNIFORM_ENDS.get(topo)
    if hit is None:
        graph, link = topo.graph, topo.link_index
        hit = {}
        for gpu in topo.gpus:
            host = graph.nodes[gpu]["host"]
            sw, nic = f"n{host}.sw", f"n{host}.nic{graph.nodes[gpu]['local_index']}"
            hit[gpu] = (
                host,
                link[(gpu, sw)],
                link[(sw, gpu)],
                link[(gpu, nic)],
                link[(nic, "net.sw")],
                link[("net.sw", nic)],
                link[(nic, gpu)],
            )
        _UNIFORM_ENDS[topo] = hit
    return hit


FAT_TREE_SCHEMA = {
    **HOST_SCHEMA,
    "nodes_per_leaf": 4,
    "num_spines": 4,
    "uplink_bandwidth_GBps": None,
    "uplink_latency_us": 1.0,
}


@register_builder("fat-tree")
def build_fat_tree(raw: dict, num_gpus: int | None) -> Topology:
    """Two-level fat-tree: NICs into leaf switches, every leaf linked to every spine; ECMP over spines.

    uplink_bandwidth_GBps is per leaf-spine link; by default the tree is non-blocking (leaf uplink
    capacity equals its downlink capacity).
    """
    p = read_params(raw, FAT_TREE_SCHEMA, "topology.params.")
    gpus_per_node = positive_int("topology.params.gpus_per_node", p["gpus_per_node"])
    per_leaf = positive_int("topology.params.nodes_per_leaf", p["nodes_per_leaf"])
    spines = positive_int("topology.params.num_spines", p["num_spines"])
    nodes = num_nodes_for("topology.params.", num_gpus, gpus_per_node, p["num_nodes"])
    uplink = p["uplink_bandwidth_bytes_per_s"] or per_leaf * gpus_per_node * p["nic_bandwidth_bytes_per_s"] / spines
    num_leaves = math.ceil(nodes / per_leaf)
    hosts = host_key(p, gpus_per_node, num_gpus)
    terms = {hosts: nodes * gpus_per_node * HOST_LINKS_PER_GPU, "num_spines": 2 * num_leaves * spines}
    check_machine_size(
        "fat-tree", terms, num_gpus, {"num_nodes": nodes, "gpus_per_node": gpus_per_node, "num_spines": spines}
    )
    graph = nx.DiGraph()
    gpus = add_hosts(graph, nodes, gpus_per_node, p)
    for s in range(spines):
        graph.add_node(f"spine{s}", kind="switch")
    for leaf in range(num_leaves):
        graph.add_node(f"leaf{leaf}", kind="switch")
        for s in range(spines):
            add_duplex(
                graph,
                f"leaf{leaf}",
                f"spine{s}",
                bandwidth_bytes_per_s=uplink,
                latency_s=p["uplink_latency_s"] + p["switch_latency_s"],
                link_kind="up",
            )
    for h in range(nodes):
        for g in range(gpus_per_node):
            add_duplex(
                graph,
                f"n{h}.nic{g}",
                f"leaf{h // per_leaf}",
                bandwidth_bytes_per_s=p["nic_bandwidth_bytes_per_s"],
                latency_s=p["nic_latency_s"] + p["switch_latency_s"],
                link_kind="nic",
            )
    return Topology(
        name="fat-tree",
        graph=graph,
        gpus=gpus,
        router=ecmp_router,
        params=NetworkParams(message_overhead_s=p["message_overhead_s"]),
        notes=size_notes(p["num_nodes"], nodes),
    )


def ecmp_router(topo: Topology, src: str, dst: str) -> tuple[tuple[float, tuple[int, ...]], ...]:
    """Equal split over all shortest paths (by hop count), as ECMP hashing spreads many flows."""
    return tuple((f * w, links) for f, w, links in ecmp_weighted(topo, src, dst))


def ecmp_weighted(topo: Topology, src: str, dst: str) -> tuple[tuple[float, float, tuple[int, ...]], ...]:
    """ecmp_router's paths for Topology.weighted_paths: each path 1/K of the flow's bytes and of its weight, so the
    K paths of a flow (its hashed connections spread over the spines) count as one flow on the links they share."""
    paths = sorted(nx.all_shortest_paths(topo.graph, src, dst))
    share = 1.0 / len(paths)
    return tuple(
        (1.0, share, tuple(topo.link_index[(a, b)] for a, b in zip(nodes, nodes[1:], strict=False))) for nodes in paths
    )


ecmp_router.weighted = ecmp_weighted  # type: ignore[attr-defined]  # the router's weighted paths (graph.py)
