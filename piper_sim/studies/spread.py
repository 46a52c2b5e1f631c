"""Mean-field adaptive routing on a dragonfly: the non-minimal share spread evenly over every detour.

The dragonfly router (piper_sim.topology.build_dragonfly) sends each GPU pair's Valiant share over ONE
detour picked by a seeded hash of the pair, a stand-in for Slingshot's per-packet adaptive routing. Over
millions of pairs the hash spreads load almost evenly, but no two links see exactly the same flows, so
no two flows share a rate and an exact max-min run has about one completion event per flow: beyond a
few thousand GPU pairs that is out of reach. Here the same share is spread over all K detours, as a
fluid: K sub-flows of weight 1/K (each stands for 1/K of a flow and moves 1/K of the Valiant bytes), so
each pair still counts as one Valiant flow in the max-min sharing, and the link loads are the expected
loads of the hashed choice. Routes then depend on hosts only through their switches, which restores the
host symmetry the exact reductions need. It is a different (mean-field) routing model, selected
explicitly, never a silent substitute. Must not import simpy or torch.
"""

from __future__ import annotations

from piper_sim.topology.build_dragonfly import DragonflyFabric
from piper_sim.topology.structured import dedupe

WeightedSwitchPaths = tuple[tuple[float, float, tuple[str, ...]], ...]  # (byte fraction, flow weight, switches)


def all_detours(fabric: DragonflyFabric, src: str, dst: str) -> tuple[tuple[str, ...], ...]:
    """Every path DragonflyFabric.valiant_path can return for src -> dst (same construction)."""
    spec, sw = fabric.spec, fabric.switch_name
    (g1, s1), (g2, s2) = fabric.locate(src), fabric.locate(dst)
    if g1 == g2:
        if spec.switches_per_group < 3:
            return ()
        return tuple((src, sw(g1, mid), dst) for mid in range(spec.switches_per_group) if mid not in (s1, s2))
    if spec.num_groups < 3:
        return ()
    links = range(spec.global_links_per_group_pair)
    out = []
    for mid in range(spec.num_groups):
        if mid in (g1, g2):
            continue
        for a in links:
            for b in links:
                a1, b1 = fabric.global_endpoint(g1, mid, a), fabric.global_endpoint(mid, g1, a)
                a2, b2 = fabric.global_endpoint(mid, g2, b), fabric.global_endpoint(g2, mid, b)
                out.append(dedupe((src, sw(g1, a1), sw(mid, b1), sw(mid, a2), sw(g2, b2), dst)))
    return tuple(out)


def spread_switch_paths(fabric: DragonflyFabric, src: str, dst: str) -> WeightedSwitchPaths:
    """Minimal paths as the fabric splits them, plus the Valiant share spread over all detours."""
    if src == dst:
        return ((1.0, 1.0, (src,)),)
    minimal = tuple((f, 1.0, seq) for f, seq in fabric.minimal_paths(src, dst))
    mode = fabric.spec.routing
    detours = all_detours(fabric, src, dst) if mode != "minimal" else ()
    frac = 0.0 if mode == "valiant" else fabric.spec.adaptive_minimal_fraction
    if not detours or frac >= 1.0:
        return minimal
    share = tuple((1.0 - frac, 1.0 / len(detours), seq) for seq in detours)
    return share if frac <= 0.0 else tuple((frac * f, w, seq) for f, w, seq in minimal) + share
