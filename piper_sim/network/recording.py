"""Recorded runs of collectives on otherwise idle links: what a reservation stands in for.

Owns `Recorder`: a multi-phase collective's course alone on its links (or several collectives' course
together, when they start at one instant on shared links), recorded once in a private flow network (the
same network and phase code as the main one) or, for phases that run one after another, from their
isolated timelines; memoized by the collectives' contents. A phase's record keeps its rates where other
flows shared its links, so the bytes still to send at any moment can be found when a reservation breaks
(PhaseRecord.state_at); a run of several collectives together keeps them too where they are few, else it is
replayed to that moment. The reservations themselves (holding links, breaking) are
piper_sim.network.collective_runner.CollectiveRunner's.
Must not import torch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Generator, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np
import simpy

from piper_sim.collectives.algorithms import Phase
from piper_sim.network.batch import overlapping  # noqa: F401 (the runner groups collectives with it)
from piper_sim.network.fairshare import (
    EPS_BYTES,
    LATENCY_ONLY_S,
    PartitionMemo,
    Timeline,
    compact_ids,
    isolated_timeline,
    latency_only,
)
from piper_sim.network.flow_set import FlowSet, check_finite
from piper_sim.network.flows import FlowNetwork
from piper_sim.network.mirror import TimelineMemo
from piper_sim.network.phase_run import PhaseFlows, start_phases

PhaseFlowsOf = Callable[[Phase, tuple[str, ...], Hashable], tuple[object, PhaseFlows, float]]


@dataclass(slots=True)
class PhaseRecord:
    """One phase of a collective's run on otherwise idle links (times from the collective's start)."""

    wait_end_s: float = 0.0  # its predecessors have ended
    start_s: float = 0.0  # its flows enter the network
    end_s: float = 0.0
    flows: PhaseFlows | None = None
    rates: list | None = None  # [(time, rate per sub-flow)] as the run's solves set them; None: it ran alone
    finish_s: np.ndarray | None = None  # per sub-flow
    alone: Timeline | None = None  # a phase that ran alone: its rates, once asked for, when they are few

    def state_at(self, t: float, capacity: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Bytes each sub-flow still has to send at time t, and the finish times of those that have ended.
        capacity: the links' (bytes/s), for a phase that ran alone (its rates are recomputed, and kept while a
        run of few waves: a recorded run repeats, and so do breaks of its reservation)."""
        assert self.flows is not None and self.finish_s is not None  # a recorded phase that started its flows
        rates = self.rates
        if rates is None:
            alone = self.alone or isolated_timeline(
                self.flows.entry_flow, self.flows.entry_link, self.flows.weights, self.flows.sizes, capacity
            )
            if alone.num_waves <= KEPT_WAVES:
                self.alone = alone
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
    link_bytes: np.ndarray  # bytes carried on each of `links`
    num_flows: int
    phases: list[PhaseRecord]


@dataclass(frozen=True, slots=True)
class Starting:
    """A multi-phase collective about to start, and the event its end fires."""

    phases: list[Phase]
    gpus: tuple[str, ...]
    key: Hashable
    done: simpy.Event


MAX_RECORDED_RUNS = 1024  # entries of the recorder's smaller memos (links, small runs), dropped oldest first
RECORDED_SUB_FLOWS = 1 << 22  # sub-flows the memoized runs of collectives hold together (RunMemo) ...
RECORDED_RUNS = 4096  # ... and how many they are at most (each also holds its keys and records)


SMALL_RUN_FLOATS = 4096  # isolated runs of at most this many flows x waves are kept for phases that repeat
KEPT_WAVES = 8  # a phase that ran alone keeps its rates once computed if it ran in at most this many waves
REPLAYED_FLOATS = 1 << 23  # bytes left and finish times that replayed states hold together (64 MiB)
KEPT_COURSE_FLOATS = 1 << 20  # rate values a course of collectives run together keeps (8 MiB); a longer one is replayed
TOGETHER_FLOATS = 1 << 23  # the sub-flows and kept rates of the courses run together held at once (RunMemo)


def is_chain(phases: list[Phase]) -> bool:
    """Each phase waits for the one before it (and perhaps earlier ones), the first for none."""
    return all(p.after == () if i == 0 else (i - 1 in p.after and max(p.after) == i - 1) for i, p in enumerate(phases))


V = TypeVar("V")  # what a RunMemo keeps by key


class RunMemo(Generic[V]):
    """Recorded runs by key, the oldest dropped first once their phases' sub-flows together pass RECORDED_SUB_FLOWS
    or they pass RECORDED_RUNS: a bound on what they hold more than on how many they are, so a skewed run's
    all-to-alls (each of its own matrix, needed again by its backward a pipeline's depth of micro-batches later)
    stay while a few large runs are dropped sooner."""

    def __init__(self, runs_scale: int = 1, held_bound: int | None = None) -> None:
        """runs_scale: entries at most, in RECORDED_RUNS (a memo of references to another memo's runs keeps more);
        held_bound: the weight they hold together at most (None: RECORDED_SUB_FLOWS)."""
        self.runs_scale, self.held_bound = runs_scale, held_bound
        self._items: dict[Hashable, tuple[V, int]] = {}
        self._held = 0

    def get(self, key: Hashable) -> V | None:
        hit = self._items.get(key)
        return None if hit is None else hit[0]

    def put(self, key: Hashable, value: V, runs: IsolatedRun | list[IsolatedRun]) -> None:
        """Keep value, which holds these runs (what it weighs)."""
        held = runs if isinstance(runs, list) else [runs]
        self.keep(key, value, sum(r.flows.sizes.shape[0] for run in held for r in run.phases if r.flows is not None))

    def keep(self, key: Hashable, value: V, weight: int) -> None:
        """Keep value, which weighs `weight` (sub-flows, or the floats it holds)."""
        if key in self._items:
            return
        self._items[key] = (value, weight + 1)
        self._held += weight + 1
        bound = self.runs_scale * RECORDED_RUNS
        held_bound = RECORDED_SUB_FLOWS if self.held_bound is None else self.held_bound
        while (self._held > held_bound or len(self._items) > bound) and len(self._items) > 1:
            self._held -= self._items.pop(next(iter(self._items)))[1]


def bounded_put(memo: dict, key: Hashable, value: object, bound: int = MAX_RECORDED_RUNS) -> None:
    if len(memo) >= bound:
        memo.pop(next(iter(memo)))
    memo[key] = value


class Recorder:
    """Runs of collectives on otherwise idle links, recorded once and memoized.

    phase_flows(phase, gpus, key) gives a phase's (routes, flows, delay before its flows enter), as the
    main network runs it; capacity: the links' (bytes/s); reverse_link: each link's link back of the same
    capacity, or -1 (Topology.reverse_link: a phase that mirrors one solved before reuses its timeline); partitions:
    the main network's equitable partitions (its private networks' components are often the main network's)."""

    def __init__(
        self,
        capacity: np.ndarray,
        phase_flows: PhaseFlowsOf,
        reverse_link: np.ndarray | None = None,
        partitions: PartitionMemo | None = None,
    ) -> None:
        self.capacity, self.phase_flows = capacity, phase_flows
        self.timelines = TimelineMemo(capacity, reverse_link)
        self._fastest = float(capacity.max()) if capacity.size else 0.0
        self._runs = RunMemo[tuple[list[Phase], IsolatedRun]](16)  # (key, id of the phases' list) -> (that list,
        # its run): a stage's groups x layers x roles (the runs themselves are _by_signature's)
        self._by_signature = RunMemo[IsolatedRun]()  # a run's contents (signature) -> its run
        self._small_runs: dict[Hashable, Timeline] = {}
        self._link_memo: dict[Hashable, tuple[list[Phase], np.ndarray]] = {}
        self._links_by_content: dict[Hashable, np.ndarray] = {}
        self._together = RunMemo[tuple[list[IsolatedRun], bool]](held_bound=TOGETHER_FLOATS)  # members' signatures ->
        # (runs, whether their records keep their rates)
        self._replayed = RunMemo[dict](held_bound=REPLAYED_FLOATS)  # (members' signatures, t) -> state (replay)
        self._partitions = PartitionMemo() if partitions is None else partitions  # its private networks' too

    def links(self, c: Starting) -> np.ndarray:
        """The links a collective's phases use, memoized as its recorded run is, and by what they depend on (its
        members and its phases' flows: the collectives of many layers and data-parallel replicas share them)."""
        memo = (c.key, id(c.phases))
        hit = self._link_memo.get(memo)
        if hit is not None and hit[0] is c.phases:
            return hit[1]
        content = (c.gpus, tuple((p.src.tobytes(), p.dst.tobytes()) for p in c.phases))
        links = self._links_by_content.get(content)
        if links is None:
            ids = [self.phase_flows(p, c.gpus, (c.key, i))[1].entry_link for i, p in enumerate(c.phases) if p.src.size]
            links = compact_ids(np.concatenate(ids))[0] if ids else np.zeros(0, dtype=np.int64)
            bounded_put(self._links_by_content, content, links, 8 * MAX_RECORDED_RUNS)
        bounded_put(self._link_memo, memo, (c.phases, links), 16 * MAX_RECORDED_RUNS)  # a stage's groups x layers
        return links

    @staticmethod
    def signature(c: Starting) -> Hashable:
        """What a collective's run depends on: its members and its phases' contents (not its name: dispatch and
        combine of one matrix run alike)."""
        return (
            c.gpus,
            tuple(
                (p.src.tobytes(), p.dst.tobytes(), p.sizes.tobytes(), p.after, p.messages, p.overhead_s, p.delay_s)
                for p in c.phases
            ),
        )

    def isolated_run(self, c: Starting) -> IsolatedRun:
        """The collective's course alone on the network (recorded in a private one; memoized)."""
        memo = (c.key, id(c.phases))  # callers pass the same list again for a collective that repeats
        hit = self._runs.get(memo)
        if hit is not None and hit[0] is c.phases:
            return hit[1]
        # a new list may still describe a run seen before (a backward all-to-all moves its forward's matrix)
        signature = self.signature(c)
        run = self._by_signature.get(signature)
        if run is None:
            if is_chain(c.phases):
                run = self._isolated(self._record_chain(c.phases, c.gpus, c.key))
            else:
                run = self._isolated(self._record_events([c], log=True)[0][0])  # rates kept whatever their size
            self._by_signature.put(signature, run, run)
        self._runs.put(memo, (c.phases, run), run)  # the list is kept, so its id is not reused meanwhile
        return run

    def run_together(self, members: list[Starting]) -> tuple[list[IsolatedRun], Callable[[float], dict] | None]:
        """Collectives that start together on shared links: their course together (recorded in a private network,
        memoized by the collectives' contents), each member's run as a record of its own, and where a reservation
        of them that breaks finds their state: in their records' rates (None: PhaseRecord.state_at), kept where
        the course's solves hold at most KEPT_COURSE_FLOATS rate values, else by replaying the course (replay)."""
        signature = tuple(self.signature(c) for c in members)
        hit = self._together.get(signature)
        if hit is None:
            records, _, logged = self._record_events(members, log=True, log_floats=KEPT_COURSE_FLOATS)
            runs = [self._isolated(r) for r in records]
            held = [(len(r.rates or ()), r.flows.sizes.shape[0]) for m in records for r in m if r.flows is not None]
            hit = (runs, logged)
            self._together.keep(signature, hit, sum((1 + solves) * n for solves, n in held))  # sub-flows, kept rates
        runs, logged = hit
        return runs, None if logged else self.replay(members, signature)

    def replay(self, members: list[Starting], signature: Hashable | None = None) -> Callable[[float], dict]:
        """State at time t of collectives run together, where their course is not kept (rates of every flow at every
        solve of a large group would take gigabytes): {(member, phase): (bytes left, finish times)}, arrays of the
        caller's own. A state is a function of the members' contents and t alone, and the same collectives are
        broken into at the same moment of their course micro-batch after micro-batch (a pipeline transfer that
        starts at the same offset): states are kept by both (REPLAYED_FLOATS). signature: the members' signatures,
        where the caller has them."""
        contents = signature if signature is not None else tuple(self.signature(c) for c in members)

        def state_at(t: float) -> dict:
            key = (contents, t)
            state = self._replayed.get(key)
            if state is None:
                state = self._record_events(members, log=False, until_s=t)[1]
                self._replayed.keep(key, state, sum(2 * left.shape[0] for left, _ in state.values()))
            return {where: (left.copy(), finish.copy()) for where, (left, finish) in state.items()}

        return state_at

    def _isolated(self, records: list[PhaseRecord]) -> IsolatedRun:
        started = [r.flows for r in records if r.flows is not None]
        entry_links = [f.entry_link for f in started]
        links = compact_ids(np.concatenate(entry_links))[0] if entry_links else np.zeros(0, dtype=np.int64)
        link_bytes = np.zeros(self.capacity.shape[0])
        for f in started:
            link_bytes += np.bincount(
                f.entry_link, weights=(f.sizes * f.weights)[f.entry_flow], minlength=link_bytes.shape[0]
            )
        link_bytes = link_bytes[links]  # kept for its own links only: runs are many, the machine's links too
        return IsolatedRun(
            duration_s=max(r.end_s for r in records),
            links=links,
            link_bytes=link_bytes,
            num_flows=int(sum(f.weights.sum() for f in started)),
            phases=records,
        )

    def _record_chain(self, phases: list[Phase], gpus: tuple[str, ...], key: Hashable) -> list[PhaseRecord]:
        """Phases that run one after another (the split exchange, then the data; rounds) each run alone: their
        records follow from their isolated timelines, with the times an event loop would give them."""
        records, t = [], 0.0
        for index, phase in enumerate(phases):
            rec = PhaseRecord(wait_end_s=t, start_s=t, end_s=t)
            records.append(rec)
            if phase.src.size == 0:
                continue
            _, rec.flows, delay = self.phase_flows(phase, gpus, (key, index))
            if delay > 0:
                rec.start_s = t = t + delay
            check_finite(rec.flows.sizes, rec.flows.key, t)
            sizes = np.where(rec.flows.sizes > EPS_BYTES, rec.flows.sizes, 0.0)
            if not sizes.any() or latency_only(
                rec.flows.entry_flow,
                rec.flows.entry_link,
                rec.flows.weights,
                sizes,
                self.capacity,
                LATENCY_ONLY_S,
                self._fastest,
            ):  # as the network does
                rec.end_s, rec.finish_s, rec.rates = t, np.full(sizes.shape[0], t), []
                continue
            timeline = self._alone(rec.flows, sizes)
            rec.end_s = t = t + timeline.duration_s
            rec.finish_s = rec.start_s + timeline.finish_offset_s
        return records

    def _alone(self, flows: PhaseFlows, sizes: np.ndarray) -> Timeline:
        """The phase's flows alone on their links: seen before (small runs of few waves are kept: phases that repeat
        inside other collectives, as split exchanges do), a relabelling of a run solved before (TimelineMemo), or
        solved."""
        known = (flows.key, flows.sizes.tobytes())
        timeline = self._small_runs.get(known)
        if timeline is None:
            timeline = self.timelines.timeline(flows.entry_flow, flows.entry_link, flows.weights, sizes)
            if sizes.shape[0] * timeline.num_waves <= SMALL_RUN_FLOATS:
                bounded_put(self._small_runs, known, timeline)
        return timeline

    def _record_events(
        self, members: list[Starting], *, log: bool, until_s: float | None = None, log_floats: int | None = None
    ) -> tuple[list[list[PhaseRecord]], dict, bool]:
        """Collectives whose phases may overlap, run from time 0 in a private flow network of their own: each
        member's phase records (log: with the rates of the solves of sets that did not run alone, unless they
        would hold more than log_floats rate values: then none), with until_s, the state of the phases running at
        that time {(member, phase): (bytes left, finish times)}, and whether the records have their rates."""
        env = simpy.Environment()
        net = FlowNetwork(env, self.capacity, partitions=self._partitions)
        net.log = {} if log else None
        net.log_floats_left = log_floats
        records = [[PhaseRecord() for _ in c.phases] for c in members]
        sets: dict[tuple[int, int], FlowSet | None] = {}

        def process(m: int, index: int, phase: Phase, waits: list[simpy.Event]) -> Generator[simpy.Event, object, None]:
            if waits:
                yield env.all_of(waits)
            rec = records[m][index]
            rec.wait_end_s = rec.start_s = rec.end_s = env.now
            if phase.src.size == 0:
                return
            _, rec.flows, delay = self.phase_flows(phase, members[m].gpus, (members[m].key, index))
            if delay > 0:
                yield env.timeout(delay)
            rec.start_s = env.now
            net.last_set = None
            done = net.start(
                rec.flows.entry_flow, rec.flows.entry_link, rec.flows.sizes, weight=rec.flows.weight, key=rec.flows.key
            )
            flow_set = sets[(m, index)] = net.last_set
            finish = yield done
            rec.end_s, rec.finish_s = env.now, np.asarray(finish)
            if flow_set is None or net.log is None:
                rec.rates = []
            elif flow_set.timeline is None:  # other flows joined it: its solves were logged
                rec.rates = net.log.get(flow_set, [])

        for m, c in enumerate(members):
            start_phases(env, c.phases, functools.partial(process, m))
        if until_s is None:
            env.run()
            net.close()
            if net.log_overflowed:  # rates of a part of the course only: none
                for rec in (r for member in records for r in member):
                    rec.rates = []
            return records, {}, log and not net.log_overflowed
        if until_s > 0:
            env.run(until=until_s)
        state = {}
        for where, fs in sets.items():
            if fs is not None and fs in net.active:
                net.advance_to_now(fs)
                state[where] = (fs.remaining.copy(), fs.finish_s.copy())
        net.close()  # its processes stopped mid-run hold it in reference cycles until the cyclic collector runs
        return records, state, False
