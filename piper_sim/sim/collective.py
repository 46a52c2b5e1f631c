"""Running a collective's phases on the flow network: latency, overhead, phase dependencies.

Owns route lookup for flows between member GPUs (memoized per flow pattern) and the SimPy process
that starts each phase once the phases it waits for have ended. A phase first pays the per-message
overhead once for each message its busiest source posts, plus the largest path latency among its
flows (times the sequential messages per flow), then its flows enter the network together. Must not import torch.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np
import simpy

from piper_sim.collectives.algorithms import Phase
from piper_sim.sim.network import FlowNetwork
from piper_sim.topology.graph import Topology


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
        if len(phases) == 1:
            return self.env.process(self._phase(phases[0], gpus, (key, 0), []))
        done: list[simpy.Event] = []
        for index, phase in enumerate(phases):
            waits = [done[a] for a in phase.after]
            done.append(self.env.process(self._phase(phase, gpus, (key, index), waits)))
        return self.env.all_of(done)

    def _delayed(self, phases: list[Phase], gpus: tuple[str, ...], key: Hashable, delay_s: float):
        yield self.env.timeout(delay_s)
        return (yield self.run(phases, gpus, key))

    def latency_spread_s(self, phase: Phase, gpus: tuple[str, ...], key: Hashable) -> float:
        """Largest minus smallest path latency over the flows of a single-phase run with this key."""
        pattern = ((key, 0), phase.src.tobytes(), phase.dst.tobytes())
        routes = self.route_cache.routes(gpus, phase.src, phase.dst, pattern)
        return float(np.ptp(routes.flow_latency_s)) if phase.src.size else 0.0

    def _phase(self, phase: Phase, gpus: tuple[str, ...], key: Hashable, waits: list[simpy.Event]):
        if waits:
            yield self.env.all_of(waits)
        if phase.src.size == 0:
            return np.zeros(0)
        pattern = (key, phase.src.tobytes(), phase.dst.tobytes())
        routes = self.route_cache.routes(gpus, phase.src, phase.dst, pattern)
        # each source posts its messages one after another: the busiest source's count of messages pays
        # the per-message overhead (message count matters, not only bytes); an upper bound, since the
        # posting is not overlapped with the transfers already under way
        per_source = int(np.bincount(phase.src).max())
        delay = phase.messages * (self.overhead_s * per_source + routes.latency_s)
        if delay > 0:
            yield self.env.timeout(delay)
        sizes = phase.sizes[routes.sub_flow] * routes.sub_fraction
        sub_finish = yield self.network.start(routes.entry_flow, routes.entry_link, sizes, key=pattern)
        finish = np.zeros(phase.src.size)
        np.maximum.at(finish, routes.sub_flow, sub_finish)
        return finish
