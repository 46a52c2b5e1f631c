"""Vectorized routes for many GPU pairs at once, and the host symmetry of a topology.

Owns `RouteTable` (sub-flows and their link incidences for arrays of member pairs) and `host_classes`
(which compute nodes are interchangeable). Must not import torch.

On machines with a `StructuredRouter` (Frontier, LUMI, generic dragonfly, DGX SuperPOD) a route is
node part + switch path + node part: the node parts come from per-host tables (built once per host
from the router's own cached pieces) and switch paths are fetched once per distinct (source switch,
destination switch, path choice), so no Python work is done per GPU pair. The path choice of the
dragonfly's hashed Valiant detour is a function of the router's per-pair key (mix64, vectorized here);
tests check the table against `Topology.paths` pair by pair. Other routers fall back to
`Topology.paths` for each distinct pair.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from piper_sim.errors import PiperError
from piper_sim.network import dense_rows
from piper_sim.topology.build_dgx import RailFatTree
from piper_sim.topology.builders import ecmp_router, uniform_router
from piper_sim.topology.dragonfly import DragonflyFabric
from piper_sim.topology.graph import Topology
from piper_sim.topology.spread import Closures, closure_blocks, spread_switch_paths
from piper_sim.topology.structured import StructuredRouter, _chain_ids

U64 = np.uint64
GOLDEN = U64(0x9E3779B97F4A7C15)


def mix64_array(*values: np.ndarray | int) -> np.ndarray:
    """structured.mix64 applied element-wise (same splitmix64 steps on uint64 arrays)."""
    arrays = [np.asarray(v).astype(np.int64).astype(U64) for v in values]
    state = np.full(np.broadcast_shapes(*(a.shape for a in arrays)), GOLDEN, dtype=U64)
    with np.errstate(over="ignore"):
        for value in arrays:
            state = (state ^ value) + GOLDEN
            z = (state ^ (state >> U64(30))) * U64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> U64(27))) * U64(0x94D049BB133111EB)
            state = z ^ (z >> U64(31))
    return state


class TooManyFlows(PiperError):
    """More flows than the caller's memory budget allows."""


@dataclass(frozen=True, kw_only=True)
class SubFlows:
    """One row per path of a pair: pair index, share of the pair's bytes, path latency; incidences.

    weight is how many flows the row counts as in the max-min sharing (1, or 1/K for a mean-field
    detour); the row moves fraction x pair bytes x weight bytes.
    """

    pair: np.ndarray
    fraction: np.ndarray
    latency_s: np.ndarray
    entry_flow: np.ndarray
    entry_link: np.ndarray
    weight: np.ndarray


def _pad(rows: Sequence[tuple[int, ...]]) -> np.ndarray:
    width = max((len(r) for r in rows), default=0)
    out = np.full((len(rows), max(width, 1)), -1, dtype=np.int64)
    for n, row in enumerate(rows):
        out[n, : len(row)] = row
    return out


def _from_matrix(
    table: np.ndarray, pair: np.ndarray, fraction: np.ndarray, latency: np.ndarray, weight: np.ndarray | None = None
) -> SubFlows:
    valid = table >= 0
    rows = np.repeat(np.arange(table.shape[0]), valid.sum(axis=1))
    links = table[valid]
    lat = np.bincount(rows, weights=latency[links], minlength=table.shape[0])
    return SubFlows(
        pair=pair,
        fraction=fraction,
        latency_s=lat,
        entry_flow=rows,
        entry_link=links,
        weight=np.ones(pair.size) if weight is None else weight,
    )


class RouteTable:
    """Routes between members (GPU names in member order) of one topology."""

    def __init__(
        self, topo: Topology, gpus: Sequence[str], *, spread: bool = False, max_sub_flows: int | None = None
    ) -> None:
        """spread=True: mean-field Valiant detours on dragonflies (piper_sim.topology.spread).

        max_sub_flows: refuse (TooManyFlows) to route more paths than this (memory grows ~1 KB per path).
        """
        self.topo, self.gpus, self.max_sub_flows = topo, list(gpus), max_sub_flows
        nodes = topo.graph.nodes
        self.host = np.array([int(nodes[g]["host"]) for g in self.gpus], dtype=np.int64)
        self.local = np.array([int(nodes[g].get("local_index", 0)) for g in self.gpus], dtype=np.int64)
        self.structured = isinstance(topo.router, StructuredRouter)
        self.spread = spread and self.structured and isinstance(topo.router.fabric, DragonflyFabric)
        self.closures: Closures = {}
        self._closures_key: frozenset = frozenset()

    def merge_detours(self, generators: list[dict[str, str]]) -> None:
        """Merge each pair's mean-field detours that these automorphisms of the whole flow set (verified,
        studies.symmetry) map onto each other (topology.spread.all_detours); the caller's link orbits must be
        those of the same automorphisms."""
        if self.spread:
            self.closures = closure_blocks(self.topo.router.fabric, generators)
            self._closures_key = frozenset(frozenset(sigma.items()) for sigma in generators)

    def sub_flows(self, src: np.ndarray, dst: np.ndarray) -> SubFlows:
        if self.structured:
            return self._structured(np.asarray(src), np.asarray(dst))
        return self._generic(np.asarray(src), np.asarray(dst))

    # ---- generic: Topology.paths per distinct pair ----------------------------------------------
    def _generic(self, src: np.ndarray, dst: np.ndarray) -> SubFlows:
        rows: list[tuple[int, ...]] = []
        pair: list[int] = []
        frac: list[float] = []
        for p, (s, d) in enumerate(zip(src.tolist(), dst.tolist(), strict=True)):
            for f, links in self.topo.paths(self.gpus[s], self.gpus[d]):
                if self.max_sub_flows is not None and len(rows) >= self.max_sub_flows:
                    raise TooManyFlows(f"more than {self.max_sub_flows:,} paths to route")
                rows.append(links)
                pair.append(p)
                frac.append(f)
        return _from_matrix(_pad(rows), np.array(pair, dtype=np.int64), np.array(frac), self.topo.latency_s)

    # ---- structured: node part + switch path + node part ----------------------------------------
    def _structured(self, src: np.ndarray, dst: np.ndarray) -> SubFlows:
        router: StructuredRouter = self.topo.router  # type: ignore[assignment]
        node, fabric, index = router.node, router.fabric, self.topo.link_index
        hosts, hpos = np.unique(np.concatenate([self.host[src], self.host[dst]]), return_inverse=True)
        hs, hd = hpos[: src.size], hpos[src.size :]
        i, j = self.local[src], self.local[dst]
        g, k = node.gpus_per_node, node.nics_per_node
        nics = np.array([[node.route_nics(a, b) for b in range(g)] for a in range(g)], dtype=np.int64)
        ks, kd = nics[i, j, 0], nics[i, j, 1]
        intra = _pad(
            [
                _chain_ids(index, [f"n{h}.{x}" for x in node.gpu_paths[(a, b)]]) if a != b else ()
                for h in hosts.tolist()
                for a in range(g)
                for b in range(g)
            ]
        )
        up = _pad(
            [
                router._up_ids(index, h, a, c) if (a, c) in node.nic_paths else ()
                for h in hosts.tolist()
                for a in range(g)
                for c in range(k)
            ]
        )
        down = _pad(
            [
                router._down_ids(index, h, c, b) if (b, c) in node.nic_paths else ()
                for h in hosts.tolist()
                for c in range(k)
                for b in range(g)
            ]
        )
        names = [fabric.nic_switch(h, c) for h in hosts.tolist() for c in range(k)]
        switch_names, switch_of = np.unique(np.array(names), return_inverse=True)
        sw_s, sw_d = switch_of[hs * k + ks], switch_of[hd * k + kd]
        same = hs == hd
        same_idx = np.flatnonzero(same)
        other_idx = np.flatnonzero(~same)
        key = mix64_array(router.seed, self.host[src[other_idx]], i[other_idx], self.host[dst[other_idx]], j[other_idx])
        choice = (
            np.full(other_idx.size, -1, dtype=np.int64)
            if self.spread
            else self._choice(fabric, switch_names, sw_s[other_idx], sw_d[other_idx], key)
        )
        group = _dense(sw_s[other_idx], sw_d[other_idx], choice)
        first = np.unique(group, return_index=True)[1]
        chains: list[tuple[int, ...]] = []
        chain_frac: list[float] = []
        chain_weight: list[float] = []
        start, count = np.zeros(first.size, dtype=np.int64), np.zeros(first.size, dtype=np.int64)
        for u, rep in enumerate(first.tolist()):
            a, b = str(switch_names[sw_s[other_idx[rep]]]), str(switch_names[sw_d[other_idx[rep]]])
            paths = (
                self._spread_paths(fabric, a, b)
                if self.spread
                else tuple((f, 1.0, seq) for f, seq in fabric.switch_paths(a, b, int(key[rep])))
            )
            start[u], count[u] = len(chains), len(paths)
            for f, w, seq in paths:
                chains.append(router._switch_chain(index, seq))
                chain_frac.append(f)
                chain_weight.append(w)
        chain, chain_frac_arr, chain_weight_arr = _pad(chains), np.array(chain_frac), np.array(chain_weight)
        reps = count[group]
        total = int(reps.sum()) + same_idx.size
        if self.max_sub_flows is not None and total > self.max_sub_flows:
            raise TooManyFlows(f"{total:,} paths to route exceed the limit of {self.max_sub_flows:,}")
        sub_pair = np.repeat(other_idx, reps)
        path = np.repeat(start[group], reps) + np.arange(sub_pair.size) - np.repeat(np.cumsum(reps) - reps, reps)
        p_s, p_d = np.repeat(hs[other_idx], reps), np.repeat(hd[other_idx], reps)
        table = np.concatenate(
            [
                up[(p_s * g + i[sub_pair]) * k + ks[sub_pair]],
                chain[path],
                down[(p_d * k + kd[sub_pair]) * g + j[sub_pair]],
            ],
            axis=1,
        )
        inner = _from_matrix(
            intra[(hs[same_idx] * g + i[same_idx]) * g + j[same_idx]],
            same_idx,
            np.ones(same_idx.size),
            self.topo.latency_s,
        )
        outer = _from_matrix(
            table,
            sub_pair,
            chain_frac_arr[path] if path.size else np.zeros(0),
            self.topo.latency_s,
            chain_weight_arr[path] if path.size else np.zeros(0),
        )
        return SubFlows(
            pair=np.concatenate([inner.pair, outer.pair]),
            weight=np.concatenate([inner.weight, outer.weight]),
            fraction=np.concatenate([inner.fraction, outer.fraction]),
            latency_s=np.concatenate([inner.latency_s, outer.latency_s]),
            entry_flow=np.concatenate([inner.entry_flow, outer.entry_flow + inner.pair.size]),
            entry_link=np.concatenate([inner.entry_link, outer.entry_link]),
        )

    def _spread_paths(self, fabric: DragonflyFabric, a: str, b: str) -> tuple:
        """spread_switch_paths, cached on the fabric for these closures (shared by every collective on it)."""
        cache = fabric.__dict__.setdefault("_spread_cache", {})
        key = (a, b, self._closures_key)
        hit = cache.get(key)
        if hit is None:
            hit = cache[key] = spread_switch_paths(fabric, a, b, self.closures)
        return hit

    @staticmethod
    def _choice(
        fabric: object, switch_names: np.ndarray, sw_s: np.ndarray, sw_d: np.ndarray, key: np.ndarray
    ) -> np.ndarray:
        """What, besides the two switches, the switch path depends on (-1: nothing)."""
        if isinstance(fabric, RailFatTree) or (
            isinstance(fabric, DragonflyFabric) and fabric.spec.routing == "minimal"
        ):
            return np.full(sw_s.size, -1, dtype=np.int64)
        if not isinstance(fabric, DragonflyFabric):
            return key.astype(np.int64)  # unknown fabric: one switch-path call per pair
        spec = fabric.spec
        loc = np.array([fabric.locate(str(n)) for n in switch_names], dtype=np.int64).reshape(-1, 2)
        g1, s1, g2, s2 = loc[sw_s, 0], loc[sw_s, 1], loc[sw_d, 0], loc[sw_d, 1]
        links = U64(spec.global_links_per_group_pair)
        out = np.full(sw_s.size, -1, dtype=np.int64)
        transit = np.array(fabric.transit, dtype=np.int64)
        if transit.size >= 3:  # valiant_path: intermediate group (DragonflyFabric.intermediate) and two links
            pos = np.full(spec.num_groups, -1, dtype=np.int64)
            pos[transit] = np.arange(transit.size)
            lo, hi = np.minimum(pos[g1], pos[g2]), np.maximum(pos[g1], pos[g2])
            n = (key % U64(transit.size - 2)).astype(np.int64)
            n = n + (n >= lo)
            n = n + (n >= hi)
            mid = transit[np.minimum(n, transit.size - 1)]
            a = ((key >> U64(20)) % links).astype(np.int64)
            b = ((key >> U64(40)) % links).astype(np.int64)
            out = np.where(g1 != g2, (mid * int(links) + a) * int(links) + b, out)
        if spec.switches_per_group >= 3:
            mid = (key % U64(spec.switches_per_group - 2)).astype(np.int64)
            out = np.where((g1 == g2) & (s1 != s2), mid, out)
        return out


def _dense(*cols: np.ndarray) -> np.ndarray:
    return dense_rows(*cols) if cols[0].size else np.zeros(0, dtype=np.int64)


# ---- host symmetry ---------------------------------------------------------------------------
def host_classes(topo: Topology, gpus: Sequence[str], *, spread: bool = False) -> dict[int, int] | None:
    """Class of every host holding members, or None when routing is not host-symmetric.

    Two hosts are interchangeable when they hold members at the same local indices and their NICs
    (in local order) attach to the same network switches, and routes depend on hosts only through
    those switches: uniform and fat-tree (ECMP) clusters, and structured machines whose switch paths
    ignore the per-pair key (dragonfly with minimal routing or with spread=True, DGX rail fat-tree). Swapping two such
    hosts maps the topology, the routes and a host-equivariant traffic pattern onto themselves.
    """
    router = topo.router
    symmetric = router in (uniform_router, ecmp_router) or (
        isinstance(router, StructuredRouter)
        and (
            isinstance(router.fabric, RailFatTree)
            or (isinstance(router.fabric, DragonflyFabric) and (spread or router.fabric.spec.routing == "minimal"))
        )
    )
    if not symmetric:
        return None
    graph = topo.graph
    locals_of: dict[int, list[int]] = {}
    for gpu in gpus:
        locals_of.setdefault(int(graph.nodes[gpu]["host"]), []).append(int(graph.nodes[gpu].get("local_index", 0)))
    nics: dict[int, list[tuple[int, str]]] = {h: [] for h in locals_of}
    for name, data in graph.nodes(data=True):
        if data.get("kind") == "nic" and data.get("host") in nics:
            switches = sorted(v for v in graph.successors(name) if "host" not in graph.nodes[v])
            nics[data["host"]].append((int(data.get("local_index", 0)), ",".join(switches)))
    keys: dict[tuple, int] = {}
    return {
        h: keys.setdefault((tuple(sorted(locals_of[h])), tuple(sorted(nics[h]))), len(keys)) for h in sorted(locals_of)
    }


def link_orbits(topo: Topology, classes: dict[int, int]) -> tuple[np.ndarray, np.ndarray, list[tuple]]:
    """(orbit id of every link, links per orbit, orbit keys) under swaps of same-class hosts.

    A link inside host h or between h's NIC and a switch belongs to orbit (class of h, its local role);
    every other link is its own orbit ("link", u, v).
    """
    nodes = topo.graph.nodes
    keys: dict[tuple, int] = {}
    orbit = np.empty(len(topo.links), dtype=np.int64)
    for n, (u, v) in enumerate(topo.links):
        host = nodes[u].get("host", nodes[v].get("host"))
        if host is not None and host in classes:
            prefix = f"n{host}."
            role = (u.removeprefix(prefix), v.removeprefix(prefix))
            orbit[n] = keys.setdefault((classes[host], role), len(keys))
        else:
            orbit[n] = keys.setdefault(("link", u, v), len(keys))
    return orbit, np.bincount(orbit), list(keys)
