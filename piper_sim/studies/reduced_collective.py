"""One collective, alone on the machine, on an exactly reduced flow network.

Owns `prepare` (phases -> sub-flows -> host-symmetry quotient -> equitable lumping) and `simulate`
(SimPy + FlowNetwork on the lumped links). The collective's timing is not here: simulate runs the
engine's own (piper_sim.network.phase_run: start_phases, run_phase, phase_delay_s; a phase waits for the
phases in `after`, pays its messages' overhead and latency, then its flows enter together) on the
reduced flows. Every reduction is exact (piper_sim.network.aggregate): the completion time equals the one
CollectiveRunner gives on the unreduced flows. Must not import torch.

Reductions, in order:
1. host symmetry (optional, `symmetric=True`): when the routing is host-symmetric (routes.host_classes)
   and the phases are invariant under swapping interchangeable hosts (a uniform matrix through a
   host-equivariant algorithm such as flat or 2dh), only one flow per orbit of GPU pairs is routed, with
   count = orbit size, and links are replaced by their orbits. An orbit partition is equitable, so this
   is exact; it is what makes 4096 GCDs tractable (16.7M pairs -> about 1M orbit representatives).
2. lumping: the coarsest equitable partition of what is left (colour refinement), usually a few hundred
   classes, on which each max-min solve costs next to nothing.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import simpy

from piper_sim.collectives.algorithms import Phase
from piper_sim.errors import PiperError
from piper_sim.network import (
    LATENCY_ONLY_S,
    FlowNetwork,
    Lumped,
    PhaseFlows,
    PhaseProcess,
    lump,
    phase_delay_s,
    run_phase,
    start_phases,
)
from piper_sim.studies.routes import RouteTable, host_classes, link_orbits
from piper_sim.studies.symmetry import extend
from piper_sim.topology.graph import Topology


@dataclass(frozen=True, kw_only=True)
class Prepared:
    """A collective reduced and ready to simulate (sizes can be rescaled without re-lumping)."""

    phases: list[Phase]
    lumped: Lumped
    class_weight: np.ndarray  # flows every class stands for (lumped.weight / count scale)
    class_phase: np.ndarray  # phase of every flow class
    latency_s: np.ndarray  # largest path latency per phase
    class_remote: np.ndarray  # per flow class: 1 if its flows cross hosts, 0 if they stay on one, -1 if both
    link_class: np.ndarray  # class of every topology link (-1: unused)
    num_pairs: int  # point-to-point flows of the collective
    num_sub_flows: int  # flows the network would carry without aggregation (one per path)
    num_routed: int  # sub-flows actually routed (after the host-symmetry reduction)
    symmetric: bool
    num_automorphisms: int  # verified switch automorphisms used besides host swaps
    prepare_s: float


@dataclass(frozen=True, kw_only=True)
class CollectiveRun:
    time_s: float
    link_bytes: np.ndarray  # bytes carried by every topology link
    num_solves: int
    simulate_s: float


def _orbit_reps(
    src: np.ndarray,
    dst: np.ndarray,
    sizes: np.ndarray,
    host: np.ndarray,
    hclass: np.ndarray,
    hpos: np.ndarray,
    csize: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """(indices of one flow per orbit, orbit sizes); raises if the flows are not orbit-invariant.

    The representative of an orbit has its source on the first host of its class and its destination on
    the first host of its class (the second one if both hosts share a class but differ).
    """
    first = np.flatnonzero(hpos[host[src]] == 0)
    hs, hd = host[src[first]], host[dst[first]]
    cs, cd, pd = hclass[hs], hclass[hd], hpos[hd]
    rep = np.where(hs == hd, True, np.where(cs == cd, pd == 1, pd == 0))
    idx = first[rep]
    hs, hd, cs, cd = hs[rep], hd[rep], cs[rep], cd[rep]
    count = np.where(hs == hd, csize[cs], np.where(cs == cd, csize[cs] * (csize[cs] - 1), csize[cs] * csize[cd]))
    if int(count.sum()) != src.size or not np.isclose((count * sizes[idx]).sum(), sizes.sum()):
        raise PiperError("flows are not invariant under host symmetry; run without the symmetry reduction")
    return idx, count


def prepare(
    phases: list[Phase],
    gpus: list[str] | tuple[str, ...],
    topo: Topology,
    *,
    symmetric: bool = False,
    lump_flows: bool = True,
    spread: bool = False,
    max_sub_flows: int | None = None,
) -> Prepared:
    """Route, reduce and lump the phases' flows.

    symmetric=True asserts the traffic is host-invariant (the reduction is used when the routing is
    host-symmetric too); spread=True routes dragonfly detours mean-field (piper_sim.topology.spread).
    """
    t0 = time.perf_counter()
    table = RouteTable(topo, gpus, spread=spread, max_sub_flows=max_sub_flows)
    classes = host_classes(topo, gpus, spread=table.spread) if symmetric else None
    num_generators = 0
    src, dst, sizes, count, phase_of = [], [], [], [], []
    num_pairs = 0
    for k, ph in enumerate(phases):
        num_pairs += ph.src.size
        idx, cnt = np.arange(ph.src.size), np.ones(ph.src.size)
        if classes is not None and ph.src.size:
            hclass, hpos, csize = _host_arrays(classes, int(table.host.max()) + 1)
            idx, cnt = _orbit_reps(ph.src, ph.dst, ph.sizes, table.host, hclass, hpos, csize)
        src.append(ph.src[idx])
        dst.append(ph.dst[idx])
        sizes.append(ph.sizes[idx].astype(float))
        count.append(cnt.astype(float))
        phase_of.append(np.full(idx.size, k, dtype=np.int64))
    if classes is not None:
        orbit, orbit_count, orbit_keys = link_orbits(topo, classes)
        wider = extend(
            topo,
            classes,
            table.spread,
            list(zip(src, dst, sizes, count, strict=True)),
            table.host,
            table.local,
            orbit,
            orbit_count,
            orbit_keys,
        )
        if wider is not None:
            flows, orbit, orbit_count, generators = wider
            num_generators = len(generators)
            table.merge_detours(generators)
            src, dst, sizes, count = (list(x) for x in zip(*flows, strict=True))
            phase_of = [np.full(s.size, k, dtype=np.int64) for k, s in enumerate(src)]
    else:
        orbit, orbit_count = np.arange(len(topo.links)), np.ones(len(topo.links))
    src_a, dst_a, size_a, count_a, phase_a = (np.concatenate(x) for x in (src, dst, sizes, count, phase_of))
    sf = table.sub_flows(src_a, dst_a)
    sub_phase = phase_a[sf.pair]
    scale = _count_scale(sf.weight)  # integer counts keep the refinement's hashed sums exact
    sub_count = np.rint(count_a[sf.pair] * sf.weight * scale)
    latency = np.zeros(len(phases))
    np.maximum.at(latency, sub_phase, sf.latency_s)
    capacity = np.zeros(orbit_count.size)
    capacity[orbit] = topo.capacity_bytes_per_s
    lumped = lump(
        sf.entry_flow,
        orbit[sf.entry_link],
        size_a[sf.pair] * sf.fraction,
        capacity,
        count=sub_count,
        link_count=orbit_count,
        color=sub_phase,
        refine=lump_flows,
    )
    class_phase = np.zeros(lumped.num_flow_classes, dtype=np.int64)
    class_phase[lumped.flow_class] = sub_phase
    remote = (table.host[src_a] != table.host[dst_a])[sf.pair]
    crossing = np.bincount(lumped.flow_class, weights=remote, minlength=lumped.num_flow_classes)
    members = np.bincount(lumped.flow_class, minlength=lumped.num_flow_classes)
    class_remote = np.where(crossing == members, 1, np.where(crossing == 0, 0, -1))
    return Prepared(
        phases=phases,
        lumped=lumped,
        class_weight=lumped.weight / scale,
        class_phase=class_phase,
        latency_s=latency,
        class_remote=class_remote,
        link_class=lumped.link_class[orbit],
        num_pairs=num_pairs,
        num_sub_flows=int(round(np.rint(count_a[sf.pair]).sum())),
        num_routed=int(sf.pair.size),
        symmetric=classes is not None,
        num_automorphisms=num_generators,
        prepare_s=time.perf_counter() - t0,
    )


def _count_scale(weight: np.ndarray) -> int:
    """Smallest integer making every weight (1, 1/K or a class's size/K) times it an integer."""
    scale = 1
    for w in np.unique(weight).tolist():
        frac = Fraction(w).limit_denominator(1 << 20)
        if not np.isclose(float(frac), w, rtol=1e-12, atol=0.0):
            raise PiperError(f"flow weight {w} is not a ratio of small integers")
        scale = math.lcm(scale, frac.denominator)
    return scale


def _host_arrays(classes: dict[int, int], num_hosts: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    hclass = np.full(num_hosts, -1, dtype=np.int64)
    hpos = np.full(num_hosts, -1, dtype=np.int64)
    seen: dict[int, int] = {}
    for h in sorted(classes):
        c = classes[h]
        hclass[h], hpos[h] = c, seen.get(c, 0)
        seen[c] = hpos[h] + 1
    csize = np.zeros(max(seen) + 1 if seen else 0, dtype=np.int64)
    for c, n in seen.items():
        csize[c] = n
    return hclass, hpos, csize


def time_unit(prep: Prepared) -> float:
    """A power of two near the collective's duration (its busiest link's bytes / capacity), at least 1.

    The run is made in this unit: bytes and delays divided by it, the end time multiplied back. Powers of
    two scale floats exactly, and max-min rates do not depend on sizes, so this is the same run; it keeps
    simulated time near 1, where float time steps stay far below FlowNetwork's EPS_BYTES / rate. (At
    hundreds of simulated seconds, flows at 200 GB/s leave byte residues above EPS_BYTES that no
    representable time step can clear, and FlowNetwork re-solves forever at one instant.)
    """
    lp = prep.lumped
    load = np.bincount(
        lp.entry_link, weights=(lp.sizes * prep.class_weight)[lp.entry_flow], minlength=lp.num_link_classes
    )
    est = float(np.max(load / lp.capacity, initial=0.0))
    return float(2.0 ** max(0, math.ceil(math.log2(est)))) if est > 1.0 else 1.0


def simulate(prep: Prepared, topo: Topology) -> CollectiveRun:
    """Run the prepared collective alone."""
    t0 = time.perf_counter()
    lp = prep.lumped
    unit = time_unit(prep)
    env = simpy.Environment()
    net = FlowNetwork(env, lp.capacity, latency_only_s=LATENCY_ONLY_S / unit)
    overhead = topo.params.message_overhead_s

    def phase(k: int, ph: Phase, waits: list[simpy.Event]) -> PhaseProcess:
        if ph.src.size == 0:
            return run_phase(env, net, waits, 0.0, None)
        classes = np.flatnonzero(prep.class_phase == k)
        local = np.full(lp.num_flow_classes, -1, dtype=np.int64)
        local[classes] = np.arange(classes.size)
        mask = local[lp.entry_flow] >= 0
        flows = PhaseFlows(
            local[lp.entry_flow[mask]], lp.entry_link[mask], lp.sizes[classes] / unit, weight=prep.class_weight[classes]
        )
        return run_phase(env, net, waits, phase_delay_s(ph, overhead, prep.latency_s[k]) / unit, flows)

    done = start_phases(env, prep.phases, phase)
    if done:
        env.run(env.all_of(done))
    per_link = np.divide(
        net.link_bytes * unit, lp.link_count, out=np.zeros_like(net.link_bytes), where=lp.link_count > 0
    )
    link_bytes = np.where(prep.link_class >= 0, per_link[np.maximum(prep.link_class, 0)], 0.0)
    return CollectiveRun(
        time_s=env.now * unit, link_bytes=link_bytes, num_solves=net.num_solves, simulate_s=time.perf_counter() - t0
    )


def run_collective(
    phases: list[Phase],
    gpus: list[str] | tuple[str, ...],
    topo: Topology,
    *,
    symmetric: bool = False,
    lump_flows: bool = True,
    spread: bool = False,
) -> tuple[Prepared, CollectiveRun]:
    prep = prepare(phases, gpus, topo, symmetric=symmetric, lump_flows=lump_flows, spread=spread)
    return prep, simulate(prep, topo)
