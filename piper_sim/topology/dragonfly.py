"""The dragonfly switch fabric (HPE Slingshot style): the whole machine behind a job.

Owns DragonflySpec and DragonflyFabric: which groups exist, where hosts and NICs attach, the switch graph
(local and global links, background load) and the minimal / Valiant / adaptive switch paths. Parameters
are read in build_dragonfly.py. Must not import simpy or torch.

Structure (Kim et al., "Technology-Driven, Highly-Scalable Dragonfly Topology", ISCA 2008; Slingshot:
De Sensi et al., SC 2020): the machine has `num_groups` groups of `switches_per_group` switches joined
all-to-all by local links and `global_links_per_group_pair` global links between every pair of groups.
Switch s of group g is "g{g}.sw{s}". The job's hosts sit at machine node positions (`positions`, from the
allocation policy): position p is in group p // nodes_per_group on home switch (p mod nodes_per_group) //
nodes_per_switch. With nic_switch_spread, NIC k of a host on home switch s goes to switch base + (s + k)
mod K of its block of K = nics_per_node switches (an HPE Cray EX chassis: 16 nodes on 4 switches, each
node's 4 NICs on the 4 switches); otherwise all NICs sit on the home switch. Global link l between groups
g and p leaves switch (r * L + l) mod S of group g, r being p's rank among g's peers.

Scope. Job groups hold the job's hosts and are built whole. With network_scope "machine" the other
groups of the machine carry the job's non-minimal traffic: such an outside group is built as the switches
its global links to job groups land on, all-to-all joined, and those global links (links between two
outside groups carry none of the job's traffic and are not built). With outside_groups "aggregate", outside
groups that attach to every job group at the same switches on both ends (the same "signature") are one
class: one representative is built with its links' capacity times the class size, and mean-field detours
through it count the class size (piper_sim.topology.spread). Swapping two groups of a class maps the job's
network onto itself, so this orbit quotient is exact for the mean-field routing; hashed detours (one
outside group per GPU pair) need the exact groups (outside_groups "exact"). With network_scope "job" only
the job groups exist (non-minimal routes see only them). With a single job group no route leaves it and
outside groups are not built.

Background load: other jobs' traffic on global links, as a fraction of each link's capacity taken away
(a number), or a seeded random fraction per cable, uniform in [0, 2 x mean].

Routing (switch-to-switch hops): "minimal" = local, global, local (<= 3), split equally over the L global
links of the group pair; "valiant" = through an intermediate group of the transit set (machine scope: every
other group of the machine; job scope: the other job groups), <= 5 hops, chosen per GPU pair by a seeded
hash (inside one group: through an intermediate switch); "adaptive" = a split, adaptive_minimal_fraction on the
minimal paths and the rest on the Valiant path: a fixed share, or "auto", the share that balances the minimal
and the idle non-minimal links (minimal_fraction). With no intermediate group Valiant falls back to minimal.
valiant "hashed" (default) takes one detour per GPU pair as above; "spread" spreads the Valiant share over
every detour as a fluid (piper_sim.topology.spread: sub-flows that count 1/K of a flow each in the max-min
sharing, so weighted_switch_paths carries a flow weight per path; switch_paths gives their byte shares).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import cached_property

import networkx as nx
import numpy as np

from piper_sim.errors import ConfigError
from piper_sim.topology.spread import WeightedSwitchPaths, spread_switch_paths
from piper_sim.topology.structured import SwitchPaths, dedupe


@dataclass(frozen=True, kw_only=True)
class DragonflySpec:
    num_groups: int  # groups of the machine
    switches_per_group: int
    nodes_per_switch: int
    nics_per_node: int
    nic_switch_spread: bool
    global_links_per_group_pair: int
    routing: str = "minimal"
    valiant: str = "hashed"  # or "spread": the mean-field detours of piper_sim.topology.spread
    adaptive_minimal_fraction: float | str = 0.5  # or "auto" (DragonflyFabric.minimal_fraction)
    positions: tuple[int, ...] = ()  # machine node position of every host (empty: host h at position h)
    network_scope: str = "machine"
    outside_groups: str = "exact"
    background: float | tuple[float, int] = 0.0  # fraction, or (mean, seed) of a random fraction per cable

    @property
    def nodes_per_group(self) -> int:
        return self.switches_per_group * self.nodes_per_switch


class DragonflyFabric:
    """Switch layer of a dragonfly; implements structured.SwitchFabric."""

    def __init__(self, spec: DragonflySpec, num_hosts: int) -> None:
        self.spec = spec
        self.positions = spec.positions or tuple(range(num_hosts))
        self.job_groups = tuple(sorted({p // spec.nodes_per_group for p in self.positions}))
        machine = spec.network_scope == "machine" and len(self.job_groups) > 1
        others = [g for g in range(spec.num_groups) if g not in set(self.job_groups)] if machine else []
        self.transit = tuple(sorted(self.job_groups + tuple(others)))
        self._transit_pos = {g: n for n, g in enumerate(self.transit)}
        # outside group -> (representative, class size); exact groups represent themselves
        self.outside: dict[int, tuple[int, int]] = self._outside_classes(others)
        self.built_groups = tuple(sorted(self.job_groups + tuple({r for r, _ in self.outside.values()})))
        self._where = {self.switch_name(g, s): (g, s) for g in self.built_groups for s in self._switches_of(g)}
        self._minimal_cache: dict[tuple[str, str], SwitchPaths] = {}
        self._spread_paths: dict[tuple[str, str], WeightedSwitchPaths] = {}

    # ---- structure -------------------------------------------------------------------------------
    @staticmethod
    def switch_name(group: int, switch_index: int) -> str:
        return f"g{group}.sw{switch_index}"

    def locate(self, switch: str) -> tuple[int, int]:
        """(group, switch index) of a built switch."""
        return self._where[switch]

    def home(self, host: int) -> tuple[int, int]:
        group, local = divmod(self.positions[host], self.spec.nodes_per_group)
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

    def _switches_of(self, group: int) -> list[int]:
        if group in self.job_groups:
            return list(range(self.spec.switches_per_group))
        links = range(self.spec.global_links_per_group_pair)
        return sorted({self.global_endpoint(group, j, link) for j in self.job_groups for link in links})

    def _outside_classes(self, others: list[int]) -> dict[int, tuple[int, int]]:
        if self.spec.outside_groups == "exact" or not others:
            return {m: (m, 1) for m in others}
        links = range(self.spec.global_links_per_group_pair)
        classes: dict[tuple, list[int]] = {}
        for m in others:
            key = tuple(
                (
                    tuple(self.global_endpoint(j, m, link) for link in links),
                    tuple(self.global_endpoint(m, j, link) for link in links),
                    tuple(self.background_fraction(j, m, link) for link in links),
                )
                for j in self.job_groups
            )
            classes.setdefault(key, []).append(m)
        return {m: (members[0], len(members)) for members in classes.values() for m in members}

    def background_fraction(self, g: int, peer: int, link: int) -> float:
        """Share of global cable `link` between g and peer that other jobs use."""
        bg = self.spec.background
        if isinstance(bg, tuple):
            mean, seed = bg
            a, b = min(g, peer), max(g, peer)
            return float(np.random.default_rng([seed, a, b, link]).uniform(0.0, 2.0 * mean))
        return float(bg)

    @cached_property
    def class_size(self) -> dict[int, int]:
        """Groups each built group stands for (1 for job groups and exact outside groups)."""
        sizes = {g: 1 for g in self.job_groups}
        for rep, size in self.outside.values():
            sizes[rep] = size
        return sizes

    def notes(self) -> list[str]:
        """What a reader of results must know about the modelled network."""
        spec, jobs = self.spec, len(self.job_groups)
        if spec.network_scope == "job" and spec.num_groups > jobs:
            return [
                f"network_scope job: only the job's {jobs} of the machine's {spec.num_groups} groups are "
                "modelled; non-minimal routes cross only them"
            ]
        return []

    # ---- graph -------------------------------------------------------------------------------
    def add_switches(self, graph: nx.DiGraph, p: dict) -> None:
        """Switches, all-to-all local links inside each built group, global links that carry job traffic."""
        sw = self.switch_name
        for g in self.built_groups:
            for s in self._switches_of(g):
                graph.add_node(sw(g, s), kind="switch", group=g, switch_index=s)
        for g in self.built_groups:
            local = {
                "bandwidth_bytes_per_s": p["local_bandwidth_bytes_per_s"] * self.class_size[g],
                "link_kind": "local",
                "latency_s": p["local_latency_s"] + p["switch_latency_s"],
            }
            switches = self._switches_of(g)
            for n, s in enumerate(switches):
                for t in switches[n + 1 :]:
                    graph.add_edges_from(((sw(g, s), sw(g, t)), (sw(g, t), sw(g, s))), **local)
        for g, peer in self._global_pairs():
            for link in range(self.spec.global_links_per_group_pair):
                self._add_global(graph, p, g, peer, link)

    def _global_pairs(self) -> list[tuple[int, int]]:
        jobs = set(self.job_groups)
        return [
            (g, q)
            for n, g in enumerate(self.built_groups)
            for q in self.built_groups[n + 1 :]
            if g in jobs or q in jobs
        ]

    def _add_global(self, graph: nx.DiGraph, p: dict, g: int, peer: int, link: int) -> None:
        size = max(self.class_size[g], self.class_size[peer])
        bandwidth = p["global_bandwidth_bytes_per_s"] * size * (1.0 - self.background_fraction(g, peer, link))
        latency = p["global_latency_s"] + p["switch_latency_s"]
        a = self.switch_name(g, self.global_endpoint(g, peer, link))
        b = self.switch_name(peer, self.global_endpoint(peer, g, link))
        for u, v in ((a, b), (b, a)):
            if graph.has_edge(u, v):  # more links per pair than switches: parallel cables
                graph.edges[u, v]["bandwidth_bytes_per_s"] += bandwidth
                graph.edges[u, v]["num_links"] += size
            else:
                graph.add_edge(
                    u, v, bandwidth_bytes_per_s=bandwidth, latency_s=latency, link_kind="global", num_links=size
                )

    # ---- routing -----------------------------------------------------------------------------
    def weighted_switch_paths(self, src: str, dst: str, flow_key: int) -> WeightedSwitchPaths:
        """((byte fraction per unit of weight, flow weight, switches), ...): weight 1 for every path but the
        mean-field detours of valiant spread (cached per switch pair: they do not depend on the flow)."""
        if self.spec.valiant != "spread":
            return tuple((f, 1.0, seq) for f, seq in self.switch_paths(src, dst, flow_key))
        hit = self._spread_paths.get((src, dst))
        if hit is None:
            hit = self._spread_paths[(src, dst)] = spread_switch_paths(self, src, dst)
        return hit

    def switch_paths(self, src: str, dst: str, flow_key: int) -> SwitchPaths:
        if self.spec.valiant == "spread":
            return tuple((f * w, seq) for f, w, seq in self.weighted_switch_paths(src, dst, flow_key))
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
        frac = self.minimal_fraction(self._where[src][0], self._where[dst][0])
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
            counts = Counter(self.via(g1, s1, g2, s2, None, link, link) for link in range(links))
            paths = tuple((n / links, seq) for seq, n in sorted(counts.items()))
        self._minimal_cache[(src, dst)] = paths
        return paths

    def minimal_fraction(self, g1: int, g2: int) -> float:
        """Share of a pair's bytes on its minimal paths under adaptive routing.

        A number: that share. "auto": the share that loads the minimal links and the non-minimal ones
        alike when the job alone loads them uniformly, a fluid stand-in for UGAL-style adaptive routing in
        its steady state. Between groups: the L minimal links of a group pair against, per idle group of
        the transit set (not the job's), L links out of g1 shared by g1's traffic to the J - 1 other job
        groups, each with the capacity other jobs leave: f = (J - 1) / ((J - 1) + (T - J)(1 - b)), T
        groups in the transit set, b the mean background share (1 when no idle group: minimal only).
        Inside a group, the same with switches: J the switches the job's NICs use, T the group's switches.
        """
        frac = self.spec.adaptive_minimal_fraction
        if frac != "auto":
            return float(frac)
        if g1 != g2:
            jobs, transit = len(self.job_groups), len(self.transit)
            bg = self.spec.background
            idle = (transit - jobs) * (1.0 - (bg[0] if isinstance(bg, tuple) else bg))
        else:
            jobs, idle = self.job_switches[g1], self.spec.switches_per_group - self.job_switches[g1]
        return (jobs - 1) / ((jobs - 1) + idle) if jobs > 1 and idle > 0 else 1.0

    @cached_property
    def job_switches(self) -> dict[int, int]:
        """Switches of each job group that the job's NICs attach to."""
        used: dict[int, set[int]] = {}
        for h in range(len(self.positions)):
            for k in range(self.spec.nics_per_node):
                g, s = self._where[self.nic_switch(h, k)]
                used.setdefault(g, set()).add(s)
        return {g: len(s) for g, s in used.items()}

    def intermediate(self, g1: int, g2: int, index: int) -> int:
        """The index-th group of the transit set other than g1 and g2 (the hashed Valiant choice)."""
        lo, hi = sorted((self._transit_pos[g1], self._transit_pos[g2]))
        n = index + (index >= lo)
        n += n >= hi
        return self.transit[n]

    def valiant_path(self, src: str, dst: str, flow_key: int) -> tuple[str, ...] | None:
        """Path through a hashed intermediate group (or switch, inside one group); None if none exists."""
        spec, sw = self.spec, self.switch_name
        (g1, s1), (g2, s2) = self._where[src], self._where[dst]
        if g1 == g2:
            if spec.switches_per_group < 3:
                return None
            mid = _nth_excluding(flow_key % (spec.switches_per_group - 2), {s1, s2})
            return (src, sw(g1, mid), dst)
        if len(self.transit) < 3:
            return None
        mid_group = self.intermediate(g1, g2, flow_key % (len(self.transit) - 2))
        if self.outside.get(mid_group, (mid_group, 1))[1] > 1:
            raise ConfigError(
                "topology.params.outside_groups",
                "aggregate",
                "exact for hashed Valiant detours (aggregate serves the mean-field spread)",
            )
        links = spec.global_links_per_group_pair
        first, second = (flow_key >> 20) % links, (flow_key >> 40) % links
        return self.via(g1, s1, g2, s2, mid_group, first, second)

    def via(self, g1: int, s1: int, g2: int, s2: int, mid: int | None, out_link: int, in_link: int) -> tuple[str, ...]:
        """Switches from (g1, s1) to (g2, s2): directly over global link out_link (mid None), or through
        group mid, leaving g1 over link out_link to mid and entering g2 over link in_link from mid."""
        sw, ep = self.switch_name, self.global_endpoint
        if mid is None:
            return dedupe((sw(g1, s1), sw(g1, ep(g1, g2, out_link)), sw(g2, ep(g2, g1, in_link)), sw(g2, s2)))
        rep = self.outside.get(mid, (mid, 1))[0]
        return dedupe(
            (
                sw(g1, s1),
                sw(g1, ep(g1, mid, out_link)),
                sw(rep, ep(mid, g1, out_link)),
                sw(rep, ep(mid, g2, in_link)),
                sw(g2, ep(g2, mid, in_link)),
                sw(g2, s2),
            )
        )


def _nth_excluding(n: int, excluded: set[int]) -> int:
    """The n-th non-negative integer not in `excluded`."""
    for e in sorted(excluded):
        if n >= e:
            n += 1
    return n
