"""Running collectives and p2p transfers on the flow network: routes, phases, reservations.

Owns `RouteCache` (the sub-flows and link incidences of flows between member GPUs, found by content and
memoized per flow pattern) and `CollectiveRunner`, the engine's way of starting a collective: its phases
run on the network (piper_sim.network.phase_run), or, for a collective of several phases on idle links, as one
reservation of a run recorded once (piper_sim.network.recording). Must not import torch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Generator, Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np
import simpy

from piper_sim.collectives.algorithms import Phase
from piper_sim.network.flows import FlowNetwork
from piper_sim.network.phase_run import PhaseFlows, PhaseProcess, phase_delay_s, run_phase, start_phases
from piper_sim.network.recording import IsolatedRun, PhaseRecord, Recorder, RunMemo, Starting, overlapping
from piper_sim.topology.graph import Topology


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


@dataclass(slots=True)
class Reserved:
    """What a reservation stands in for: collectives' recorded runs and the links they hold together."""

    runs: list[IsolatedRun]
    links: np.ndarray
    counts: tuple[np.ndarray, int, np.ndarray] | None = None  # (bytes, flows, links) of runs on disjoint links
    ends: dict[float, list[int]] | None = None  # members by the end of their run, once found
    phases: list[list[Phase]] | None = None  # a recurring batch's collectives' phases (its key holds their ids)

    def disjoint(self) -> bool:
        """Whether the runs' links are disjoint; if so, their bytes per link are kept for one count."""
        run_links = np.concatenate([run.links for run in self.runs])
        if np.unique(run_links).shape[0] != run_links.shape[0]:
            return False
        link_bytes = np.concatenate([run.link_bytes for run in self.runs])
        self.counts = (link_bytes, sum(run.num_flows for run in self.runs), run_links)
        return True

    def by_end(self) -> dict[float, list[int]]:
        """Members by the end of their run (one event per distinct end), each list in member order."""
        if self.ends is None:
            self.ends = {}
            for m, run in enumerate(self.runs):
                self.ends.setdefault(run.duration_s, []).append(m)
        return self.ends


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
        sub_flow: list[int]
        entry_link: list[int]
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
        routes = Routes(
            np.array(sub_flow, dtype=np.int64),
            np.array(sub_frac),
            np.array(entry_flow, dtype=np.int64),
            np.array(entry_link, dtype=np.int64),
            latency,
            flow_latency,
            None if (weights == 1.0).all() else weights,
        )
        self._cache[key] = self._by_content[content] = routes
        return routes


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
        self.recorder = Recorder(network.capacity, self._phase_flows, topo.reverse_link, network.partitions)
        self._starting: list[Starting] = []  # multi-phase collectives starting at this instant
        self._batches: RunMemo[Reserved] = RunMemo(16)  # recurring batches of collectives each alone on its links
        self.num_reserved = self.num_broken = 0

    def run(
        self,
        phases: list[Phase],
        gpus: tuple[str, ...],
        key: Hashable,
        delay_s: float = 0.0,
        finish_times: bool = False,
        done: simpy.Event | None = None,
    ) -> simpy.Event:
        """Event that fires when every phase has ended. key names (members, algorithm, pattern).

        delay_s: a host-side cost paid before the first phase (the profile's per-call overhead).
        finish_times: the event's value is each flow's finish time (seconds, absolute; a single phase), which its
        phase's flow set gives; else a collective starts at the end of this instant, with the others that start in
        it (_start_together), and the event's value is the time it ends.
        done: the caller's event to fire as that one (not with finish_times), sparing an event a collective where
        the caller's own would only follow it.
        """
        if delay_s > 0:
            return self.env.process(self._delayed(phases, gpus, key, delay_s, finish_times, done))
        if phases and self.reserves and not (finish_times and len(phases) == 1):
            done = done or self.env.event()
            if not self._starting:
                self.env.timeout(0).callbacks.append(self._start_together)
            self._starting.append(Starting(phases, gpus, key, done))
            return done
        if not phases:
            ev = self.env.event()
            ev.succeed(np.zeros(0))
        else:
            ends = start_phases(
                self.env, phases, lambda index, phase, waits: self._phase(phase, gpus, (key, index), waits)
            )
            ev = ends[0] if len(ends) == 1 else self.env.all_of(ends)
        if done is not None:
            ev.callbacks.append(functools.partial(self._fire, done))
        return ev

    def _fire(self, done: simpy.Event, _ev: simpy.Event) -> None:
        done.succeed(self.env.now)

    def _start_together(self, _ev: simpy.Event) -> None:
        """The collectives that start at this instant, grouped by shared links: a group on idle links runs as a
        reservation of their run together (recorded once per group of collectives: the EP groups of a stage start
        their all-to-alls together, layer after layer); on busy links its phases start as any others. Groups of one
        collective are reserved as one batch (the tensor-parallel groups of a stage: one reservation, one event per
        distinct end), each member's run its own; a batch of such collectives that recurs (the same collectives, the
        same phases' lists: a layer's TP collectives every micro-batch) is found whole (_batches)."""
        starting, self._starting = self._starting, []
        batch_key = tuple((c.key, id(c.phases)) for c in starting)
        batch = self._batches.get(batch_key)
        if batch is not None and all(c.phases is p for c, p in zip(starting, batch.phases or (), strict=True)):
            if not self.network.busy[batch.links].any():
                self._reserve(starting, batch, None)
                return
        links = [self.recorder.links(c) for c in starting]
        alone: list[int] = []
        for cluster in overlapping(links):
            members = [starting[i] for i in cluster]
            union = links[cluster[0]] if len(cluster) == 1 else np.unique(np.concatenate([links[i] for i in cluster]))
            if self.network.busy[union].any():
                for c in members:
                    # mypy cannot type a lambda with a default (here binding the loop's c), nor a callback's value
                    events = start_phases(
                        self.env,
                        c.phases,
                        lambda index, phase, waits, c=c: self._phase(  # type: ignore[misc]
                            phase, c.gpus, (c.key, index), waits
                        ),
                    )
                    self.env.all_of(events).callbacks.append(lambda _ev, done=c.done: done.succeed(self.env.now))  # type: ignore[misc]
            elif len(members) == 1:
                alone.append(cluster[0])
            else:
                runs, replay = self.recorder.run_together(members)
                self._reserve(members, Reserved(runs, union), replay)
        if alone:
            union = links[alone[0]] if len(alone) == 1 else np.concatenate([links[i] for i in alone])  # disjoint
            members = [starting[i] for i in alone]
            reserved = Reserved([self.recorder.isolated_run(c) for c in members], union)
            if len(alone) == len(starting) and reserved.disjoint():  # every collective alone: the batch recurs
                reserved.phases = [c.phases for c in members]  # (kept: the ids in its key stay theirs)
                self._batches.put(batch_key, reserved, reserved.runs)
            self._reserve(members, reserved, None)

    def _delayed(
        self,
        phases: list[Phase],
        gpus: tuple[str, ...],
        key: Hashable,
        delay_s: float,
        finish_times: bool,
        done: simpy.Event | None,
    ):
        yield self.env.timeout(delay_s)
        return (yield self.run(phases, gpus, key, finish_times=finish_times, done=done))

    def flow_latency_s(self, phase: Phase, gpus: tuple[str, ...], key: Hashable) -> np.ndarray:
        """Each flow's largest path latency in a single-phase run of this phase with this key."""
        pattern = ((key, 0), phase.src.tobytes(), phase.dst.tobytes())
        return self.route_cache.routes(gpus, phase.src, phase.dst, pattern).flow_latency_s

    def _phase_flows(self, phase: Phase, gpus: tuple[str, ...], key: Hashable) -> tuple[Routes, PhaseFlows, float]:
        pattern = (key, phase.src.tobytes(), phase.dst.tobytes())
        routes = self.route_cache.routes(gpus, phase.src, phase.dst, pattern)
        flows = PhaseFlows(
            routes.entry_flow,
            routes.entry_link,
            phase.sizes[routes.sub_flow] * routes.sub_fraction,
            weight=routes.sub_weight,
            key=pattern,
        )
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
    def _reserve(self, members: list[Starting], reserved: Reserved, replay: Callable[[float], dict] | None) -> None:
        """Hold the links while the collectives run as recorded; each member's done fires at its own end. If other
        flows come onto the links, the members still running turn into flow sets (_break)."""
        t0 = self.env.now
        runs, links = reserved.runs, reserved.links
        if reserved.counts is None:
            for run in runs:
                self.network.count(run.link_bytes, run.num_flows, run.links)
        else:  # the runs' links are disjoint: their bytes in one go
            self.network.count(*reserved.counts)
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
                    # m bound by default (mypy wants both variants' signatures alike)
                    def state(index: int, rec: PhaseRecord, m: int = m) -> tuple[np.ndarray, np.ndarray]:  # type: ignore[misc]
                        hit = replayed.get((m, index))  # absent: it starts at this very instant
                        if hit is None:
                            assert rec.flows is not None  # _break asks for the state of started phases only
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
                members[m].done.succeed(self.env.now)

        def end_all(ending: list[int], _ev: simpy.Event) -> None:
            for m in ending:
                end(m)

        for duration, ending in reserved.by_end().items():
            self.env.timeout(duration).callbacks.append(functools.partial(end_all, ending))

    def _break(
        self,
        recorded: IsolatedRun,
        c: Starting,
        t0: float,
        state: Callable[[int, PhaseRecord], tuple[np.ndarray, np.ndarray]],
    ) -> list:
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
                adopted.append(
                    self.network.adopt(
                        rec.flows.entry_flow,
                        rec.flows.entry_link,
                        rec.flows.weights,
                        remaining,
                        finish + t0,
                        t0 + rec.start_s,
                        ev,
                        key=rec.flows.key,
                    )
                )
                events.append(ev)
            else:
                events.append(self.env.process(self._resume(index, c.phases[index], rec, events, t0, c.gpus, c.key)))
        pending = [ev for ev in events if ev is not None]
        if pending:  # simpy drops a callback's value (here the event succeed returns)
            self.env.all_of(pending).callbacks.append(lambda _ev: c.done.succeed(self.env.now))  # type: ignore[arg-type]
        else:
            c.done.succeed(self.env.now)
        return adopted

    def _resume(
        self, index: int, phase: Phase, rec: PhaseRecord, events: list, t0: float, gpus: tuple[str, ...], key: Hashable
    ) -> Generator[simpy.Event, Any, None]:
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
        yield self.network.start(
            flows.entry_flow, flows.entry_link, flows.sizes, weight=flows.weight, key=flows.key, counted=False
        )
