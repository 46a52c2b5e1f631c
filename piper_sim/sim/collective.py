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
from piper_sim.sim.fairshare import (
    BATCH_MAX_CELLS,
    EPS_BYTES,
    SolvedAhead,
    Timeline,
    isolated_timeline,
    isolated_timelines,
)
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
    weight: np.ndarray | None = None  # flows each one stands for (a reduced network, mean-field detours); None: 1
    key: Hashable | None = None  # names the route structure, for the network's memo

    @property
    def weights(self) -> np.ndarray:
        return np.ones(self.sizes.shape[0]) if self.weight is None else self.weight


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
    sub_fraction: np.ndarray  # share of the flow's bytes on that path, per unit of its weight
    entry_flow: np.ndarray  # sub-flow index of each incidence
    entry_link: np.ndarray
    latency_s: float  # largest path latency over the flows
    flow_latency_s: np.ndarray  # largest path latency of each flow
    sub_weight: np.ndarray | None = None  # flows each sub-flow counts as (Topology.weighted_paths); None: 1 each


class RouteCache:
    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        self._cache: dict[Hashable, Routes] = {}
        self._by_content: dict[Hashable, Routes] = {}
        self._pairs: dict[tuple[str, str], tuple[tuple[tuple[float, float, tuple[int, ...]], ...], float]] = {}
        self._latency = topo.latency_s.tolist()

    def _pair(self, src: str, dst: str) -> tuple[tuple[tuple[float, float, tuple[int, ...]], ...], float]:
        """The weighted paths between two GPUs and the largest of their latencies (the same pairs recur in many
        patterns)."""
        hit = self._pairs.get((src, dst))
        if hit is None:
            paths = self.topo.weighted_paths(src, dst)
            latency = max((sum(self._latency[link] for link in links) for _, _, links in paths), default=0.0)
            hit = self._pairs[(src, dst)] = (paths, float(latency))
        return hit

    def routes(self, gpus: list[str] | tuple[str, ...], src: np.ndarray, dst: np.ndarray, key: Hashable) -> Routes:
        """key names the pattern for the caller; the routes are found by content (members and flows), which many
        patterns share (a collective's phases, dispatch and combine of a full matrix)."""
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        content = (tuple(gpus), src.tobytes(), dst.tobytes())
        hit = self._by_content.get(content)
        if hit is not None:
            self._cache[key] = hit
            return hit
        sub_flow, sub_frac, sub_weight, entry_flow, entry_link = [], [], [], [], []
        flow_latency = np.zeros(src.size)
        for f, (s, d) in enumerate(zip(src.tolist(), dst.tolist(), strict=True)):
            paths, flow_latency[f] = self._pair(gpus[s], gpus[d])
            for frac, weight, links in paths:
                sub = len(sub_flow)
                sub_flow.append(f)
                sub_frac.append(frac)
                sub_weight.append(weight)
                entry_flow.extend([sub] * len(links))
                entry_link.extend(links)
        latency = float(flow_latency.max()) if src.size else 0.0
        weights = np.array(sub_weight)
        routes = Routes(np.array(sub_flow, dtype=np.int64), np.array(sub_frac), np.array(entry_flow, dtype=np.int64),
                        np.array(entry_link, dtype=np.int64), latency, flow_latency,
                        None if (weights == 1.0).all() else weights)
        self._cache[key] = self._by_content[content] = routes
        return routes


@dataclass(slots=True)
class PhaseRecord:
    """One phase of a collective's run on otherwise idle links (times from the collective's start)."""

    wait_end_s: float = 0.0  # its predecessors have ended
    start_s: float = 0.0  # its flows enter the network
    end_s: float = 0.0
    flows: PhaseFlows | None = None
    rates: list | None = None  # [(time, rate per sub-flow)] as the run's solves set them; None: it ran alone
    finish_s: np.ndarray | None = None  # per sub-flow

    def state_at(self, t: float, capacity: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Bytes each sub-flow still has to send at time t, and the finish times of those that have ended.
        capacity: the links' (bytes/s), for a phase that ran alone (its rates are recomputed, not kept)."""
        rates = self.rates
        if rates is None:
            alone = isolated_timeline(self.flows.entry_flow, self.flows.entry_link, self.flows.weights,
                                      self.flows.sizes, capacity)
            starts = [0.0] + [end for end, _ in alone.segments[:-1]]
            rates = [(self.start_s + s, rate) for s, (_, rate) in zip(starts, alone.segments, strict=True)]
        remaining = self.flows.sizes.astype(float).copy()
        times = [time for time, _ in rates] + [self.end_s]
        for (t_from, rate), t_to in zip(rates, times[1:], strict=True):
            if t_from >= t:
                break
            span = min(t_to, t) - t_from  # 0 for a rate replaced at the same instant
            if span > 0:
                remaining = np.maximum(remaining - rate * span, 0.0)
        ended = self.finish_s <= t
        remaining[ended] = 0.0
        return remaining, np.where(ended, self.finish_s, np.nan)


@dataclass(slots=True)
class IsolatedRun:
    """A multi-phase collective's run on otherwise idle links: what a reservation stands in for."""

    duration_s: float
    links: np.ndarray
    link_bytes: np.ndarray
    num_flows: int
    phases: list[PhaseRecord]


MAX_RECORDED_RUNS = 1024  # runs of collectives that do not repeat (skewed routing) are dropped oldest first


SMALL_RUN_FLOATS = 4096  # isolated runs up to this many rate values are kept for phases that repeat


def _is_chain(phases: list[Phase]) -> bool:
    """Each phase waits for the one before it (and perhaps earlier ones), the first for none."""
    return all(p.after == () if i == 0 else (i - 1 in p.after and max(p.after) == i - 1)
               for i, p in enumerate(phases))


def _bounded_put(memo: dict, key: Hashable, value: object) -> None:
    if len(memo) >= MAX_RECORDED_RUNS:
        memo.pop(next(iter(memo)))
    memo[key] = value


class CollectiveRunner:
    """Starts the phases of collectives and p2p transfers on the flow network.

    A collective of several phases that starts on idle links runs as a reservation: its course on
    otherwise idle links is recorded once per (key, phases) in a private network (the same
    flow network and phase code) and the main network holds its links until it ends, one event instead of
    one per phase and per rate change. When another flow set is about to start on one of its links, the
    reservation turns into the flow sets running at that moment (bytes still to send from the recorded
    rates) and the phases not started yet, which then run as any others: the result is that of running
    every phase, up to float rounding.
    """

    reserves = True  # False: every phase runs on the network (tests compare the two)

    def __init__(self, env: simpy.Environment, network: FlowNetwork, topo: Topology) -> None:
        self.env, self.network, self.topo = env, network, topo
        self.route_cache = RouteCache(topo)
        self.overhead_s = topo.params.message_overhead_s
        self._runs: dict[Hashable, tuple[list[Phase], IsolatedRun]] = {}
        self._by_signature: dict[Hashable, IsolatedRun] = {}
        self._solved = SolvedAhead()
        self._small_runs: dict[Hashable, Timeline] = {}
        self.num_reserved = self.num_broken = 0

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
        if len(phases) > 1 and self.reserves:
            recorded = self._isolated_run(phases, gpus, key)
            if not self.network.busy[recorded.links].any():
                return self._reserve(recorded, phases, gpus, key)
        done = start_phases(self.env, phases, lambda index, phase, waits: self._phase(phase, gpus, (key, index), waits))
        return done[0] if len(done) == 1 else self.env.all_of(done)

    def solve_ahead(self, collectives: list[list[Phase]], gpus: tuple[str, ...], key: Hashable) -> None:
        """Collectives of these members and key that are to run (e.g. a step's skewed all-to-alls of one layer):
        the isolated runs of their phases, grouped by route structure, are solved in batches now
        (fairshare.isolated_timelines); recording a collective then takes its phases' runs from there."""
        batches: dict[Hashable, tuple[PhaseFlows, dict[bytes, np.ndarray]]] = {}
        for phases in collectives:
            for index, phase in enumerate(phases):
                if phase.src.size == 0:
                    continue
                _, flows, _ = self._phase_flows(phase, gpus, (key, index))
                cells = flows.sizes.size * np.unique(flows.entry_link).size
                known = (flows.key, flows.sizes.tobytes())
                if cells <= BATCH_MAX_CELLS and known not in self._solved:
                    batches.setdefault(flows.key, (flows, {}))[1].setdefault(known[1], flows.sizes)
        for pattern, (flows, by_sizes) in batches.items():
            if len(by_sizes) < 2:
                continue  # nothing to share the array operations with: solved when recorded
            solved = isolated_timelines(flows.entry_flow, flows.entry_link, np.stack(list(by_sizes.values())),
                                        self.network.capacity, flows.weight)
            for raw, timeline in zip(by_sizes, solved, strict=True):
                self._solved.put((pattern, raw), timeline)

    def _delayed(self, phases: list[Phase], gpus: tuple[str, ...], key: Hashable, delay_s: float):
        yield self.env.timeout(delay_s)
        return (yield self.run(phases, gpus, key))

    def flow_latency_s(self, phase: Phase, gpus: tuple[str, ...], key: Hashable) -> np.ndarray:
        """Each flow's largest path latency in a single-phase run of this phase with this key."""
        pattern = ((key, 0), phase.src.tobytes(), phase.dst.tobytes())
        return self.route_cache.routes(gpus, phase.src, phase.dst, pattern).flow_latency_s

    def _phase_flows(self, phase: Phase, gpus: tuple[str, ...], key: Hashable) -> tuple[Routes, PhaseFlows, float]:
        pattern = (key, phase.src.tobytes(), phase.dst.tobytes())
        routes = self.route_cache.routes(gpus, phase.src, phase.dst, pattern)
        flows = PhaseFlows(routes.entry_flow, routes.entry_link, phase.sizes[routes.sub_flow] * routes.sub_fraction,
                           weight=routes.sub_weight, key=pattern)
        return routes, flows, phase_delay_s(phase, self.overhead_s, routes.latency_s)

    def _phase(self, phase: Phase, gpus: tuple[str, ...], key: Hashable, waits: list[simpy.Event]) -> PhaseProcess:
        if phase.src.size == 0:
            return (yield from run_phase(self.env, self.network, waits, 0.0, None))
        routes, flows, delay = self._phase_flows(phase, gpus, key)
        sub_finish = yield from run_phase(self.env, self.network, waits, delay, flows)
        finish = np.zeros(phase.src.size)
        np.maximum.at(finish, routes.sub_flow, sub_finish)
        return finish

    # ---- reservations ----------------------------------------------------------------------------
    def _isolated_run(self, phases: list[Phase], gpus: tuple[str, ...], key: Hashable) -> IsolatedRun:
        """The collective's course alone on the network (recorded in a private one; memoized)."""
        memo = (key, id(phases))  # callers pass the same list again for a collective that repeats
        hit = self._runs.get(memo)
        if hit is not None and hit[0] is phases:
            return hit[1]
        # a new list may still describe a run seen before (a backward all-to-all moves its forward's matrix)
        signature = (key, tuple((p.src.tobytes(), p.dst.tobytes(), p.sizes.tobytes(), p.after, p.messages,
                                 p.overhead_s, p.delay_s) for p in phases))
        run = self._by_signature.get(signature)
        if run is None:
            run = self._record(phases, gpus, key)
            _bounded_put(self._by_signature, signature, run)
        _bounded_put(self._runs, memo, (phases, run))  # the list is kept, so its id is not reused meanwhile
        return run

    def _record(self, phases: list[Phase], gpus: tuple[str, ...], key: Hashable) -> IsolatedRun:
        records = self._record_chain(phases, gpus, key) if _is_chain(phases) else self._record_events(phases, gpus, key)
        started = [r.flows for r in records if r.flows is not None]
        entry_links = [f.entry_link for f in started]
        links = np.unique(np.concatenate(entry_links)) if entry_links else np.zeros(0, dtype=np.int64)
        link_bytes = np.zeros(self.network.capacity.shape[0])
        for f in started:
            link_bytes += np.bincount(f.entry_link, weights=(f.sizes * f.weights)[f.entry_flow],
                                      minlength=link_bytes.shape[0])
        return IsolatedRun(duration_s=max(r.end_s for r in records), links=links, link_bytes=link_bytes,
                           num_flows=int(sum(f.weights.sum() for f in started)), phases=records)

    def _record_chain(self, phases: list[Phase], gpus: tuple[str, ...], key: Hashable) -> list[PhaseRecord]:
        """Phases that run one after another (the split exchange, then the data; rounds) each run alone: their
        records follow from their isolated timelines, with the times an event loop would give them."""
        records, t = [], 0.0
        for index, phase in enumerate(phases):
            rec = PhaseRecord(wait_end_s=t, start_s=t, end_s=t)
            records.append(rec)
            if phase.src.size == 0:
                continue
            _, rec.flows, delay = self._phase_flows(phase, gpus, (key, index))
            if delay > 0:
                rec.start_s = t = t + delay
            sizes = np.where(rec.flows.sizes > EPS_BYTES, rec.flows.sizes, 0.0)
            if not sizes.any():
                rec.end_s, rec.finish_s, rec.rates = t, np.full(sizes.shape[0], t), []
                continue
            timeline = self._alone(rec.flows, sizes)
            rec.end_s = t = t + timeline.duration_s
            rec.finish_s = rec.start_s + timeline.finish_offset_s
        return records

    def _alone(self, flows: PhaseFlows, sizes: np.ndarray) -> Timeline:
        """The phase's flows alone on their links: solved ahead, seen before (small runs are kept), or solved."""
        known = (flows.key, flows.sizes.tobytes())
        timeline = self._solved.pop(known) or self._small_runs.get(known)
        if timeline is None:
            timeline = isolated_timeline(flows.entry_flow, flows.entry_link, flows.weights, sizes,
                                         self.network.capacity)
            if timeline.num_floats <= SMALL_RUN_FLOATS:
                _bounded_put(self._small_runs, known, timeline)
        return timeline

    def _record_events(self, phases: list[Phase], gpus: tuple[str, ...], key: Hashable) -> list[PhaseRecord]:
        """Phases that may overlap: run in a private flow network of their own."""
        env = simpy.Environment()
        net = FlowNetwork(env, self.network.capacity, solved=self._solved)
        net.log = {}
        records = [PhaseRecord() for _ in phases]

        def process(index: int, phase: Phase, waits: list[simpy.Event]) -> PhaseProcess:
            if waits:
                yield env.all_of(waits)
            rec = records[index]
            rec.wait_end_s = rec.start_s = rec.end_s = env.now
            if phase.src.size == 0:
                return
            _, rec.flows, delay = self._phase_flows(phase, gpus, (key, index))
            if delay > 0:
                yield env.timeout(delay)
            rec.start_s = env.now
            net.last_set = None
            done = net.start(rec.flows.entry_flow, rec.flows.entry_link, rec.flows.sizes, weight=rec.flows.weight,
                             key=rec.flows.key)
            flow_set = net.last_set
            finish = yield done
            rec.end_s, rec.finish_s = env.now, np.asarray(finish)
            if flow_set is None:
                rec.rates = []
            elif flow_set.timeline is None:  # other flows joined it: its solves were logged
                rec.rates = net.log.get(flow_set, [])

        start_phases(env, phases, process)
        env.run()
        return records

    def _reserve(self, recorded: IsolatedRun, phases: list[Phase], gpus: tuple[str, ...],
                 key: Hashable) -> simpy.Event:
        t0, done = self.env.now, self.env.event()
        self.network.count(recorded.link_bytes, recorded.num_flows)
        self.num_reserved += 1
        reservation = self.network.reserve(recorded.links,
                                           lambda: self._break(recorded, phases, gpus, key, t0, done))

        def end(_ev) -> None:
            if reservation.live:
                self.network.release(reservation)
                done.succeed()

        self.env.timeout(recorded.duration_s).callbacks.append(end)
        return done

    def _break(self, recorded: IsolatedRun, phases: list[Phase], gpus: tuple[str, ...], key: Hashable, t0: float,
               done: simpy.Event) -> None:
        """Another flow set needs the reserved links: the phases running now become flow sets with the bytes they
        still have to send, those not started wait and start as in a run of every phase."""
        self.num_broken += 1
        t = self.env.now - t0
        events: list[simpy.Event | None] = []
        adopted = []
        for index, rec in enumerate(recorded.phases):
            if rec.end_s <= t:
                events.append(None)
            elif rec.flows is not None and rec.start_s <= t:
                remaining, finish = rec.state_at(t, self.network.capacity)
                ev = self.env.event()
                adopted.append(self.network.adopt(rec.flows.entry_flow, rec.flows.entry_link, rec.flows.weights,
                                                  remaining, finish + t0, t0 + rec.start_s, ev))
                events.append(ev)
            else:
                events.append(self.env.process(self._resume(index, phases[index], rec, events, t0, gpus, key)))
        self.network.resolve_sets(adopted)
        pending = [ev for ev in events if ev is not None]
        if pending:
            self.env.all_of(pending).callbacks.append(lambda _ev: done.succeed())
        else:
            done.succeed()

    def _resume(self, index: int, phase: Phase, rec: PhaseRecord, events: list, t0: float, gpus: tuple[str, ...],
                key: Hashable) -> PhaseProcess:
        """A phase of a broken reservation that had not started: its predecessors still running, or its delay."""
        waits = [events[a] for a in phase.after if events[a] is not None]
        if phase.src.size == 0:
            if waits:
                yield self.env.all_of(waits)
            return
        _, flows, delay = self._phase_flows(phase, gpus, (key, index))
        if waits:
            yield self.env.all_of(waits)
            wait = delay
        else:
            wait = t0 + rec.start_s - self.env.now
        if wait > 0:
            yield self.env.timeout(wait)
        yield self.network.start(flows.entry_flow, flows.entry_link, flows.sizes, weight=flows.weight, key=flows.key,
                                 counted=False)
