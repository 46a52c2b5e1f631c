"""Running a collective's phases on the flow network: latency, overhead, phase dependencies.

Owns the timing of a collective, the one implementation the engine (CollectiveRunner) and the collective
studies (piper_sim.studies.runner, on a reduced network) both run: start_phases starts each phase once
the phases in its `after` have ended; run_phase then pays phase_delay_s (the per-message overhead once
for each message its busiest source posts, plus the largest path latency among its flows, times the
sequential messages per flow) and lets its flows enter the network together. Also owns route lookup for
flows between member GPUs (memoized per flow pattern). Must not import torch.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Hashable
from dataclasses import dataclass

import numpy as np
import simpy

from piper_sim.collectives.algorithms import Phase
from piper_sim.sim.network import FlowNetwork
from piper_sim.topology.graph import Topology

PhaseProcess = Generator[simpy.Event, object, object]


def phase_delay_s(phase: Phase, overhead_s: float, latency_s: float) -> float:
    """What a phase pays before its flows enter the network: each source posts its messages one after
    another, so the busiest source's count of messages pays the per-message overhead (message count
    matters, not only bytes; an upper bound, since the posting is not overlapped with the transfers
    already under way), and each of the phase's sequential messages pays the largest path latency.
    A phase's own `overhead_s` replaces the topology's; its `delay_s` is added."""
    per_source = int(np.bincount(phase.src).max()) if phase.src.size else 0
    overhead = overhead_s if phase.overhead_s is None else phase.overhead_s
    return phase.delay_s + phase.messages * (overhead * per_source + latency_s)


@dataclass(frozen=True, slots=True)
class PhaseFlows:
    """A phase's flows as the network takes them (FlowNetwork.start)."""

    entry_flow: np.ndarray
    entry_link: np.ndarray
    sizes: np.ndarray
    weight: np.ndarray | None = None  # flows each one stands for (a reduced network); None: one each
    key: Hashable | None = None  # names the route structure, for the network's memo


def run_phase(env: simpy.Environment, network: FlowNetwork, waits: list[simpy.Event], delay_s: float,
              flows: PhaseFlows | None) -> PhaseProcess:
    """One phase (a SimPy process body): wait for the phases before it, pay delay_s, start its flows
    together. Its value: each flow's finish time (seconds, absolute); an empty array for an empty phase
    (flows None), which pays nothing."""
    if waits:
        yield env.all_of(waits)
    if flows is None:
        return np.zeros(0)
    if delay_s > 0:
        yield env.timeout(delay_s)
    return (yield network.start(flows.entry_flow, flows.entry_link, flows.sizes, weight=flows.weight,
                                key=flows.key))


def start_phases(env: simpy.Environment, phases: list[Phase],
                 process: Callable[[int, Phase, list[simpy.Event]], PhaseProcess]) -> list[simpy.Event]:
    """Start one process per phase, in order; process(index, phase, waits) gets the done events of the
    phases in the phase's `after`. Returns each phase's done event."""
    done: list[simpy.Event] = []
    for index, phase in enumerate(phases):
        done.append(env.process(process(index, phase, [done[a] for a in phase.after])))
    return done



@dataclass(frozen=True, slots=True)
class Routes:
    """Sub-flows (one per path of a flow) and their link incidences."""

    sub_flow: np.ndarray  # flow index of each sub-flow
    sub_fraction: np.ndarray  # share of the flow's bytes on that path
    entry_flow: np.ndarray  # sub-flow index of each incidence
    entry_link: np.ndarray
    latency_s: float  # largest path latency over the flows
    flow_latency_s: np.ndarray  # largest path latency of each flow


class RouteCache:
    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        self._cache: dict[Hashable, Routes] = {}

    def routes(self, gpus: list[str] | tuple[str, ...], src: np.ndarray, dst: np.ndarray, key: Hashable) -> Routes:
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        sub_flow, sub_frac, entry_flow, entry_link = [], [], [], []
        flow_latency = np.zeros(src.size)
        for f, (s, d) in enumerate(zip(src.tolist(), dst.tolist(), strict=True)):
            for frac, links in self.topo.paths(gpus[s], gpus[d]):
                sub = len(sub_flow)
                sub_flow.append(f)
                sub_frac.append(frac)
                entry_flow.extend([sub] * len(links))
                entry_link.extend(links)
                flow_latency[f] = max(flow_latency[f], self.topo.path_latency_s(links))
        latency = float(flow_latency.max()) if src.size else 0.0
        routes = Routes(np.array(sub_flow, dtype=np.int64), np.array(sub_frac), np.array(entry_flow, dtype=np.int64),
                        np.array(entry_link, dtype=np.int64), latency, flow_latency)
        self._cache[key] = routes
        return routes


class CollectiveRunner:
    """Starts the phases of collectives and p2p transfers on the flow network."""

    def __init__(self, env: simpy.Environment, network: FlowNetwork, topo: Topology) -> None:
        self.env, self.network, self.topo = env, network, topo
        self.route_cache = RouteCache(topo)
        self.overhead_s = topo.params.message_overhead_s

    def run(self, phases: list[Phase], gpus: tuple[str, ...], key: Hashable, delay_s: float = 0.0) -> simpy.Event:
        """Event that fires when every phase has ended. key names (members, algorithm, pattern).

        delay_s: a host-side cost paid before the first phase (the profile's per-call overhead).
        With a single phase the event's value is each flow's finish time (seconds, absolute).
        """
        if delay_s > 0:
            return self.env.process(self._delayed(phases, gpus, key, delay_s))
        if not phases:
            ev = self.env.event()
            ev.succeed(np.zeros(0))
            return ev
        done = start_phases(self.env, phases, lambda index, phase, waits: self._phase(phase, gpus, (key, index), waits))
        return done[0] if len(done) == 1 else self.env.all_of(done)

    def _delayed(self, phases: list[Phase], gpus: tuple[str, ...], key: Hashable, delay_s: float):
        yield self.env.timeout(delay_s)
        return (yield self.run(phases, gpus, key))

    def latency_spread_s(self, phase: Phase, gpus: tuple[str, ...], key: Hashable) -> float:
        """Largest minus smallest path latency over the flows of a single-phase run with this key."""
        pattern = ((key, 0), phase.src.tobytes(), phase.dst.tobytes())
        routes = self.route_cache.routes(gpus, phase.src, phase.dst, pattern)
        return float(np.ptp(routes.flow_latency_s)) if phase.src.size else 0.0

    def _phase(self, phase: Phase, gpus: tuple[str, ...], key: Hashable, waits: list[simpy.Event]) -> PhaseProcess:
        if phase.src.size == 0:
            return (yield from run_phase(self.env, self.network, waits, 0.0, None))
        pattern = (key, phase.src.tobytes(), phase.dst.tobytes())
        routes = self.route_cache.routes(gpus, phase.src, phase.dst, pattern)
        flows = PhaseFlows(routes.entry_flow, routes.entry_link, phase.sizes[routes.sub_flow] * routes.sub_fraction,
                           key=pattern)
        delay = phase_delay_s(phase, self.overhead_s, routes.latency_s)
        sub_finish = yield from run_phase(self.env, self.network, waits, delay, flows)
        finish = np.zeros(phase.src.size)
        np.maximum.at(finish, routes.sub_flow, sub_finish)
        return finish
