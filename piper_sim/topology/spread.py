"""Mean-field adaptive routing on a dragonfly: the non-minimal share spread evenly over every detour.

By default (valiant: hashed) the dragonfly router (piper_sim.topology.dragonfly) sends each GPU pair's
Valiant share over ONE detour picked by a seeded hash of the pair, a stand-in for Slingshot's per-packet
adaptive routing. Over millions of pairs the hash spreads load almost evenly, but no two links see exactly
the same flows, so no two flows share a rate and an exact max-min run has about one completion event per
flow: beyond a few thousand GPU pairs that is out of reach. Here the same share is spread over all K
detours, as a fluid: K sub-flows of weight 1/K (each stands for 1/K of a flow and moves 1/K of the Valiant
bytes), so each pair still counts as one Valiant flow in the max-min sharing, and the link loads are the
expected loads of the hashed choice. Routes then depend on hosts only through their switches, which restores
the host symmetry the exact reductions need. It is a different (mean-field) routing model, selected
explicitly (the dragonfly parameter `valiant: spread`, or the all-to-all study's --valiant), never a silent
substitute. Detours through a class of aggregated outside groups (the whole machine behind the job,
piper_sim.topology.dragonfly) are one sub-flow of weight size/K through the class's representative, whose
links carry the class's capacity: the orbit quotient of the K-detour spread, exact.
Must not import simpy or torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from piper_sim.topology.structured import dedupe

if TYPE_CHECKING:  # the fabric selects this routing (valiant: spread) and passes itself in
    from piper_sim.topology.dragonfly import DragonflyFabric

WeightedSwitchPaths = tuple[tuple[float, float, tuple[str, ...]], ...]  # (byte fraction, flow weight, switches)


Closures = dict[tuple[int, int], frozenset[str]]  # (group, block) -> switches a verified automorphism moves


def closure_blocks(fabric: DragonflyFabric, generators: list[dict[str, str]]) -> Closures:
    """For each block some verified automorphism rotates: the switches that automorphism moves. Empty unless
    a rotation of a block is a shift of link indices (as many global links per group pair as switches per
    block, so the links to one peer fill one block)."""
    spec = fabric.spec
    k = spec.nics_per_node if spec.nic_switch_spread else 1
    if k < 2 or spec.global_links_per_group_pair != k or spec.switches_per_group % k:
        return {}
    out: Closures = {}
    for sigma in generators:
        moved = frozenset(sigma)
        for name in sigma:
            g, s = fabric.locate(name)
            out.setdefault((g, s // k), moved)
    return out


def _link_ends(fabric: DragonflyFabric, g: int, mid: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(switches of g where its links to mid leave, switches of mid's representative where they land), by
    link index (cached on the fabric)."""
    cache = fabric.__dict__.setdefault("_link_ends_cache", {})
    hit = cache.get((g, mid))
    if hit is None:
        sw, ep, rep = fabric.switch_name, fabric.global_endpoint, fabric.outside.get(mid, (mid, 1))[0]
        links = range(fabric.spec.global_links_per_group_pair)
        hit = cache[(g, mid)] = (
            tuple(sw(g, ep(g, mid, a)) for a in links),
            tuple(sw(rep, ep(mid, g, a)) for a in links),
        )
    return hit


def _choices(
    closures: Closures | None, g: int, block: int, keep: tuple[str, ...], other_end: tuple[str, ...], k: int
) -> list[int]:
    """Link indices to keep at one end of a detour: one when a verified rotation of that end's block fixes
    the endpoints and the other end (the 4 choices are one orbit), else all."""
    moved = closures.get((g, block)) if closures else None
    if moved is None or any(x in moved for x in keep) or any(x in moved for x in other_end):
        return list(range(k))
    return [0]


def all_detours(
    fabric: DragonflyFabric, src: str, dst: str, closures: Closures | None = None
) -> tuple[tuple[tuple[str, ...], int], ...]:
    """Every path DragonflyFabric.valiant_path can return for src -> dst (same construction), each with the
    number of detours it stands for: an aggregated class of outside groups counts its size (dragonfly.py).

    With `closures` (verified automorphisms of the whole flow set, closure_blocks), detours that an
    automorphism fixing src and dst maps onto each other are one (their orbit): the 4 choices of the first
    global link when a rotation of its block fixes the rest of the path, likewise the second, and the 4
    intermediate switches of a block inside one group."""
    spec, sw = fabric.spec, fabric.switch_name
    (g1, s1), (g2, s2) = fabric.locate(src), fabric.locate(dst)
    k = spec.global_links_per_group_pair
    if g1 == g2:
        if spec.switches_per_group < 3:
            return ()
        out: list[tuple[tuple[str, ...], int]] = []
        for mid in range(spec.switches_per_group):
            if mid in (s1, s2):
                continue
            if _choices(closures, g1, mid // k, (src, dst), (), k) == [0]:
                if mid % k == 0:
                    out.append(((src, sw(g1, mid), dst), k))
                continue
            out.append(((src, sw(g1, mid), dst), 1))
        return tuple(out)
    if len(fabric.transit) < 3:
        return ()
    out = []
    for mid in fabric.transit:
        rep, size = fabric.outside.get(mid, (mid, 1))
        if mid in (g1, g2) or rep != mid:
            continue
        exit1, land1 = _link_ends(fabric, g1, mid)
        entry2, leave2 = _link_ends(fabric, g2, mid)
        block1, block2 = fabric.locate(exit1[0])[1] // k, fabric.locate(entry2[0])[1] // k
        first = _choices(closures, g1, block1, (src, dst), entry2 + leave2, k)
        second = _choices(closures, g2, block2, (src, dst), exit1 + land1, k)
        weight = size * (k // len(first)) * (k // len(second))
        for a in first:
            for b in second:
                out.append((dedupe((src, exit1[a], land1[a], leave2[b], entry2[b], dst)), weight))
    return tuple(out)


def _minimal(fabric: DragonflyFabric, src: str, dst: str, closures: Closures | None) -> WeightedSwitchPaths:
    """The minimal paths (byte fraction, flow weight 1 each), merged into one when a rotation fixing src and
    dst maps them onto each other."""
    paths = tuple((f, 1.0, seq) for f, seq in fabric.minimal_paths(src, dst))
    (g1, _), (g2, _) = fabric.locate(src), fabric.locate(dst)
    k = fabric.spec.global_links_per_group_pair
    if (
        g1 != g2
        and len(paths) == k
        and _choices(closures, g1, fabric.global_endpoint(g1, g2, 0) // k, (src, dst), (), k) == [0]
    ):
        f, _, seq = paths[0]
        return ((f, float(k), seq),)
    return paths


def spread_switch_paths(
    fabric: DragonflyFabric, src: str, dst: str, closures: Closures | None = None
) -> WeightedSwitchPaths:
    """Minimal paths as the fabric splits them, plus the Valiant share spread over all detours."""
    if src == dst:
        return ((1.0, 1.0, (src,)),)
    minimal = _minimal(fabric, src, dst, closures)
    mode = fabric.spec.routing
    detours = all_detours(fabric, src, dst, closures) if mode != "minimal" else ()
    frac = 0.0 if mode == "valiant" else fabric.minimal_fraction(fabric.locate(src)[0], fabric.locate(dst)[0])
    if not detours or frac >= 1.0:
        return minimal
    total = sum(w for _, w in detours)
    share = tuple((1.0 - frac, size / total, seq) for seq, size in detours)
    return share if frac <= 0.0 else tuple((frac * f, w, seq) for f, w, seq in minimal) + share
