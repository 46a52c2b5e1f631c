"""Flow-level network on SimPy: concurrent flows share link capacity max-min fairly.

Owns FlowNetwork: the active flow sets (each a flow_set.FlowSet), their links' reservations and completion events
(the fair-share solves themselves are fairshare.py). Rates are recomputed when flows start or end, only for the
component of flow sets that share links with the change. A set that runs alone on its links follows a timeline that
depends only on its routes and sizes, so that timeline is memoized: identical collectives on idle links (the common
case in a pipelined schedule) cost one cache lookup and one event. Latency and per-message overhead are paid by the
caller before flows enter (see collective_runner.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable

import numpy as np
import simpy

from piper_sim.network import kernels
from piper_sim.network.batch import Pending, overlapping, union
from piper_sim.network.fairshare import (
    EPS_BYTES,
    LATENCY_ONLY_S,
    PartitionMemo,
    StructureCache,
    Timeline,
    compact_ids,
    isolated_timeline,
    latency_only,
    max_min_rates,
)
from piper_sim.network.flow_set import (
    ActiveSets,
    FlowSet,
    Reservation,
    advance,
    check_finite,
    describe,
    materialize,
    settle,
)


class FlowNetwork:
    """All flows in flight on one topology."""

    def __init__(
        self,
        env: simpy.Environment,
        capacity_bytes_per_s: np.ndarray,
        slowdown: Callable[[np.ndarray], np.ndarray] | None = None,
        latency_only_s: float = LATENCY_ONLY_S,
        batch: bool = False,
        partitions: PartitionMemo | None = None,
    ) -> None:
        """slowdown: load per link (the weights of its live flows) -> divisor of each link's capacity, for
        resources that lose throughput as more flows share them (cores taking turns); None: fixed capacity.
        latency_only_s: a flow set that holds each of its links at most this long runs outside the sharing
        (fairshare.latency_only; 0: none does). batch: flow sets asked to start at one instant enter together at its
        end, those that share links as one set of parts (batch.py); else each enters as it is asked to.
        partitions: where the equitable partitions of its components are kept (fairshare.PartitionMemo; one of its
        own if None)."""
        self.env = env
        self.capacity = capacity_bytes_per_s
        self.latency_only_s = latency_only_s
        self._fastest = float(capacity_bytes_per_s.max()) if capacity_bytes_per_s.size else 0.0
        self.slowdown = slowdown
        self.link_bytes = np.zeros(capacity_bytes_per_s.shape[0])
        self.active = ActiveSets()  # with their links (which of them a new set shares a link with)
        self._timelines: dict[Hashable, Timeline] = {}
        self._own_partitions = partitions is None
        self.partitions = PartitionMemo() if partitions is None else partitions
        self._structures = StructureCache(self.partitions)
        self._links_of: dict[Hashable, tuple[np.ndarray, np.ndarray]] = {}
        self.busy = np.zeros(capacity_bytes_per_s.shape[0], dtype=np.int64)  # active sets per link
        self.num_flows = 0
        self.num_solves = 0
        self.num_sets = 0
        self.reserved = np.zeros(capacity_bytes_per_s.shape[0], dtype=np.int64)  # reservations per link
        self.reservations: list[Reservation] = []
        self.log: dict | None = None  # {set: [(time, rates)]} of the solves of sets that did not run alone, when a
        # caller records a run
        self.log_floats_left: int | None = None  # rate values the log may still hold (None: no bound); past it the
        # log is dropped (log None, log_overflowed): a course of many solves of large components takes gigabytes
        self.log_overflowed = False
        self.last_set: FlowSet | None = None  # the last set entered (without batch: the one start just entered)
        self.batch = batch
        self._pending: list[Pending] = []  # sets asked to start at this instant (batch)

    # ---- public ----------------------------------------------------------------------------------
    def start(
        self,
        entry_flow: np.ndarray,
        entry_link: np.ndarray,
        sizes: np.ndarray,
        weight: np.ndarray | None = None,
        key: Hashable | None = None,
        counted: bool = True,
    ) -> simpy.Event:
        """Start flows now; the returned event fires when all have arrived, with each flow's finish time. A set
        too small to share links (fairshare.latency_only) ends as it starts.

        key, when given, names the route structure (same key = same entry arrays) so that an
        isolated run can be memoized by (key, sizes). counted: False for flows a reservation already
        counted (their bytes and number).
        """
        check_finite(sizes, key, self.env.now)
        weight = np.ones(sizes.shape[0]) if weight is None else weight
        distinct = self._links_of.get(key) if key is not None else None
        if distinct is None:
            distinct = compact_ids(entry_link)  # (the links, each entry's position among them)
            if key is not None:
                self._links_of[key] = distinct
        if counted:  # bytes per link, summed over the set's own links only (a machine has thousands)
            self.count(
                np.bincount(distinct[1], weights=(sizes * weight)[entry_flow], minlength=distinct[0].shape[0]),
                int(weight.sum()),
                distinct[0],
            )
        done = self.env.event()
        keep = sizes > EPS_BYTES
        if not keep.any() or latency_only(
            entry_flow, entry_link, weight, sizes, self.capacity, self.latency_only_s, self._fastest, distinct
        ):  # nothing to move, or too little to share links
            done.succeed(np.full(sizes.shape[0], self.env.now))
            return done
        pending = Pending(entry_flow, entry_link, weight, np.where(keep, sizes, 0.0), distinct[0], key, done)
        if not self.batch:
            if (fs := self._open([pending])) is not None:
                self._resolve(self._component(fs))
        else:
            if not self._pending:
                self.env.timeout(0).callbacks.append(self._flush)
            self._pending.append(pending)
        return done

    def _flush(self, _ev: simpy.Event) -> None:
        """The sets asked to start at this instant enter: those that share links as one set of parts, each group
        alone on idle links from its memoized run, the others' components solved once each."""
        pending, self._pending = self._pending, []
        clusters = overlapping([p.links for p in pending]) if len(pending) > 1 else [[0]]
        self.resolve_sets([fs for c in clusters if (fs := self._open([pending[i] for i in c])) is not None])

    def _open(self, sets: list[Pending]) -> FlowSet | None:
        """Sets that share links enter as one (one as itself); returns it unless it runs alone from a memoized run."""
        if len(sets) == 1:
            p, parts = sets[0], None
            entry_flow, entry_link, weight, sizes, key, links, done = (
                p.entry_flow,
                p.entry_link,
                p.weight,
                p.sizes,
                p.key,
                p.links,
                p.done,
            )
        else:
            entry_flow, entry_link, weight, sizes, key, parts = union(sets)
            links, done = np.unique(np.concatenate([p.links for p in sets])), self.env.event()
        if self.reservations and self.reserved[links].any():
            self._break_reservations(links)
        fs = FlowSet(entry_flow, entry_link, weight, sizes, done, self.env.now, links, self.num_sets, key)
        fs.parts = parts
        self.last_set = fs
        self.num_sets += 1
        isolated = not self.busy[links].any()
        self._join(fs)
        if isolated and key is not None:
            self._run_isolated(fs, (key, sizes.tobytes()))
            return None
        return fs

    def close(self) -> None:
        """Let go of what the solves keep (joined incidences, memoized runs, the active sets' state): a private network
        that a recorder stops mid-run stays in reference cycles of its suspended processes (SimPy generators, timers'
        callbacks) until Python's cyclic collector runs, which counts objects, not the arrays they hold."""
        for fs in self.active:
            fs.structure = fs.timeline = None
            fs.neighbors = set()
        self.active.clear()
        self._structures.clear()
        if self._own_partitions:
            self.partitions.clear()
        self._timelines.clear()
        self._links_of.clear()

    def count(self, link_bytes: np.ndarray, num_flows: int, links: np.ndarray | None = None) -> None:
        """Account bytes per link (on every link, or on `links` only) and a number of flows (at the start of what
        carries them)."""
        if links is None:
            self.link_bytes += link_bytes
        else:
            self.link_bytes[links] += link_bytes
        self.num_flows += num_flows

    # ---- reservations: a recorded run standing in for its flow sets while nothing else shares its links ----
    def reserve(self, links: np.ndarray, on_break: Callable[[], None]) -> Reservation:
        """Hold links for a run whose course is known while they stay otherwise idle. When a flow set is about
        to start on one of them, on_break is called first (the holder turns the run into real flow sets)."""
        r = Reservation(links, on_break)
        self.reserved[links] += 1
        self.busy[links] += 1
        self.reservations.append(r)
        return r

    def release(self, r: Reservation) -> None:
        if r.live:
            r.live = False
            self.reserved[r.links] -= 1
            self.busy[r.links] -= 1
            self.reservations.remove(r)

    def _break_reservations(self, links: np.ndarray) -> None:
        mask = np.zeros(self.busy.shape[0], dtype=bool)
        mask[links] = True
        for r in [r for r in self.reservations if mask[r.links].any()]:
            self.release(r)
            r.on_break()

    def adopt(
        self,
        entry_flow: np.ndarray,
        entry_link: np.ndarray,
        weight: np.ndarray,
        remaining: np.ndarray,
        finish_s: np.ndarray,
        t_start: float,
        done: simpy.Event,
        key: Hashable | None = None,
    ) -> FlowSet:
        """Add a flow set that has been running since t_start (flow weights, bytes still to send, finish times of
        the flows that have ended, NaN for the others); the caller resolves it (resolve_sets). key: as start's."""
        links = compact_ids(entry_link)[0]
        fs = FlowSet(entry_flow, entry_link, weight, remaining, done, self.env.now, links, self.num_sets, key)
        fs.t_start, fs.finish_s = t_start, np.array(finish_s, dtype=float)
        settle(fs, fs.rate, self.env.now)  # bytes left found from recorded rates can round to a few ulps' worth
        self.num_sets += 1
        self._join(fs)
        return fs

    def resolve_sets(self, sets: list[FlowSet]) -> None:
        """Solve the components of these sets (once each)."""
        done: set[FlowSet] = set()
        for fs in sets:
            if fs not in done and fs in self.active:
                comp = self._component(fs)
                done.update(comp)
                self._resolve(comp)

    # ---- internals -------------------------------------------------------------------------------
    def _join(self, fs: FlowSet) -> None:
        """fs becomes active: find the active sets it shares a link with (once, over the active sets' links; none
        where its links are idle, the common case) and keep the relation on both sides until one of them ends."""
        if self.active and self.busy[fs.links].any():
            mask = np.zeros(self.busy.shape[0], dtype=bool)
            mask[fs.links] = True
            fs.neighbors = self.active.sharing(mask)
            for other in fs.neighbors:
                other.neighbors.add(fs)
        self.busy[fs.links] += 1
        self.active.add(fs)

    def _touching(self, fs: FlowSet) -> set[FlowSet]:
        """Active sets sharing a link with fs."""
        return fs.neighbors

    def _component(self, fs: FlowSet) -> list[FlowSet]:
        """The sets linked to fs through shared links, in start order (not the sets' hash order, which
        changes from one process to the next and would order their timers, hence ties, differently)."""
        seen, todo = {fs}, [fs]
        while todo:
            for other in self._touching(todo.pop()):
                if other not in seen:
                    seen.add(other)
                    todo.append(other)
        return sorted(seen, key=lambda x: x.seq)

    def _run_isolated(self, fs: FlowSet, cache_key: Hashable) -> None:
        timeline = self._timelines.get(cache_key)
        if timeline is None:
            timeline = self._isolated_timeline(fs)
        self._timelines[cache_key] = timeline
        fs.timeline = timeline
        fs.version += 1
        self._schedule(fs, timeline.duration_s)
        if fs.parts is not None:  # parts that end before the whole: an event per distinct end
            ends = fs.parts.ends_s(timeline.finish_offset_s)
            version = fs.version
            for end_s in np.unique(ends[ends < timeline.duration_s]).tolist():
                which = np.flatnonzero(ends == end_s)
                self.env.timeout(end_s).callbacks.append(lambda _ev, w=which: self._part_timer(fs, version, w))  # type: ignore[misc]  # lambda with a default

    def _part_timer(self, fs: FlowSet, version: int, which: np.ndarray) -> None:
        """Parts of a set running from its memoized run end (unless another set has joined it since)."""
        if version == fs.version and fs.timeline is not None and fs.parts is not None:  # parts: set with the set
            fs.parts.fire(fs.t_start + fs.timeline.finish_offset_s, which)

    def _isolated_timeline(self, fs: FlowSet) -> Timeline:
        """Rate segments [(end offset, rates)] and finish offsets of fs running alone."""
        if self.slowdown is None:
            timeline = isolated_timeline(fs.entry_flow, fs.entry_link, fs.weight, fs.remaining, self.capacity)
            self.num_solves += timeline.num_waves
            return timeline
        remaining, t, times, rates = fs.remaining.copy(), 0.0, [], []
        finish = np.where(remaining > EPS_BYTES, np.nan, 0.0)
        while (live := remaining > EPS_BYTES).any():
            rate = self._solve_arrays(fs.entry_flow, fs.entry_link, fs.weight * live, live)
            dt = float(np.min(remaining[live] / rate[live]))
            remaining = np.where(live, remaining - rate * dt, 0.0)
            t += dt
            finish[live & (remaining <= EPS_BYTES)] = t
            times.append(t)
            rates.append(rate)
        return Timeline(np.array(times), np.array(rates, dtype=float).reshape(len(rates), remaining.shape[0]), finish)

    def _solve_arrays(self, entry_flow, entry_link, weight, live) -> np.ndarray:
        self.num_solves += 1
        keep = live[entry_flow]
        capacity = self.capacity
        if self.slowdown is not None:
            load = np.bincount(entry_link[keep], weights=weight[entry_flow[keep]], minlength=capacity.shape[0])
            capacity = capacity / self.slowdown(load)
        rate = max_min_rates(entry_flow[keep], entry_link[keep], weight, capacity)
        return np.where(live, rate, 0.0)

    def advance_to_now(self, fs: FlowSet) -> None:
        """Bring an active set's bytes still to send and finish times to the current time (a replay reads them)."""
        if fs.timeline is not None:
            materialize(fs, self.env.now, self.log)
        else:
            advance(fs, self.env.now)

    def _resolve(self, sets: list[FlowSet]) -> None:
        armed = []  # sets whose timer still stands if their rates do not change (a run from a timeline does not)
        for fs in sets:
            armed.append(fs.armed and fs.timeline is None)
            materialize(fs, self.env.now, self.log)
            advance(fs, self.env.now)
            if fs.parts is not None:
                fs.parts.fire(fs.finish_s)
        st = self._structures.of(sets, self.capacity, filled=self.slowdown is None)
        starts = [int(st.offsets[st.index[fs.seq]]) for fs in sets]
        if len(st.index) == len(sets):
            live = np.concatenate([fs.remaining > EPS_BYTES for fs in sets])
        else:
            live = np.zeros(st.num_flows, dtype=bool)
            for fs, start in zip(sets, starts, strict=True):
                live[start : start + fs.remaining.shape[0]] = fs.remaining > EPS_BYTES
        if st.filling is not None:
            self.num_solves += 1
            rate = st.filling.solve(live)
        else:
            rate = self._solve_arrays(st.entry_flow, st.entry_link, st.weight * live, live)
        if self.log is not None and self.log_floats_left is not None:  # the sets' rates are views of this solve's
            self.log_floats_left -= rate.shape[0]
            if self.log_floats_left < 0:
                self.log, self.log_overflowed = None, True
        for fs, start, kept in zip(sets, starts, armed, strict=True):
            new = rate[start : start + fs.remaining.shape[0]]
            unchanged = kept and new.tobytes() == fs.rate.tobytes()  # bit-equal (array_equal's cost is its checks)
            fs.rate = new
            if self.log is not None:
                self.log.setdefault(fs, []).append((self.env.now, fs.rate))
            if not unchanged:  # same rates, same bytes left: the next end its timer waits for is still the next end
                fs.version += 1
                self._schedule(fs, kernels.next_end(fs.remaining, fs.rate, EPS_BYTES))

    def _schedule(self, fs: FlowSet, delay: float) -> None:
        if not 0.0 <= delay < math.inf:  # NaN too: SimPy would take it and never reach the event
            raise RuntimeError(
                f"flow set {describe(fs.key)}: its next end is {delay!r} s away at {self.env.now!r} s "
                f"(bytes left {fs.remaining.tolist()[:4]}, rates {fs.rate.tolist()[:4]})"
            )
        version = fs.version
        fs.armed = True
        ev = self.env.timeout(delay)
        ev.callbacks.append(lambda _ev: self._on_timer(fs, version))

    def _on_timer(self, fs: FlowSet, version: int) -> None:
        if version != fs.version:
            return  # superseded by a later solve
        fs.armed = False
        if fs.timeline is not None:
            self._finish(fs)
            return
        advance(fs, self.env.now)
        if fs.parts is not None:
            fs.parts.fire(fs.finish_s)
        if (fs.remaining > EPS_BYTES).any():
            self._resolve(self._component(fs))
            return
        others = set(self._touching(fs))
        self._finish(fs)
        if others:
            # the finished set frees capacity for every component it touched
            done: set[FlowSet] = set()
            for other in sorted(others, key=lambda x: x.seq):
                if other not in done:
                    comp = self._component(other)
                    done.update(comp)
                    self._resolve(comp)

    def _finish(self, fs: FlowSet) -> None:
        self.busy[fs.links] -= 1
        self.active.remove(fs)
        for other in fs.neighbors:
            other.neighbors.discard(fs)
        fs.neighbors = set()
        fs.structure = None  # an ended set may still be referenced (a recorder's log): not its component's incidence
        fs.version += 1
        if fs.timeline is not None:
            fs.finish_s = fs.t_start + fs.timeline.finish_offset_s
        bad = np.flatnonzero(~np.isfinite(fs.finish_s))
        if bad.size:
            f = int(bad[0])
            raise RuntimeError(
                f"flow set {describe(fs.key)} ended at {self.env.now!r} s with finish time "
                f"{float(fs.finish_s[f])!r} for {bad.size} of its {fs.finish_s.size} flows (flow {f}: "
                f"{float(fs.remaining[f])!r} bytes left, started at {fs.t_start!r} s)"
            )
        if fs.parts is not None:
            fs.parts.fire(fs.finish_s)
        fs.done.succeed(fs.finish_s)
