"""The dragonfly builders: parameters of the fabric, the generic "dragonfly" builder, and the shared
building of hosts on a dragonfly (used by the Frontier and LUMI builders).

Owns reading and checking the fabric's parameters (FABRIC_SCHEMA: sizes, links, routing, the machine's
group count, network scope, outside groups, background load and the job's allocation on the machine) and
build_on_dragonfly. The fabric itself (structure, graph, routes) is piper_sim.topology.dragonfly. Must not
import simpy or torch.

Machine size: num_groups is the machine's group count (Frontier: 74 in topologies/frontier.yaml); unset,
the machine is taken to be just the groups the job needs, and the topology says so in its notes.
The job's nodes sit on the machine where the allocation policy puts them (topology.placement.allocate:
contiguous, spread over groups, random, or an explicit list); hosts are numbered in machine order.
"""

from __future__ import annotations

import networkx as nx

from piper_sim.bounds import INT_LIMIT, read_int
from piper_sim.errors import ConfigError
from piper_sim.topology.builders import num_nodes_for, register_builder
from piper_sim.topology.dragonfly import DragonflyFabric, DragonflySpec
from piper_sim.topology.graph import NetworkParams, Topology
from piper_sim.topology.placement import allocate
from piper_sim.topology.size import check_machine_size, host_key
from piper_sim.topology.structured import LocalLink, NodeModel, StructuredRouter, add_node_instances, make_node_model
from piper_sim.units import positive_int, read_params, si_key

ROUTING_MODES = ("minimal", "valiant", "adaptive")
VALIANT_MODES = ("hashed", "spread")
SCOPES = ("machine", "job")
OUTSIDE_MODES = ("exact", "aggregate")
WHERE = "topology.params."

# Defaults are Slingshot-11 numbers (200 Gb/s ports = 25 GB/s; see topologies/frontier.yaml sources).
FABRIC_SCHEMA: dict[str, object] = {
    "num_nodes": None,
    "num_groups": None,
    "max_nodes": None,
    "switches_per_group": 32,
    "nodes_per_switch": 4,
    "nic_switch_spread": True,
    "local_bandwidth_GBps": 25.0,
    "local_latency_us": 0.1,
    "global_links_per_group_pair": 4,
    "global_bandwidth_GBps": 25.0,
    "global_latency_us": 0.5,
    "nic_bandwidth_GBps": 25.0,
    "nic_latency_us": 0.1,
    "switch_latency_us": 0.35,
    "routing": "minimal",
    "valiant": "hashed",
    "adaptive_minimal_fraction": 0.5,
    "seed": 0,
    "message_overhead_us": 2.0,
    "network_scope": "machine",
    "outside_groups": "exact",
    "background_load": 0.0,
    "allocation": "contiguous",
}


# ---- parameters --------------------------------------------------------------------------------
def positive_bandwidths(raw: dict, p: dict, schema: dict, where: str = WHERE) -> None:
    """Bandwidth keys (unit GBps/Gbps/...) must be > 0 when given; read_params already rejects < 0."""
    for key in schema:
        si = si_key(key)
        if si.endswith("bytes_per_s") and p.get(si) is not None and not p[si] > 0:
            raise ConfigError(f"{where}{key}", raw.get(key, schema[key]), "a positive number")


def _choice(p: dict, key: str, allowed: tuple[str, ...], where: str) -> str:
    if p[key] not in allowed:
        raise ConfigError(f"{where}{key}", p[key], f"one of {', '.join(allowed)}")
    return str(p[key])


def _background(value: object, where: str) -> float | tuple[float, int]:
    """A fraction in [0, 1), or {mean: fraction in [0, 0.5), seed: int} for a random fraction per cable."""
    key = f"{where}background_load"
    if isinstance(value, dict):
        unknown = sorted(set(value) - {"mean", "seed"})
        if unknown:
            raise ConfigError(f"{key}.{unknown[0]}", value[unknown[0]], "mean, seed")
        mean, seed = value.get("mean", 0.0), value.get("seed", 0)
        if isinstance(mean, bool) or not isinstance(mean, int | float) or not 0.0 <= mean < 0.5:
            raise ConfigError(f"{key}.mean", mean, "a fraction in [0, 0.5)")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ConfigError(f"{key}.seed", seed, "an integer")
        return float(mean), seed
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value < 1.0:
        raise ConfigError(key, value, "a fraction of each global link's capacity in [0, 1), or {mean, seed}")
    return float(value)


def _check_routing(p: dict, where: str) -> float | str:
    """The adaptive-minimal fraction ("auto" or a number in [0, 1]), after every routing key is checked."""
    _choice(p, "routing", ROUTING_MODES, where)
    read_int(f"{where}seed", p["seed"], low=-INT_LIMIT)
    if not isinstance(p["nic_switch_spread"], bool):
        raise ConfigError(f"{where}nic_switch_spread", p["nic_switch_spread"], "true or false")
    frac = p["adaptive_minimal_fraction"]
    if frac == "auto":
        return "auto"
    if isinstance(frac, bool) or not isinstance(frac, int | float) or not 0.0 <= frac <= 1.0:
        raise ConfigError(f"{where}adaptive_minimal_fraction", frac, "a number in [0, 1] or auto")
    return float(frac)


def read_dragonfly_spec(p: dict, num_nodes: int, nics_per_node: int, where: str = WHERE) -> DragonflySpec:
    """Check the fabric parameters (already unit-converted); place the job's nodes on the machine."""
    switches = positive_int(f"{where}switches_per_group", p["switches_per_group"])
    per_switch = positive_int(f"{where}nodes_per_switch", p["nodes_per_switch"])
    links = positive_int(f"{where}global_links_per_group_pair", p["global_links_per_group_pair"])
    frac = _check_routing(p, where)
    if p["max_nodes"] is not None and num_nodes > positive_int(f"{where}max_nodes", p["max_nodes"]):
        raise ConfigError("topology", f"{num_nodes} nodes", f"at most max_nodes = {p['max_nodes']} nodes")
    per_group = switches * per_switch
    groups = None if p["num_groups"] is None else positive_int(f"{where}num_groups", p["num_groups"])
    if groups is not None and groups * per_group < num_nodes:
        raise ConfigError(
            f"{where}num_groups", groups, f"at least {-(-num_nodes // per_group)} groups for {num_nodes} nodes"
        )
    positions = allocate(p["allocation"], num_nodes, groups, per_group, f"{where}allocation")
    needed = max(positions) // per_group + 1
    return DragonflySpec(
        num_groups=groups if groups is not None else needed,
        switches_per_group=switches,
        nodes_per_switch=per_switch,
        nics_per_node=nics_per_node,
        nic_switch_spread=p["nic_switch_spread"],
        global_links_per_group_pair=links,
        routing=p["routing"],
        valiant=_choice(p, "valiant", VALIANT_MODES, where),
        adaptive_minimal_fraction=frac,
        positions=tuple(positions),
        network_scope=_choice(p, "network_scope", SCOPES, where),
        outside_groups=_choice(p, "outside_groups", OUTSIDE_MODES, where),
        background=_background(p["background_load"], where),
    )


def dragonfly_links(spec: DragonflySpec, node: NodeModel, num_nodes: int, host: str) -> dict[str, int]:
    """The links build_on_dragonfly builds, by the parameter that sets their number (check_machine_size; less the
    few outside groups' switches): the hosts (node and NIC links; `host`: host_key), the job's groups' all-to-all
    local links, the global links between them (one per switch pair at most) and the node model's GPU-pair paths."""
    groups = len({pos // spec.nodes_per_group for pos in spec.positions or range(num_nodes)})
    switches, per_pair = spec.switches_per_group, spec.global_links_per_group_pair
    terms = {
        host: num_nodes * 2 * (len(node.links) + node.nics_per_node),
        "switches_per_group": groups * switches * (switches - 1),
        "gpus_per_node": node.gpus_per_node**2,
    }
    terms[""] = terms.get("", 0) + groups * (groups - 1) * min(per_pair, switches * switches)
    return terms


def build_on_dragonfly(name: str, node: NodeModel, p: dict, num_gpus: int | None, where: str = WHERE) -> Topology:
    """Hosts of `node`, sized by num_nodes or the GPU count, on a dragonfly fabric; structured routing."""
    num_nodes = num_nodes_for(where, num_gpus, node.gpus_per_node, p["num_nodes"])
    spec = read_dragonfly_spec(p, num_nodes, node.nics_per_node, where)
    values = {
        "num_nodes": num_nodes,
        "switches_per_group": spec.switches_per_group,
        "gpus_per_node": node.gpus_per_node,
    }
    check_machine_size(
        name, dragonfly_links(spec, node, num_nodes, host_key(p, node.gpus_per_node, num_gpus)), num_gpus, values, where
    )
    fabric = DragonflyFabric(spec, num_nodes)
    graph = nx.DiGraph()
    gpus = add_node_instances(graph, node, num_nodes, fabric.gpu_attrs(num_nodes))
    fabric.add_switches(graph, p)
    nic = {
        "bandwidth_bytes_per_s": p["nic_bandwidth_bytes_per_s"],
        "link_kind": "nic",
        "latency_s": p["nic_latency_s"] + p["switch_latency_s"],
    }
    for h in range(num_nodes):
        for k in range(node.nics_per_node):
            a, b = f"n{h}.nic{k}", fabric.nic_switch(h, k)
            graph.add_edges_from(((a, b), (b, a)), **nic)
    notes = fabric.notes()
    if p["num_groups"] is None:
        notes.append(f"machine size not given (num_groups): only the job's {len(fabric.job_groups)} group(s) exist")
    return Topology(
        name=name,
        graph=graph,
        gpus=gpus,
        router=StructuredRouter(node=node, fabric=fabric, seed=p["seed"]),
        params=NetworkParams(message_overhead_s=p["message_overhead_s"]),
        notes=notes,
    )


# ---- generic builder ---------------------------------------------------------------------------
GENERIC_SCHEMA: dict[str, object] = {
    **FABRIC_SCHEMA,
    "gpus_per_node": 4,
    "nics_per_node": None,
    "intra_bandwidth_GBps": 100.0,
    "intra_latency_us": 1.0,
    "gpu_nic_bandwidth_GBps": 50.0,
    "gpu_nic_latency_us": 0.0,
}


def simple_node(gpus_per_node: int, nics_per_node: int, p: dict) -> NodeModel:
    """GPUs on a non-blocking node switch ("intra"); GPU i wired to NIC i * nics // gpus ("gpu_nic")."""
    devices = [("sw", "switch", 0)] + [(f"g{i}", "gpu", i) for i in range(gpus_per_node)]
    devices += [(f"nic{k}", "nic", k) for k in range(nics_per_node)]
    links = [
        LocalLink(
            a=f"g{i}",
            b="sw",
            bandwidth_bytes_per_s=p["intra_bandwidth_bytes_per_s"],
            latency_s=p["intra_latency_s"] / 2,
            link_kind="intra",
        )
        for i in range(gpus_per_node)
    ]
    links += [
        LocalLink(
            a=f"g{i}",
            b=f"nic{i * nics_per_node // gpus_per_node}",
            bandwidth_bytes_per_s=p["gpu_nic_bandwidth_bytes_per_s"],
            latency_s=p["gpu_nic_latency_s"],
            link_kind="gpu_nic",
        )
        for i in range(gpus_per_node)
    ]
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
    check_machine_size("dragonfly", {"gpus_per_node": gpus_per_node**2}, num_gpus, {"gpus_per_node": gpus_per_node})
    return build_on_dragonfly("dragonfly", simple_node(gpus_per_node, nics, p), p, num_gpus)
