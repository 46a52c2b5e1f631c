"""Topology: a directed graph of GPUs, NICs and switches, with link capacities and routes.

Owns the machine's network as data plus routing over it. Must not import simpy or torch.
Every directed edge is a link with `bandwidth_bytes_per_s`, `latency_s` and a `link_kind`
(e.g. "intra", "xgmi", "nvlink", "gpu_nic", "nic", "local", "global", "up", "down").
Node attributes: `kind` ("gpu", "nic", "switch", "cpu") and, for gpus and nics, `host` (the
compute node index). Links get integer ids in insertion order; routes are tuples of link ids.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import networkx as nx
import numpy as np

from piper_sim.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class NetworkParams:
    """Costs that are not per link: per-message software overhead, paid once per message.

    shared_cores: when the ranks are processes on one machine (the emulated testbed), the number of
    cores they share; compute then runs under processor sharing (a rank gets at most one core, all
    computing ranks share shared_cores). 0: every rank has its own device.
    """

    message_overhead_s: float = 0.0
    shared_cores: int = 0


@dataclass(eq=False, kw_only=True)
class Topology:
    """A built machine. `gpus` lists GPU node names in device order (placement indexes into it)."""

    name: str
    graph: nx.DiGraph
    gpus: list[str]
    params: NetworkParams = field(default_factory=NetworkParams)
    router: Callable[[Topology, str, str], tuple[tuple[float, tuple[int, ...]], ...]] | None = None
    # the YAML `collectives` mapping (algorithm name -> unit-suffixed parameters); piper_sim.collectives reads it
    collectives: dict = field(default_factory=dict)
    # what a reader of results must know about what the model leaves out (e.g. a network smaller than the machine)
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._route_cache: dict[tuple[str, str], tuple[tuple[float, tuple[int, ...]], ...]] = {}
        self._weighted_cache: dict[tuple[str, str], tuple[tuple[float, float, tuple[int, ...]], ...]] = {}
        for u, v, data in self.graph.edges(data=True):
            bw = data.get("bandwidth_bytes_per_s")
            if bw is None or not bw > 0:
                raise ConfigError(f"topology {self.name} link {u}->{v} bandwidth", bw, "a positive number")
            if data.get("latency_s", 0.0) < 0:
                raise ConfigError(
                    f"topology {self.name} link {u}->{v} latency", data["latency_s"], "a non-negative number"
                )

    # ---- links ---------------------------------------------------------------------------------
    @cached_property
    def links(self) -> list[tuple[str, str]]:
        return list(self.graph.edges())

    @cached_property
    def link_index(self) -> dict[tuple[str, str], int]:
        return {edge: i for i, edge in enumerate(self.links)}

    @cached_property
    def capacity_bytes_per_s(self) -> np.ndarray:
        return np.array([self.graph.edges[e]["bandwidth_bytes_per_s"] for e in self.links], dtype=float)

    @cached_property
    def latency_s(self) -> np.ndarray:
        return np.array([self.graph.edges[e].get("latency_s", 0.0) for e in self.links], dtype=float)

    @cached_property
    def link_kinds(self) -> list[str]:
        return [self.graph.edges[e].get("link_kind", "link") for e in self.links]

    @cached_property
    def reverse_link(self) -> np.ndarray:
        """Per link, the id of the link back (v->u for u->v) when it has the same capacity, else -1: a flow set and
        its mirror image (every path reversed) over such links are the same max-min problem (network.mirror)."""
        back = [self.link_index.get((v, u), -1) for u, v in self.links]
        cap = self.capacity_bytes_per_s
        return np.array([b if b >= 0 and cap[b] == cap[i] else -1 for i, b in enumerate(back)], dtype=np.int64)

    @property
    def num_gpus(self) -> int:
        return len(self.gpus)

    def host_of(self, gpu: str) -> int:
        return int(self.graph.nodes[gpu]["host"])

    @cached_property
    def num_hosts(self) -> int:
        return len({self.host_of(g) for g in self.gpus})

    # ---- routing -------------------------------------------------------------------------------
    def paths(self, src: str, dst: str) -> tuple[tuple[float, tuple[int, ...]], ...]:
        """Weighted paths from src to dst: ((fraction, link ids), ...), fractions summing to 1.

        Default: one shortest path by hop count, ties broken by lowest total latency then by
        node names, so routes are deterministic. Builders with multipath routing (ECMP, dragonfly
        adaptive) pass a `router`.
        """
        key = (src, dst)
        cached = self._route_cache.get(key)
        if cached is not None:
            return cached
        if src == dst:
            result: tuple[tuple[float, tuple[int, ...]], ...] = ((1.0, ()),)
        else:
            if getattr(self.router, "weighted", None) is not None:  # one routing pass serves both views
                result = tuple((f * w, links) for f, w, links in self.weighted_paths(src, dst))
            elif self.router is not None:
                result = self.router(self, src, dst)
            else:
                result = ((1.0, self._shortest_links(src, dst)),)
        self._route_cache[key] = result
        return result

    def weighted_paths(self, src: str, dst: str) -> tuple[tuple[float, float, tuple[int, ...]], ...]:
        """paths() with how many flows each path counts as in the max-min sharing: ((fraction, weight,
        link ids), ...), the path moving fraction x weight of the bytes. The weight is 1 for every path but
        a dragonfly's mean-field detours (valiant: spread, piper_sim.topology.spread) and ECMP's equal splits (a
        fat-tree's, builders.ecmp_weighted; a DGX rail tree's spines, build_dgx.RailFatTree), 1/K of a flow each."""
        weighted = getattr(self.router, "weighted", None)
        if weighted is None or src == dst:
            return tuple((f, 1.0, links) for f, links in self.paths(src, dst))
        key = (src, dst)
        cached = self._weighted_cache.get(key)
        if cached is None:
            cached = self._weighted_cache[key] = weighted(self, src, dst)
        return cached

    def _shortest_links(self, src: str, dst: str) -> tuple[int, ...]:
        try:
            nodes = nx.shortest_path(self.graph, src, dst, weight=_hop_then_latency)
        except nx.NetworkXNoPath:
            raise ConfigError(f"topology {self.name}", f"{src}->{dst}", "a connected topology") from None
        return tuple(self.link_index[(a, b)] for a, b in zip(nodes, nodes[1:], strict=False))

    def route(self, src: str, dst: str) -> tuple[int, ...]:
        """The main (largest-fraction) path from src to dst."""
        return max(self.paths(src, dst), key=lambda p: p[0])[1]

    def path_latency_s(self, links: tuple[int, ...]) -> float:
        return float(self.latency_s[list(links)].sum()) if links else 0.0

    def path_bandwidth_bytes_per_s(self, links: tuple[int, ...]) -> float:
        return float(self.capacity_bytes_per_s[list(links)].min()) if links else float("inf")


def _hop_then_latency(u: str, v: str, data: dict) -> float:
    return 1.0 + data.get("latency_s", 0.0)
