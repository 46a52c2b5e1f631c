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


@dataclass(frozen=True, slots=True)
class Starting:
    """A multi-phase collective about to start, and the event its end fires."""

    phases: list[Phase]
    gpus: tuple[str, ...]
    key: Hashable
    done: simpy.Event


def _overlapping(links: list[np.ndarray]) -> list[list[int]]:
    """Indices of link sets grouped by shared links (transitively), each group in index order."""
    groups: list[tuple[list[int], np.ndarray]] = []
    for i, own in enumerate(links):
        joined, rest = [i], []
        union = own
        for members, group_links in groups:
            if np.intersect1d(union, group_links, assume_unique=True).size:
                joined += members
                union = np.union1d(union, group_links)
            else:
                rest.append((members, group_links))
        groups = rest + [(sorted(joined), union)]
    return sorted((members for members, _ in groups), key=lambda m: m[0])


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
        self._starting: list[Starting] = []  # multi-phase collectives starting at this instant
        self._link_memo: dict[Hashable, tuple[list[Phase], np.ndarray]] = {}
        self._together: dict[Hashable, list[IsolatedRun]] = {}
        self.num_reserved = self.num_broken = 0

    def run(self, phases: list[Phase], gpus: tuple[str, ...], key: Hashable, delay_s: float = 0.0) -> simpy.Event:
        """Event that fires when every phase has ended. key names (members, algorithm, pattern).

        delay_s: a host-side cost paid before the first phase (the profile's per-call overhead).
        With a single phase the event's value is each flow's finish time (seconds, absolute).
        A multi-phase collective starts at the end of this instant, with the others that start in it
        (_start_together).
        """
        if delay_s > 0:
            return self.env.process(self._delayed(phases, gpus, key, delay_s))
        if not phases:
            ev = self.env.event()
            ev.succeed(np.zeros(0))
            return ev
        if len(phases) > 1 and self.reserves:
            done = self.env.event()
            if not self._starting:
                self.env.timeout(0).callbacks.append(self._start_together)
            self._starting.append(Starting(phases, gpus, key, done))
            return done
        done = start_phases(self.env, phases, lambda index, phase, waits: self._phase(phase, gpus, (key, index), waits))
        return done[0] if len(done) == 1 else self.env.all_of(done)

    def _start_together(self, _ev: simpy.Event) -> None:
        """The multi-phase collectives that start at this instant, grouped by shared links: a group on idle links
        runs as one reservation of their run together (recorded once per group of collectives: the EP groups of a
        stage start their all-to-alls together, layer after layer); on busy links its phases start as any others."""
        starting, self._starting = self._starting, []
        links = [self._links(c) for c in starting]
        for cluster in _overlapping(links):
            members = [starting[i] for i in cluster]
            union = links[cluster[0]] if len(cluster) == 1 else np.unique(np.concatenate([links[i] for i in cluster]))
            if self.network.busy[union].any():
                for c in members:
                    events = start_phases(self.env, c.phases, lambda index, phase, waits, c=c: self._phase(
                        phase, c.gpus, (c.key, index), waits))
                    self.env.all_of(events).callbacks.append(lambda _ev, done=c.done: done.succeed())
            elif len(members) == 1:
                self._reserve(members, [self._isolated_run(members[0])], union, None)
            else:
                self._reserve(members, self._run_together(members), union, self._replay(members))

    def _links(self, c: Starting) -> np.ndarray:
        """The links a collective's phases use (memoized as its recorded run is)."""
        memo = (c.key, id(c.phases))
        hit = self._link_memo.get(memo)
        if hit is not None and hit[0] is c.phases:
            return hit[1]
        ids = [self._phase_flows(p, c.gpus, (c.key, i))[1].entry_link for i, p in enumerate(c.phases) if p.src.size]
        links = np.unique(np.concatenate(ids)) if ids else np.zeros(0, dtype=np.int64)
        _bounded_put(self._link_memo, memo, (c.phases, links))
        return links

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
    @staticmethod
    def _signature(c: Starting) -> Hashable:
        """What a collective's run depends on: its members and its phases' contents (not its name: dispatch and
        combine of one matrix run alike)."""
        return (c.gpus, tuple((p.src.tobytes(), p.dst.tobytes(), p.sizes.tobytes(), p.after, p.messages,
                              p.overhead_s, p.delay_s) for p in c.phases))

    def _isolated_run(self, c: Starting) -> IsolatedRun:
        """The collective's course alone on the network (recorded in a private one; memoized)."""
        memo = (c.key, id(c.phases))  # callers pass the same list again for a collective that repeats
        hit = self._runs.get(memo)
        if hit is not None and hit[0] is c.phases:
            return hit[1]
        # a new list may still describe a run seen before (a backward all-to-all moves its forward's matrix)
        signature = self._signature(c)
        run = self._by_signature.get(signature)
        if run is None:
            if _is_chain(c.phases):
                run = self._isolated(self._record_chain(c.phases, c.gpus, c.key))
            else:
                run = self._isolated(self._record_events([c], log=True)[0][0])
            _bounded_put(self._by_signature, signature, run)
        _bounded_put(self._runs, memo, (c.phases, run))  # the list is kept, so its id is not reused meanwhile
        return run

    def _run_together(self, members: list[Starting]) -> list[IsolatedRun]:
        """Collectives that start together on shared links: their course together (recorded in a private network,
        memoized by the collectives' contents), each member's run as a record of its own."""
        signature = tuple(self._signature(c) for c in members)
        runs = self._together.get(signature)
        if runs is None:
            records, _ = self._record_events(members, log=False)
            runs = [self._isolated(r) for r in records]
            _bounded_put(self._together, signature, runs)
        return runs

    def _replay(self, members: list[Starting]) -> Callable[[float], dict]:
        """State at time t of collectives run together (the course is replayed, not kept: rates of every flow at
        every solve of a large group would take gigabytes): {(member, phase): (bytes left, finish times)}."""
        return lambda t: self._record_events(members, log=False, until_s=t)[1]

    def _isolated(self, records: list[PhaseRecord]) -> IsolatedRun:
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

    def _record_events(self, members: list[Starting], *, log: bool,
                       until_s: float | None = None) -> tuple[list[list[PhaseRecord]], dict]:
        """Collectives whose phases may overlap, run from time 0 in a private flow network of their own: each
        member's phase records (log: with the rates of the solves of sets that did not run alone), and with
        until_s, the state of the phases running at that time {(member, phase): (bytes left, finish times)}."""
        env = simpy.Environment()
        net = FlowNetwork(env, self.network.capacity, solved=self._solved)
        net.log = {} if log else None
        records = [[PhaseRecord() for _ in c.phases] for c in members]
        sets: dict[tuple[int, int], object] = {}

        def process(m: int, index: int, phase: Phase, waits: list[simpy.Event]) -> PhaseProcess:
            if waits:
                yield env.all_of(waits)
            rec = records[m][index]
            rec.wait_end_s = rec.start_s = rec.end_s = env.now
            if phase.src.size == 0:
                return
            _, rec.flows, delay = self._phase_flows(phase, members[m].gpus, (members[m].key, index))
            if delay > 0:
                yield env.timeout(delay)
            rec.start_s = env.now
            net.last_set = None
            done = net.start(rec.flows.entry_flow, rec.flows.entry_link, rec.flows.sizes, weight=rec.flows.weight,
                             key=rec.flows.key)
            flow_set = sets[(m, index)] = net.last_set
            finish = yield done
            rec.end_s, rec.finish_s = env.now, np.asarray(finish)
            if flow_set is None or not log:
                rec.rates = []
            elif flow_set.timeline is None:  # other flows joined it: its solves were logged
                rec.rates = net.log.get(flow_set, [])

        for m, c in enumerate(members):
            start_phases(env, c.phases, lambda index, phase, waits, m=m: process(m, index, phase, waits))
        if until_s is None:
            env.run()
            return records, {}
        if until_s > 0:
            env.run(until=until_s)
        state = {}
        for where, fs in sets.items():
            if fs is not None and fs in net.active:
                net.advance_to_now(fs)
                state[where] = (fs.remaining.copy(), fs.finish_s.copy())
        return records, state

    def _reserve(self, members: list[Starting], runs: list[IsolatedRun], links: np.ndarray,
                 replay: Callable[[float], dict] | None) -> None:
        """Hold the links while the collectives run as recorded; each member's done fires at its own end. If other
        flows come onto the links, the members still running turn into flow sets (_break)."""
        t0 = self.env.now
        for run in runs:
            self.network.count(run.link_bytes, run.num_flows)
        self.num_reserved += len(members)
        running = set(range(len(members)))

        def on_break() -> None:
            t = self.env.now - t0
            replayed = replay(t) if replay is not None else None
            adopted = []
            for m in sorted(running):
                c, run = members[m], runs[m]
                if replayed is None:
                    def state(index: int, rec: PhaseRecord) -> tuple[np.ndarray, np.ndarray]:
                        return rec.state_at(t, self.network.capacity)
                else:
                    def state(index: int, rec: PhaseRecord, m=m) -> tuple[np.ndarray, np.ndarray]:
                        hit = replayed.get((m, index))  # absent: it starts at this very instant
                        if hit is None:
                            return rec.flows.sizes.astype(float).copy(), np.full(rec.flows.sizes.shape[0], np.nan)
                        return hit
                adopted += self._break(run, c, t0, state)
            running.clear()
            self.network.resolve_sets(adopted)

        reservation = self.network.reserve(links, on_break)

        def end(m: int) -> None:
            if reservation.live and m in running:
                running.discard(m)
                if not running:
                    self.network.release(reservation)
                members[m].done.succeed()

        for m, run in enumerate(runs):
            self.env.timeout(run.duration_s).callbacks.append(lambda _ev, m=m: end(m))

    def _break(self, recorded: IsolatedRun, c: Starting, t0: float,
               state: Callable[[int, PhaseRecord], tuple[np.ndarray, np.ndarray]]) -> list:
        """Another flow set needs the reserved links: the phases running now become flow sets with the bytes they
        still have to send (state; returned, for the caller to solve), those not started wait and start as in a
        run of every phase."""
        self.num_broken += 1
        t = self.env.now - t0
        events: list[simpy.Event | None] = []
        adopted = []
        for index, rec in enumerate(recorded.phases):
            if rec.end_s <= t:
                events.append(None)
            elif rec.flows is not None and rec.start_s <= t:
                remaining, finish = state(index, rec)
                ev = self.env.event()
                adopted.append(self.network.adopt(rec.flows.entry_flow, rec.flows.entry_link, rec.flows.weights,
                                                  remaining, finish + t0, t0 + rec.start_s, ev))
                events.append(ev)
            else:
                events.append(self.env.process(self._resume(index, c.phases[index], rec, events, t0, c.gpus, c.key)))
        pending = [ev for ev in events if ev is not None]
        if pending:
            self.env.all_of(pending).callbacks.append(lambda _ev: c.done.succeed())
        else:
            c.done.succeed()
        return adopted

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
