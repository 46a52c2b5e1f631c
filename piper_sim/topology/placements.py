"""Placement policies "switch-packed" and "scattered" (registered into placement.PLACEMENTS).

Owns host locality (dragonfly group and switch of each compute node) and the two policies. Must not
import simpy or torch. "contiguous" and "explicit" live in piper_sim.topology.placement.

Locality comes from the GPU attributes `group` and `switch` that the structured builders set (dragonfly:
group and home switch; DGX SuperPOD: the scalable unit for both); other topologies fall back to the
first network switch a host's NIC is wired to, group 0.

- switch-packed: fill nodes switch by switch, group by group. Options: `nodes` (the free nodes of a busy
  machine, default all). Groups with the most candidate nodes come first, then, inside a group, the
  switches with the most; so a job spans as few switches and groups as the candidates allow. On an
  empty machine this is the contiguous order.
- scattered: a seeded random set of nodes, as a busy machine's allocation; ranks fill the chosen
  nodes in node-index order (as Slurm numbers them). Options: `seed` (default 0).
"""

from __future__ import annotations

import random
from collections import Counter

from piper_sim.errors import ConfigError
from piper_sim.topology.graph import Topology
from piper_sim.topology.placement import fill_hosts, gpus_by_host, register_placement


def host_locality(topo: Topology) -> dict[int, tuple[int, str]]:
    """(group, switch) of every host, from GPU attributes or, failing that, the host's NIC wiring."""
    out: dict[int, tuple[int, str]] = {}
    missing: set[int] = set()
    for gpu in topo.gpus:
        data = topo.graph.nodes[gpu]
        host = int(data["host"])
        if "switch" in data:
            out.setdefault(host, (int(data.get("group", 0)), str(data["switch"])))
        else:
            missing.add(host)
    if missing - set(out):
        out.update(_locality_from_wiring(topo, missing - set(out)))
    return out


def _locality_from_wiring(topo: Topology, hosts: set[int]) -> dict[int, tuple[int, str]]:
    graph, found = topo.graph, {}
    for name, data in graph.nodes(data=True):
        host = data.get("host")
        if data.get("kind") != "nic" or host not in hosts or host in found:
            continue
        switches = sorted(n for n in graph.successors(name)
                          if graph.nodes[n].get("kind") == "switch" and "host" not in graph.nodes[n])
        if switches:
            found[host] = (int(graph.nodes[switches[0]].get("group", 0)), switches[0])
    return {h: found.get(h, (0, f"host{h}")) for h in hosts}


def _check_options(options: dict, allowed: tuple[str, ...], policy: str) -> None:
    unknown = sorted(set(options) - {"policy", *allowed})
    if unknown:
        raise ConfigError(f"placement.{unknown[0]}", options[unknown[0]],
                          f"options of {policy}: {', '.join(('policy', *allowed))}")


def _candidate_hosts(topo: Topology, options: dict) -> list[int]:
    hosts = sorted(gpus_by_host(topo))
    nodes = options.get("nodes")
    if nodes is None:
        return hosts
    if not isinstance(nodes, list) or not all(isinstance(n, int) and not isinstance(n, bool) for n in nodes):
        raise ConfigError("placement.nodes", nodes, "a list of node indices")
    if len(set(nodes)) != len(nodes):
        raise ConfigError("placement.nodes", nodes, "distinct node indices")
    for n in nodes:
        if not 0 <= n < len(hosts):
            raise ConfigError("placement.nodes", n, f"a node index in 0..{len(hosts) - 1}")
    return sorted(nodes)


@register_placement("switch-packed")
def place_switch_packed(topo: Topology, num_ranks: int, options: dict) -> list[str]:
    """Fill nodes switch by switch, group by group, fullest group and switch first."""
    _check_options(options, ("nodes",), "switch-packed")
    hosts = _candidate_hosts(topo, options)
    locality = host_locality(topo)
    per_group = Counter(locality[h][0] for h in hosts)
    per_switch = Counter(locality[h] for h in hosts)
    first_host: dict[tuple[int, str], int] = {}
    for h in hosts:
        first_host.setdefault(locality[h], h)

    def order(h: int) -> tuple:
        group, switch = locality[h]
        return (-per_group[group], group, -per_switch[(group, switch)], first_host[(group, switch)], h)

    return fill_hosts(topo, num_ranks, sorted(hosts, key=order))


@register_placement("scattered")
def place_scattered(topo: Topology, num_ranks: int, options: dict) -> list[str]:
    """A seeded random choice of just enough nodes; ranks fill them in node-index order."""
    _check_options(options, ("seed",), "scattered")
    seed = options.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError("placement.seed", seed, "an integer")
    hosts = gpus_by_host(topo)
    order = sorted(hosts)
    random.Random(seed).shuffle(order)
    chosen, count = [], 0
    for h in order:
        if count >= num_ranks:
            break
        chosen.append(h)
        count += len(hosts[h])
    return fill_hosts(topo, num_ranks, sorted(chosen))
