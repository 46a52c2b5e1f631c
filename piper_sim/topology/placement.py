"""Placement of ranks onto GPUs: the registry of policies and the policies contiguous, explicit,
switch-packed and scattered.

A policy is `f(topology, num_ranks, options) -> list[str]` (GPU name per rank). Options come from the
config's `placement` key: a name, or a mapping {policy: name, seed: int, nodes: [host indices]}, or
an explicit list of host indices (ranks fill each listed node's GPUs in order). Also owns host
locality (dragonfly group and switch of each compute node). Must not import simpy or torch.

Locality comes from the GPU attributes `group` and `switch` that the structured builders set (dragonfly:
group and home switch; DGX SuperPOD: the scalable unit for both); other topologies fall back to the
first network switch a host's NIC is wired to, group 0.

- switch-packed: fill nodes switch by switch, group by group. Options: `nodes` (the free nodes of a busy
  machine, default all). Groups with the most candidate nodes come first, then, inside a group, the
  switches with the most; so a job spans as few switches and groups as the candidates allow. On an
  empty machine this is the contiguous order.
- scattered: a seeded random set of nodes, as a busy machine's allocation; ranks fill the chosen
  nodes in node-index order (as Slurm numbers them). Options: `seed` (default 0).

Allocation (which nodes of the whole machine the job gets; the dragonfly builders' `allocation` parameter;
the machine has num_groups groups of nodes_per_group nodes, positions numbered group by group):
- "contiguous": the first nodes of the machine (an idle machine);
- {policy: spread, groups: K, seed: S}: K groups drawn (seeded) from the machine, the job's nodes split
  evenly over them, each group's share from its first node on (a busy scheduler placing a job in the
  fragments left in several cabinets);
- {policy: random, seed: S}: nodes drawn (seeded) from the whole machine (a fully fragmented machine);
- a list of machine node positions.
The topology's hosts are the allocated nodes in machine order.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable

from piper_sim.errors import ConfigError
from piper_sim.registry import Registry
from piper_sim.topology.graph import Topology

Policy = Callable[[Topology, int, dict], list[str]]
PLACEMENTS: Registry[Policy] = Registry("placement")
OPTIONS: dict[str, tuple[str, ...]] = {}  # policy -> the keys its mapping may hold besides `policy`


def register_placement(name: str, options: tuple[str, ...] = ()) -> Callable[[Policy], Policy]:
    """Register a policy under `name`; `options`: the keys of its placement mapping (others are refused)."""
    OPTIONS[name] = options
    return PLACEMENTS.register(name)


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
    raise ConfigError(
        "placement",
        f"{len(host_order)} nodes",
        f"enough nodes for {num_ranks} ranks (the machine has {topo.num_gpus} GPUs)",
    )


@register_placement("contiguous")
def place_contiguous(topo: Topology, num_ranks: int, options: dict) -> list[str]:
    return fill_hosts(topo, num_ranks, sorted(gpus_by_host(topo)))


@register_placement("explicit", ("nodes",))
def place_explicit(topo: Topology, num_ranks: int, options: dict) -> list[str]:
    nodes = options.get("nodes")
    if not isinstance(nodes, list) or not all(isinstance(n, int) for n in nodes):
        raise ConfigError("placement.nodes", nodes, "a list of node indices")
    if len(set(nodes)) != len(nodes):
        raise ConfigError("placement.nodes", nodes, "distinct node indices")
    return fill_hosts(topo, num_ranks, nodes)


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
        switches = sorted(
            n for n in graph.successors(name) if graph.nodes[n].get("kind") == "switch" and "host" not in graph.nodes[n]
        )
        if switches:
            found[host] = (int(graph.nodes[switches[0]].get("group", 0)), switches[0])
    return {h: found.get(h, (0, f"host{h}")) for h in hosts}


def _check_options(options: dict, allowed: tuple[str, ...], policy: str) -> None:
    unknown = sorted(set(options) - {"policy", *allowed})
    if unknown:
        raise ConfigError(
            f"placement.{unknown[0]}", options[unknown[0]], f"options of {policy}: {', '.join(('policy', *allowed))}"
        )


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


@register_placement("switch-packed", ("nodes",))
def place_switch_packed(topo: Topology, num_ranks: int, options: dict) -> list[str]:
    """Fill nodes switch by switch, group by group, fullest group and switch first."""
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


@register_placement("scattered", ("seed",))
def place_scattered(topo: Topology, num_ranks: int, options: dict) -> list[str]:
    """A seeded random choice of just enough nodes; ranks fill them in node-index order."""
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


def place(topo: Topology, num_ranks: int, spec: str | list | dict) -> list[str]:
    """GPU name per rank for the config's placement value."""
    if isinstance(spec, list):
        options: dict = {"policy": "explicit", "nodes": spec}
    elif isinstance(spec, str):
        options = {"policy": spec}
    elif isinstance(spec, dict):
        options = dict(spec)
    else:
        raise ConfigError("placement", spec, "a policy name, a list of node indices or a mapping")
    name = options.get("policy", "contiguous")
    key = "placement.policy" if isinstance(spec, dict) else "placement"
    if not isinstance(name, str):
        raise ConfigError(key, name, f"one of {', '.join(PLACEMENTS.names())}")
    policy = PLACEMENTS.get(name, key)
    _check_options(options, OPTIONS.get(name, ()), name)
    if num_ranks > topo.num_gpus:
        raise ConfigError("placement", num_ranks, f"at most {topo.num_gpus} ranks on {topo.name}")
    return policy(topo, num_ranks, options)


def check_tensor_groups(topo: Topology, placement: list[str], tp: int) -> None:
    """Refuse a placement that splits a tensor-parallel group (tp consecutive ranks) over nodes: its
    collectives run once per layer and are meant for the node's links (docs/tensor-parallel.md)."""
    if tp == 1:
        return
    for first in range(0, len(placement), tp):
        hosts = {topo.host_of(gpu) for gpu in placement[first : first + tp]}
        if len(hosts) > 1:
            per_node = len(gpus_by_host(topo)[topo.host_of(placement[first])])
            raise ConfigError(
                "parallel.tp",
                tp,
                f"a tensor-parallel group inside one node: ranks {first}.."
                f"{first + tp - 1} land on nodes {sorted(hosts)} of {topo.name} ({per_node} GPUs "
                "per node); use a tp that divides the GPUs of a node and a placement that fills "
                "nodes in rank order",
            )


# ---- allocation on the machine -------------------------------------------------------------------
Allocation = Callable[[int, int | None, int, dict, str], list[int]]
ALLOCATIONS: Registry[Allocation] = Registry("allocation")


def _machine_groups(num_groups: int | None, policy: str, where: str) -> int:
    if num_groups is None:
        raise ConfigError(where, policy, "num_groups (the machine's size) for a spread or random allocation")
    return num_groups


def _seed(options: dict, where: str) -> int:
    seed = options.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"{where}.seed", seed, "an integer")
    return seed


@ALLOCATIONS.register("contiguous")
def allocate_contiguous(num_nodes: int, num_groups: int | None, per_group: int, options: dict, where: str) -> list[int]:
    return list(range(num_nodes))


@ALLOCATIONS.register("spread")
def allocate_spread(num_nodes: int, num_groups: int | None, per_group: int, options: dict, where: str) -> list[int]:
    machine = _machine_groups(num_groups, "spread", where)
    k = options.get("groups")
    if isinstance(k, bool) or not isinstance(k, int) or not -(-num_nodes // per_group) <= k <= min(machine, num_nodes):
        raise ConfigError(
            f"{where}.groups",
            k,
            f"an integer from {-(-num_nodes // per_group)} (the groups "
            f"{num_nodes} nodes need) to {min(machine, num_nodes)}",
        )
    groups = sorted(random.Random(_seed(options, where)).sample(range(machine), k))
    share = [num_nodes // k + (i < num_nodes % k) for i in range(k)]
    return [g * per_group + n for g, count in zip(groups, share, strict=True) for n in range(count)]


@ALLOCATIONS.register("random")
def allocate_random(num_nodes: int, num_groups: int | None, per_group: int, options: dict, where: str) -> list[int]:
    machine = _machine_groups(num_groups, "random", where)
    return sorted(random.Random(_seed(options, where)).sample(range(machine * per_group), num_nodes))


def allocate(spec: str | list | dict, num_nodes: int, num_groups: int | None, per_group: int, where: str) -> list[int]:
    """Machine node positions of the job's nodes, ascending (see the module docstring)."""
    if isinstance(spec, list):
        total = None if num_groups is None else num_groups * per_group
        if (
            not all(
                isinstance(n, int) and not isinstance(n, bool) and n >= 0 and (total is None or n < total) for n in spec
            )
            or len(set(spec)) != len(spec)
            or len(spec) != num_nodes
        ):
            raise ConfigError(
                where, spec, f"{num_nodes} distinct machine node positions" + (f" in 0..{total - 1}" if total else "")
            )
        return sorted(spec)
    options = {"policy": spec} if isinstance(spec, str) else dict(spec) if isinstance(spec, dict) else None
    if options is None:
        raise ConfigError(
            where,
            spec,
            "contiguous, {policy: spread, groups, seed}, {policy: random, seed} or a list of machine node positions",
        )
    policy = str(options.pop("policy", "contiguous"))
    allowed = {"contiguous": set(), "spread": {"groups", "seed"}, "random": {"seed"}}.get(policy, set())
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}", options[unknown[0]], f"options of {policy}: {sorted(allowed)}")
    return ALLOCATIONS.get(policy, where)(num_nodes, num_groups, per_group, options, where)
