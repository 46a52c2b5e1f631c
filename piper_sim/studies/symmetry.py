"""Switch-level symmetries of a dragonfly that extend the host-swap symmetry (exact reductions only).

Owns the search for automorphisms of the switch layer that carry host classes onto host classes, and
the orbits of GPU pairs and links under the group they generate. Must not import simpy or torch.

Swapping hosts that share NIC switches (routes.host_classes) leaves, on Frontier, classes of 4 hosts
(one Rosetta switch). The fabric has more symmetry: rotating the 4 switches of a chassis block (and its
16 hosts with them: each node's 4 NICs sit on the 4 switches of its chassis, rotated by its home switch)
maps the group's all-to-all local links onto themselves, and the global links of that block onto those
of the same peer group if the peer's block they land on rotates too; blocks without global links can be
swapped. Candidates are such rotations (alone and in pairs across groups) and block swaps; each is kept
only if it is verified: every switch-to-switch link maps onto a link of equal capacity, latency and kind,
every host class onto a class with the same members, and the routes of sampled switch pairs onto the
routes of the image pairs (routes are group-structural: minimal paths over all global links of a group
pair, mean-field detours over all intermediate switches and groups). A verified automorphism maps the
flow set of a host-invariant traffic pattern onto itself, so the orbits of pairs and links under the
generated group are an equitable partition: exact.
"""

from __future__ import annotations

import random
import weakref
from collections.abc import Sequence

import numpy as np

from piper_sim.topology.dragonfly import DragonflyFabric
from piper_sim.topology.graph import Topology
from piper_sim.topology.spread import spread_switch_paths
from piper_sim.topology.structured import StructuredRouter

SwitchMap = dict[str, str]


def _block_size(fabric: DragonflyFabric) -> int:
    spec = fabric.spec
    return spec.nics_per_node if spec.nic_switch_spread and spec.switches_per_group % spec.nics_per_node == 0 else 1


def _rotation_closure(fabric: DragonflyFabric, graph, group: int, block: int) -> SwitchMap | None:
    """Rotate block `block` of `group` and, transitively, every block a global link from a rotated block
    lands in (with the whole machine behind the job, the outside groups' landing blocks); None when a block
    to rotate is not built whole."""
    sw, k = fabric.switch_name, _block_size(fabric)
    todo, done, sigma = [(group, block)], set(), {}
    while todo:
        g, b = todo.pop()
        if (g, b) in done:
            continue
        done.add((g, b))
        names = [sw(g, b * k + s) for s in range(k)]
        if not all(name in graph for name in names):
            return None
        for s, name in enumerate(names):
            sigma[name] = names[(s + 1) % k]
            for peer in graph.successors(name):
                if graph.edges[name, peer].get("link_kind") == "global":
                    pg, ps = fabric.locate(peer)
                    todo.append((pg, ps // k))
    return sigma


def _candidates(fabric: DragonflyFabric, graph) -> list[SwitchMap]:
    spec, sw = fabric.spec, fabric.switch_name
    k = _block_size(fabric)
    blocks = spec.switches_per_group // k
    whole = fabric.job_groups  # outside groups are built in part: no block of theirs is whole
    if fabric.outside and k > 1:  # every block has global links to the machine: rotate closures of blocks
        closures = (_rotation_closure(fabric, graph, g, b) for g in whole for b in range(blocks))
        return [c for c in closures if c]
    rot = (
        [{sw(g, b * k + s): sw(g, b * k + (s + 1) % k) for s in range(k)} for g in whole for b in range(blocks)]
        if k > 1
        else []
    )
    out: list[SwitchMap] = list(rot)
    out += [
        a | b
        for n, a in enumerate(rot)
        for b in rot[n + 1 :]
        if fabric.locate(next(iter(a)))[0] != fabric.locate(next(iter(b)))[0]
    ]
    for g in whole:
        for b in range(blocks - 1):
            swap = {}
            for s in range(k):
                x, y = sw(g, b * k + s), sw(g, (b + 1) * k + s)
                swap[x], swap[y] = y, x
            out.append(swap)
    return out


def _edges_preserved(topo: Topology, sigma: SwitchMap) -> bool:
    graph = topo.graph
    for u in sigma:
        for v in list(graph.successors(u)) + list(graph.predecessors(u)):
            if "host" in graph.nodes[v]:
                continue  # NIC links are checked through the host classes
            for a, b in ((u, v), (v, u)):
                if not graph.has_edge(a, b):
                    continue
                ia, ib = sigma.get(a, a), sigma.get(b, b)
                if not graph.has_edge(ia, ib):
                    return False
                d, e = graph.edges[a, b], graph.edges[ia, ib]
                if (d["bandwidth_bytes_per_s"], d.get("latency_s"), d.get("link_kind")) != (
                    e["bandwidth_bytes_per_s"],
                    e.get("latency_s"),
                    e.get("link_kind"),
                ):
                    return False
    return True


def _paths(fabric: DragonflyFabric, a: str, b: str, spread: bool, cache: dict) -> list:
    key = (a, b)
    if key not in cache:
        if spread:
            cache[key] = sorted(spread_switch_paths(fabric, a, b))
        else:
            cache[key] = (
                sorted((f, 1.0, seq) for f, seq in fabric.minimal_paths(a, b)) if a != b else [(1.0, 1.0, (a,))]
            )
    return cache[key]


def _routes_commute(fabric: DragonflyFabric, sigma: SwitchMap, sample: list[str], spread: bool, cache: dict) -> bool:
    """Routes from/to every moved switch of a job group (the only ends of traffic) and a fixed sample of
    switches map onto the image routes."""
    ends = set(fabric.job_groups)
    pairs = [(a, b) for a in sigma if fabric.locate(a)[0] in ends for b in sample]
    for a, b in pairs + [(b, a) for a, b in pairs]:
        mapped = sorted(
            (f, w, tuple(sigma.get(x, x) for x in seq)) for f, w, seq in _paths(fabric, a, b, spread, cache)
        )
        if mapped != _paths(fabric, sigma.get(a, a), sigma.get(b, b), spread, cache):
            return False
    return True


_VERIFIED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def class_automorphisms(topo: Topology, classes: dict[int, int], spread: bool) -> list[tuple[SwitchMap, np.ndarray]]:
    """Verified switch automorphisms and the permutation of host classes each induces (cached per topology,
    host classes and routing model: every collective on one machine and member list shares them)."""
    per_topo = _VERIFIED.setdefault(topo, {})
    key = (tuple(sorted(classes.items())), spread)
    if key not in per_topo:
        per_topo[key] = _verify(topo, classes, spread)
    return per_topo[key]


def _verify(topo: Topology, classes: dict[int, int], spread: bool) -> list[tuple[SwitchMap, np.ndarray]]:
    router = topo.router
    if not (isinstance(router, StructuredRouter) and isinstance(router.fabric, DragonflyFabric)):
        return []
    fabric = router.fabric
    if not spread and fabric.spec.routing != "minimal":
        return []
    k = router.node.nics_per_node
    signature: dict[int, tuple[str, ...]] = {}
    for h, c in classes.items():
        signature.setdefault(c, tuple(fabric.nic_switch(h, n) for n in range(k)))
    by_signature = {sig: c for c, sig in signature.items()}
    size = np.bincount(np.array(list(classes.values())), minlength=len(signature))
    switches = sorted({s for sig in signature.values() for s in sig})
    sample = random.Random(0).sample(switches, min(8, len(switches)))
    cache: dict = {}
    found = []
    for sigma in _candidates(fabric, topo.graph):
        perm = np.array(
            [by_signature.get(tuple(sigma.get(x, x) for x in signature[c]), -1) for c in range(len(signature))]
        )
        if (perm < 0).any() or len(set(perm.tolist())) != perm.size or (size[perm] != size).any():
            continue
        if _edges_preserved(topo, sigma) and _routes_commute(fabric, sigma, sample, spread, cache):
            found.append((sigma, perm))
    return found


def orbit_labels(images: Sequence[np.ndarray], start: np.ndarray | None = None) -> np.ndarray:
    """Smallest element of each orbit under the permutations `images` (image index per element).

    start: labels already known for a subgroup (a finer partition), to continue from.
    """
    n = images[0].size
    label = np.arange(n) if start is None else start.copy()
    inverses = []
    for img in images:
        inv = np.empty(n, dtype=np.int64)
        inv[img] = np.arange(n)
        inverses.append(inv)
    while True:
        before = label.copy()
        for img, inv in zip(images, inverses, strict=True):
            label = np.minimum(label, label[img])
            label = np.minimum(label, label[inv])
        if np.array_equal(label, before):
            return label


PhaseFlows = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # src, dst, sizes, count (member level)


def extend(
    topo: Topology,
    classes: dict[int, int],
    spread: bool,
    flows: list[PhaseFlows],
    host: np.ndarray,
    local: np.ndarray,
    orbit: np.ndarray,
    orbit_count: np.ndarray,
    orbit_keys: list[tuple],
) -> tuple[list[PhaseFlows], np.ndarray, np.ndarray, list[SwitchMap]] | None:
    """Merge host-swap orbits of flows and links further under verified switch automorphisms.

    flows are the host-swap representatives per phase (one per orbit, count = orbit size), of a traffic
    pattern invariant under every host permutation that keeps local GPU indices (the caller's promise,
    as for host_classes; spot-checked here). Automorphisms act on hosts only, so the orbit of a pair
    (class s, GPU i, class d, GPU j) is the orbit of its class pair (with same-host / same-class / other
    kind) times (i, j). Returns the new representatives, the link orbit of every link under the group of
    all verified automorphisms, links per orbit and those automorphisms (the caller may merge a pair's
    paths that they map onto each other: topology.spread); None when none is found or the spot check fails.
    """
    gens = class_automorphisms(topo, classes, spread)
    if not gens:
        return None
    num_c = max(classes.values()) + 1
    cs, cd, kind = (a.reshape(-1) for a in np.meshgrid(np.arange(num_c), np.arange(num_c), np.arange(3), indexing="ij"))
    kept, images, label = [], [], np.arange(cs.size)
    for sigma, perm in gens:  # keep the generators that merge class pairs
        img = (perm[cs] * num_c + perm[cd]) * 3 + kind
        new = orbit_labels(images + [img], label)
        if not np.array_equal(new, label):
            kept.append((sigma, perm))
            images.append(img)
            label = new
    hclass = np.full(int(host.max()) + 1, -1, dtype=np.int64)
    for h, c in classes.items():
        hclass[h] = c
    num_g = int(local.max()) + 1
    out: list[PhaseFlows] = []
    for src, dst, sizes, count in flows:
        if src.size == 0:
            out.append((src, dst, sizes, count))
            continue
        a, b = hclass[host[src]], hclass[host[dst]]
        k = np.where(host[src] == host[dst], 0, np.where(a == b, 1, 2))
        if not _spot_check(gens, a, b, k, local[src], local[dst], sizes, num_c, num_g):
            return None
        code = (label[(a * num_c + b) * 3 + k] * num_g + local[src]) * num_g + local[dst]
        first, dense = np.unique(code, return_index=True, return_inverse=True)[1:]
        out.append((src[first], dst[first], sizes[first], np.bincount(dense.reshape(-1), weights=count)))
    link_images = _link_images(gens, orbit_keys)
    if link_images is None:
        return None
    merged = np.unique(orbit_labels(link_images), return_inverse=True)[1].reshape(-1)
    return out, merged[orbit], np.bincount(merged, weights=orbit_count), [sigma for sigma, _ in gens]


def _spot_check(
    gens: list,
    a: np.ndarray,
    b: np.ndarray,
    k: np.ndarray,
    i: np.ndarray,
    j: np.ndarray,
    sizes: np.ndarray,
    num_c: int,
    num_g: int,
) -> bool:
    """Images of a sample of representatives are representatives with the same size."""
    code = (((a * num_g + i) * num_c + b) * num_g + j) * 3 + k
    order = np.argsort(code)
    pick = np.random.default_rng(0).choice(code.size, min(code.size, 20_000), replace=False)
    for _, perm in gens:
        img = (((perm[a[pick]] * num_g + i[pick]) * num_c + perm[b[pick]]) * num_g + j[pick]) * 3 + k[pick]
        at = np.minimum(np.searchsorted(code[order], img), code.size - 1)
        if not (np.array_equal(code[order][at], img) and np.array_equal(sizes[order][at], sizes[pick])):
            return False
    return True


def _link_images(gens: list, orbit_keys: list[tuple]) -> list[np.ndarray] | None:
    index = {key: n for n, key in enumerate(orbit_keys)}
    images = []
    for sigma, perm in gens:
        img = []
        for key in orbit_keys:
            mapped = (
                (key[0], sigma.get(key[1], key[1]), sigma.get(key[2], key[2]))
                if key[0] == "link"
                else (int(perm[key[0]]), tuple(sigma.get(x, x) for x in key[1]))
            )
            if mapped not in index:
                return None
            img.append(index[mapped])
        images.append(np.array(img, dtype=np.int64))
    return images
