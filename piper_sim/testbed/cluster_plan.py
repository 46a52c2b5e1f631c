"""What an emulated cluster consists of, derived from a Topology: pure data, no system calls.

Owns the mapping from the topology graph to namespaces, links, addresses and the rank map. Must not
run commands (piper_sim.testbed.emulator does) and must not import simpy or torch.

Supported topologies: one NIC per compute node (the "testbed" builder), network switches (nodes of
kind "switch" without a `host`) joined in a loop-free graph. The emulator joins all bridges into one L2
broadcast domain, so a loop in the switch graph would be a bridging loop: it is rejected here.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import asdict, dataclass

import networkx as nx

from piper_sim.errors import ConfigError
from piper_sim.topology.graph import Topology

ALLOWED_SUPERNET = ipaddress.ip_network("10.250.0.0/16")
DEFAULT_SUBNET = "10.250.0.0/24"
PREFIX_PATTERN = re.compile(r"[a-z][a-z0-9]{0,9}")
HOST_INTERFACE = "eth0"
BRIDGE = "br0"


@dataclass(frozen=True, kw_only=True)
class Shaping:
    """Egress shaping of one link direction: rate (bytes/s of Ethernet frames) and one-way delay."""

    rate_bytes_per_s: float
    delay_s: float


@dataclass(frozen=True, kw_only=True)
class LinkEnd:
    namespace: str
    interface: str


@dataclass(frozen=True, kw_only=True)
class LinkPlan:
    """One duplex link; a_to_b shapes the egress of end a, b_to_a the egress of end b."""

    name: str  # "n0.nic0-s0" or "s0-s1": the topology nodes it joins
    kind: str  # the topology's link_kind: "nic", "local", "global"
    a: LinkEnd
    b: LinkEnd
    a_to_b: Shaping
    b_to_a: Shaping

    @property
    def has_delay(self) -> bool:
        return self.a_to_b.delay_s > 0 or self.b_to_a.delay_s > 0


@dataclass(frozen=True, kw_only=True)
class HostPlan:
    host: int
    namespace: str
    ip: str
    interface: str
    switch: str


@dataclass(frozen=True, kw_only=True)
class SwitchPlan:
    name: str
    namespace: str
    bridge: str


@dataclass(frozen=True, kw_only=True)
class RankPlan:
    rank: int
    gpu: str
    host: int
    namespace: str
    ip: str


@dataclass(frozen=True, kw_only=True)
class TestbedPlan:
    """Everything the emulator creates for one topology."""

    __test__ = False  # not a pytest test class
    prefix: str
    topology: str
    subnet: str
    hosts: tuple[HostPlan, ...]
    switches: tuple[SwitchPlan, ...]
    links: tuple[LinkPlan, ...]
    ranks: tuple[RankPlan, ...]

    @property
    def namespaces(self) -> list[str]:
        return [h.namespace for h in self.hosts] + [s.namespace for s in self.switches]

    def to_dict(self) -> dict:
        return asdict(self)


def check_prefix(prefix: str) -> str:
    if not isinstance(prefix, str) or not PREFIX_PATTERN.fullmatch(prefix):
        raise ConfigError("testbed.prefix", prefix, "1 to 10 lowercase letters or digits, starting with a letter")
    return prefix


def namespace_pattern(prefix: str) -> re.Pattern[str]:
    """Names of the namespaces a testbed with this prefix creates (and down() removes)."""
    return re.compile(rf"{re.escape(check_prefix(prefix))}-[ns]\d+")


def host_namespace(prefix: str, host: int) -> str:
    return f"{prefix}-n{host}"


def switch_namespace(prefix: str, index: int) -> str:
    return f"{prefix}-s{index}"


def _subnet(subnet: str, num_hosts: int) -> ipaddress.IPv4Network:
    try:
        net = ipaddress.ip_network(subnet)
    except ValueError:
        net = None
    if not isinstance(net, ipaddress.IPv4Network) or not net.subnet_of(ALLOWED_SUPERNET):
        raise ConfigError("testbed.subnet", subnet, f"an IPv4 network inside {ALLOWED_SUPERNET}")
    if net.num_addresses - 2 < num_hosts:
        raise ConfigError("testbed.subnet", subnet, f"room for {num_hosts} host addresses")
    return net


def _shaping(topo: Topology, u: str, v: str) -> Shaping:
    data = topo.graph.edges[u, v]
    return Shaping(rate_bytes_per_s=float(data["bandwidth_bytes_per_s"]), delay_s=float(data.get("latency_s", 0.0)))


def _network_switches(topo: Topology) -> list[str]:
    switches = [n for n, d in topo.graph.nodes(data=True) if d.get("kind") == "switch" and "host" not in d]
    if not switches:
        raise ConfigError(f"topology {topo.name}", "no network switch", "a testbed topology (builder: testbed)")
    net = nx.Graph(topo.graph.subgraph(switches).to_undirected())
    if not nx.is_tree(net):
        raise ConfigError(
            f"topology {topo.name} switch links",
            sorted(net.edges()),
            "a loop-free connected switch graph (the emulator bridges all switches into "
            "one L2 domain; loops would need routed switches, which it does not build)",
        )
    return switches


def _host_nics(topo: Topology, switches: list[str]) -> dict[int, tuple[str, str]]:
    """host -> (its one NIC, the network switch that NIC is linked to)."""
    nics: dict[int, tuple[str, str]] = {}
    for n, d in topo.graph.nodes(data=True):
        if d.get("kind") != "nic":
            continue
        if d["host"] in nics:
            raise ConfigError(
                f"topology {topo.name}", f"host {d['host']} has several NICs", "one NIC per node (builder: testbed)"
            )
        ups = [s for s in topo.graph.successors(n) if s in switches]
        if len(ups) != 1:
            raise ConfigError(f"topology {topo.name}", f"NIC {n} linked to {ups}", "exactly one network switch")
        nics[int(d["host"])] = (n, ups[0])
    hosts = sorted({topo.host_of(g) for g in topo.gpus})
    missing = [h for h in hosts if h not in nics]
    if missing:
        raise ConfigError(f"topology {topo.name}", f"hosts {missing} without a NIC", "one NIC per node")
    return {h: nics[h] for h in hosts}


def make_plan(topo: Topology, prefix: str = "pst", subnet: str = DEFAULT_SUBNET) -> TestbedPlan:
    """Namespaces, links (with per-direction shaping), host addresses and the rank map of `topo`."""
    check_prefix(prefix)
    switches = _network_switches(topo)
    switch_index = {s: i for i, s in enumerate(switches)}
    nics = _host_nics(topo, switches)
    net = _subnet(subnet, len(nics))
    addresses = list(net.hosts())
    hosts = tuple(
        HostPlan(
            host=h,
            namespace=host_namespace(prefix, h),
            ip=str(addresses[i]),
            interface=HOST_INTERFACE,
            switch=nics[h][1],
        )
        for i, h in enumerate(nics)
    )
    switch_plans = tuple(
        SwitchPlan(name=s, namespace=switch_namespace(prefix, i), bridge=BRIDGE) for i, s in enumerate(switches)
    )
    links: list[LinkPlan] = []
    for host in hosts:
        nic, sw = nics[host.host]
        links.append(
            LinkPlan(
                name=f"{nic}-{sw}",
                kind=topo.graph.edges[nic, sw].get("link_kind", "nic"),
                a=LinkEnd(namespace=host.namespace, interface=HOST_INTERFACE),
                b=LinkEnd(namespace=switch_namespace(prefix, switch_index[sw]), interface=f"h{host.host}"),
                a_to_b=_shaping(topo, nic, sw),
                b_to_a=_shaping(topo, sw, nic),
            )
        )
    done: set[frozenset[str]] = set()
    for u, v in topo.graph.edges():
        if u in switch_index and v in switch_index and frozenset((u, v)) not in done:
            done.add(frozenset((u, v)))
            iu, iv = switch_index[u], switch_index[v]
            links.append(
                LinkPlan(
                    name=f"{u}-{v}",
                    kind=topo.graph.edges[u, v].get("link_kind", "local"),
                    a=LinkEnd(namespace=switch_namespace(prefix, iu), interface=f"s{iv}"),
                    b=LinkEnd(namespace=switch_namespace(prefix, iv), interface=f"s{iu}"),
                    a_to_b=_shaping(topo, u, v),
                    b_to_a=_shaping(topo, v, u),
                )
            )
    by_host = {h.host: h for h in hosts}
    ranks = tuple(
        RankPlan(
            rank=r,
            gpu=g,
            host=topo.host_of(g),
            namespace=by_host[topo.host_of(g)].namespace,
            ip=by_host[topo.host_of(g)].ip,
        )
        for r, g in enumerate(topo.gpus)
    )
    return TestbedPlan(
        prefix=prefix,
        topology=topo.name,
        subnet=str(net),
        hosts=hosts,
        switches=switch_plans,
        links=tuple(links),
        ranks=ranks,
    )


def plan_from_dict(d: dict) -> TestbedPlan:
    """Inverse of TestbedPlan.to_dict (reads the plan back from a state file)."""

    def link(x: dict) -> LinkPlan:
        return LinkPlan(
            name=x["name"],
            kind=x["kind"],
            a=LinkEnd(**x["a"]),
            b=LinkEnd(**x["b"]),
            a_to_b=Shaping(**x["a_to_b"]),
            b_to_a=Shaping(**x["b_to_a"]),
        )

    return TestbedPlan(
        prefix=d["prefix"],
        topology=d["topology"],
        subnet=d["subnet"],
        hosts=tuple(HostPlan(**h) for h in d["hosts"]),
        switches=tuple(SwitchPlan(**s) for s in d["switches"]),
        links=tuple(link(x) for x in d["links"]),
        ranks=tuple(RankPlan(**r) for r in d["ranks"]),
    )
