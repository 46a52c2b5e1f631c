"""The "testbed" builder: small explicit clusters, one NIC per node, named switches and switch links.

Used for emulated clusters (piper_sim.testbed builds namespaces, veths and bridges from the same
YAML) and for small what-if machines. Must not import simpy or torch.

params (every bandwidth/latency key takes any unit suffix of piper_sim.units: `nic_bandwidth_Mbps: 100`
or `nic_bandwidth_GBps: 0.0125`; exactly one spelling per quantity):
  gpus_per_node          ranks per node
  switches               list of switch names (or {name, group} mappings)
  nodes                  list of {switch: name}; node i is host i
  nic_bandwidth_*        node <-> its switch, per direction; one NIC per node shared by its ranks
  nic_latency_*          one-way latency of that link
  switch_links           list of {a, b, bandwidth_*, latency_*, kind}; kind "local" (default) or "global"
  intra_bandwidth_*      rank <-> rank inside a node (loopback in the emulator), default 1 GB/s
  intra_latency_*        one-way rank -> rank latency inside a node, default 20 us
  message_overhead_*     per-message software overhead, default 0

Graph: per node h a node switch "n{h}.sw" with gpus "n{h}.g{i}" (duplex "intra" links, each with half
the intra latency so a rank -> rank path inside a node costs intra_latency), one NIC "n{h}.nic0" linked
from every gpu ("gpu_nic", intra bandwidth, no latency) and to the node's switch ("nic"), and the
network switches (nodes named as in the YAML, kind "switch") joined by the switch links.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import networkx as nx

from piper_sim.errors import ConfigError
from piper_sim.topology.builders import add_duplex, register_builder
from piper_sim.topology.graph import NetworkParams, Topology
from piper_sim.units import positive_int, to_si

BANDWIDTH_UNITS = ("GBps", "MBps", "Gbps", "Mbps")
LATENCY_UNITS = ("s", "ms", "us", "ns")
PARAM_KEYS = ("gpus_per_node", "switches", "nodes", "switch_links", "shared_cores")
QUANTITIES = {  # base key -> (units, default in SI or ... when required)
    "nic_bandwidth": (BANDWIDTH_UNITS, ...),
    "nic_latency": (LATENCY_UNITS, 0.0),
    "intra_bandwidth": (BANDWIDTH_UNITS, 1e9),
    "intra_latency": (LATENCY_UNITS, 20e-6),
    "message_overhead": (LATENCY_UNITS, 0.0),
}
SWITCH_LINK_QUANTITIES = {"bandwidth": (BANDWIDTH_UNITS, ...), "latency": (LATENCY_UNITS, 0.0)}
LINK_KINDS = ("local", "global")
NODE_NAME = re.compile(r"n\d+\.")


def read_quantities(
    raw: dict, quantities: Mapping[str, tuple[tuple[str, ...], object]], where: str, extra_keys: tuple[str, ...]
) -> dict[str, float]:
    """Unit-suffixed values with a free choice of unit: {base: SI value}; unknown keys are an error."""
    allowed = set(extra_keys)
    out: dict[str, float] = {}
    for base, (units, default) in quantities.items():
        keys = [f"{base}_{u}" for u in units]
        allowed.update(keys)
        given = [k for k in keys if k in raw]
        if len(given) > 1:
            raise ConfigError(f"{where}{given[1]}", raw[given[1]], f"only one of {', '.join(given)}")
        if given:
            out[base] = to_si(given[0], raw[given[0]], where=where)
        elif default is ...:
            raise ConfigError(f"{where}{keys[0]}", None, f"a value (required; units {', '.join(units)})")
        else:
            out[base] = float(default)  # type: ignore[arg-type]
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise ConfigError(f"{where}{unknown[0]}", raw[unknown[0]], f"known keys: {', '.join(sorted(allowed))}")
    return out


def _switch_names(raw: object, where: str) -> dict[str, int | None]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError(where, raw, "a non-empty list of switch names or {name, group} mappings")
    out: dict[str, int | None] = {}
    for i, item in enumerate(raw):
        name, group = (item, None) if isinstance(item, str) else (None, None)
        if isinstance(item, dict):
            unknown = sorted(set(item) - {"name", "group"})
            if unknown:
                raise ConfigError(f"{where}[{i}].{unknown[0]}", item[unknown[0]], "known keys: group, name")
            name, group = item.get("name"), item.get("group")
        if not isinstance(name, str) or not name or name in out:
            raise ConfigError(f"{where}[{i}]", item, "a distinct non-empty switch name")
        if NODE_NAME.match(name):
            raise ConfigError(f"{where}[{i}]", item, "a name not of the node form n<h>.*")
        out[name] = group
    return out


def _node_switches(raw: object, switches: dict[str, int | None], where: str) -> list[str]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError(where, raw, "a non-empty list of {switch: name} (node i is host i)")
    out = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or set(item) != {"switch"} or item["switch"] not in switches:
            raise ConfigError(f"{where}[{i}]", item, f"{{switch: one of {', '.join(switches)}}}")
        out.append(item["switch"])
    return out


def _add_switch_links(graph: nx.DiGraph, raw: object, switches: dict[str, int | None], where: str) -> None:
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise ConfigError(where, raw, "a list of {a, b, bandwidth_*, latency_*, kind}")
    for i, item in enumerate(raw):
        w = f"{where}[{i}]."
        if not isinstance(item, dict):
            raise ConfigError(w.rstrip("."), item, "a mapping {a, b, bandwidth_*, latency_*, kind}")
        q = read_quantities(item, SWITCH_LINK_QUANTITIES, w, ("a", "b", "kind"))
        for end in ("a", "b"):
            if item.get(end) not in switches:
                raise ConfigError(f"{w}{end}", item.get(end), f"one of {', '.join(switches)}")
        if item["a"] == item["b"] or graph.has_edge(item["a"], item["b"]):
            raise ConfigError(w.rstrip("."), item, "a link between two different, not yet linked switches")
        kind = item.get("kind", "local")
        if kind not in LINK_KINDS:
            raise ConfigError(f"{w}kind", kind, f"one of {', '.join(LINK_KINDS)}")
        if not q["bandwidth"] > 0:
            raise ConfigError(f"{w}bandwidth", 0, "a positive bandwidth")
        add_duplex(
            graph, item["a"], item["b"], bandwidth_bytes_per_s=q["bandwidth"], latency_s=q["latency"], link_kind=kind
        )


@register_builder("testbed")
def build_testbed(raw: dict, num_gpus: int | None) -> Topology:
    """Explicit small cluster; num_gpus is only checked by the loader (the YAML fixes the size)."""
    where = "topology.params."
    if not isinstance(raw, dict):
        raise ConfigError("topology.params", raw, "a mapping")
    q = read_quantities(raw, QUANTITIES, where, PARAM_KEYS)
    for key in ("nic_bandwidth", "intra_bandwidth"):
        if not q[key] > 0:
            raise ConfigError(f"{where}{key}", q[key], "a positive bandwidth")
    gpus_per_node = positive_int(f"{where}gpus_per_node", raw.get("gpus_per_node"))
    switches = _switch_names(raw.get("switches"), f"{where}switches")
    node_switch = _node_switches(raw.get("nodes"), switches, f"{where}nodes")
    graph = nx.DiGraph()
    for name, group in switches.items():
        graph.add_node(name, kind="switch", **({} if group is None else {"group": group}))
    _add_switch_links(graph, raw.get("switch_links"), switches, f"{where}switch_links")
    gpus: list[str] = []
    for h, switch in enumerate(node_switch):
        node_sw, nic = f"n{h}.sw", f"n{h}.nic0"
        graph.add_node(node_sw, kind="switch", host=h)
        graph.add_node(nic, kind="nic", host=h, local_index=0, switch=switch)
        for g in range(gpus_per_node):
            gpu = f"n{h}.g{g}"
            graph.add_node(gpu, kind="gpu", host=h, local_index=g)
            add_duplex(
                graph,
                gpu,
                node_sw,
                bandwidth_bytes_per_s=q["intra_bandwidth"],
                latency_s=q["intra_latency"] / 2,
                link_kind="intra",
            )
            add_duplex(graph, gpu, nic, bandwidth_bytes_per_s=q["intra_bandwidth"], latency_s=0.0, link_kind="gpu_nic")
            gpus.append(gpu)
        add_duplex(
            graph, nic, switch, bandwidth_bytes_per_s=q["nic_bandwidth"], latency_s=q["nic_latency"], link_kind="nic"
        )
    net = graph.subgraph(switches).to_undirected()
    if not nx.is_connected(net):
        raise ConfigError(f"{where}switch_links", raw.get("switch_links"), "links that connect all switches")
    cores = raw.get("shared_cores", 0)
    if isinstance(cores, bool) or not isinstance(cores, int) or cores < 0:
        raise ConfigError(f"{where}shared_cores", cores, "a non-negative integer (0: no shared cores)")
    return Topology(
        name="testbed",
        graph=graph,
        gpus=gpus,
        router=testbed_router,
        params=NetworkParams(message_overhead_s=q["message_overhead"], shared_cores=cores),
    )


def testbed_router(topo: Topology, src: str, dst: str) -> tuple[tuple[float, tuple[int, ...]], ...]:
    """Ranks of one node talk through the node switch (loopback); everything else takes the shortest
    path (hops, then latency) through the end nodes' NICs and the network switches only."""
    graph = topo.graph
    ends = {graph.nodes[src].get("host"), graph.nodes[dst].get("host")}
    if len(ends) == 1 and None not in ends and graph.nodes[src]["kind"] == graph.nodes[dst]["kind"] == "gpu":
        nodes = [src, f"n{graph.nodes[src]['host']}.sw", dst]
    else:
        hidden = [
            n
            for n, d in graph.nodes(data=True)
            if "host" in d and n not in (src, dst) and not (d["kind"] == "nic" and d["host"] in ends)
        ]
        view = nx.restricted_view(graph, hidden, [])
        try:
            nodes = nx.shortest_path(view, src, dst, weight=lambda u, v, d: 1.0 + d.get("latency_s", 0.0))
        except nx.NetworkXNoPath:
            raise ConfigError(f"topology {topo.name}", f"{src}->{dst}", "a connected topology") from None
    return ((1.0, tuple(topo.link_index[(a, b)] for a, b in zip(nodes, nodes[1:], strict=False))),)
