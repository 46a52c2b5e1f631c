"""Placement of ranks onto GPUs: registry of policies.

A policy is `f(topology, num_ranks, options) -> list[str]` (GPU name per rank). Options come from the
config's `placement` key: a name, or a mapping {policy: name, seed: int, nodes: [host indices]}, or
an explicit list of host indices (ranks fill each listed node's GPUs in order).
"""

from __future__ import annotations

from collections.abc import Callable

from piper_sim.errors import ConfigError
from piper_sim.registry import Registry
from piper_sim.topology.graph import Topology

Policy = Callable[[Topology, int, dict], list[str]]
PLACEMENTS: Registry[Policy] = Registry("placement")
register_placement = PLACEMENTS.register


def gpus_by_host(topo: Topology) -> dict[int, list[str]]:
    hosts: dict[int, list[str]] = {}
    for gpu in topo.gpus:
        hosts.setdefault(topo.host_of(gpu), []).append(gpu)
    return hosts


def fill_hosts(topo: Topology, num_ranks: int, host_order: list[int]) -> list[str]:
    hosts = gpus_by_host(topo)
    out: list[str] = []
    for h in host_order:
        if h not in hosts:
            raise ConfigError("placement.nodes", h, f"a node index in 0..{len(hosts) - 1}")
        out.extend(hosts[h])
        if len(out) >= num_ranks:
            return out[:num_ranks]
    raise ConfigError("placement", f"{len(host_order)} nodes",
                      f"enough nodes for {num_ranks} ranks (the machine has {topo.num_gpus} GPUs)")


@register_placement("contiguous")
def place_contiguous(topo: Topology, num_ranks: int, options: dict) -> list[str]:
    return fill_hosts(topo, num_ranks, sorted(gpus_by_host(topo)))


@register_placement("explicit")
def place_explicit(topo: Topology, num_ranks: int, options: dict) -> list[str]:
    nodes = options.get("nodes")
    if not isinstance(nodes, list) or not all(isinstance(n, int) for n in nodes):
        raise ConfigError("placement.nodes", nodes, "a list of node indices")
    if len(set(nodes)) != len(nodes):
        raise ConfigError("placement.nodes", nodes, "distinct node indices")
    return fill_hosts(topo, num_ranks, nodes)


def place(topo: Topology, num_ranks: int, spec: str | list | dict) -> list[str]:
    """GPU name per rank for the config's placement value."""
    import piper_sim.topology.placements  # noqa: F401  (registers switch-packed and scattered)

    if isinstance(spec, list):
        options: dict = {"policy": "explicit", "nodes": spec}
    elif isinstance(spec, str):
        options = {"policy": spec}
    elif isinstance(spec, dict):
        options = dict(spec)
    else:
        raise ConfigError("placement", spec, "a policy name, a list of node indices or a mapping")
    policy = PLACEMENTS.get(str(options.get("policy", "contiguous")), "placement")
    if num_ranks > topo.num_gpus:
        raise ConfigError("placement", num_ranks, f"at most {topo.num_gpus} ranks on {topo.name}")
    return policy(topo, num_ranks, options)
