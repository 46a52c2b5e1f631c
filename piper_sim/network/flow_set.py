"""A flow set on the network and how its state follows the clock.

Owns `FlowSet` (flows that start together: their incidences, bytes left, rates, finish times, and the memoized
isolated run they may follow), `Reservation` (links held for a recorded run), the moves of a set's bytes left to
a given time (advance at its rates, materialize from its memoized run, settle what the clock can no longer resolve)
and the errors that name a set (check_finite, describe). The flow network (flows.py) keeps the active sets.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable

import numpy as np
import simpy

from piper_sim.network import kernels
from piper_sim.network.batch import Parts
from piper_sim.network.fairshare import EPS_BYTES, Structure, Timeline


class FlowSet:
    """Flows that start together (one phase of a collective, or one p2p transfer)."""

    __slots__ = (
        "entry_flow",
        "entry_link",
        "weight",
        "remaining",
        "rate",
        "t_last",
        "done",
        "version",
        "timeline",
        "t_start",
        "links",
        "finish_s",
        "seq",
        "neighbors",
        "armed",
        "structure",
        "key",
        "parts",
    )

    def __init__(
        self,
        entry_flow: np.ndarray,
        entry_link: np.ndarray,
        weight: np.ndarray,
        sizes: np.ndarray,
        done: simpy.Event,
        now: float,
        links: np.ndarray,
        seq: int,
        key: Hashable | None = None,
    ) -> None:
        self.entry_flow, self.entry_link, self.weight = entry_flow, entry_link, weight
        self.key = key  # what the caller named it (a collective's members, algorithm, role and phase): for errors
        self.seq = seq  # start order: sets are always handled in it, so runs repeat exactly
        self.remaining = sizes.astype(float).copy()
        self.rate = np.zeros(sizes.shape[0])
        self.t_last = self.t_start = now
        self.done = done
        self.version = 0
        self.armed = False  # a timer of the current version is pending
        self.structure: Structure | None = None  # the joined incidence it was last solved on
        self.timeline: Timeline | None = None  # memoized isolated run
        self.links = links  # distinct link ids (int array)
        self.finish_s = np.where(sizes > EPS_BYTES, np.nan, now)  # per flow, filled as flows end
        self.neighbors: set[FlowSet] = set()  # the active sets it shares a link with (FlowNetwork keeps it)
        self.parts: Parts | None = None  # flow sets it was made of, each with its own end (batch.py)


class Reservation:
    """Links held for a run whose course is known (FlowNetwork.reserve); on_break turns it into its flow sets."""

    __slots__ = ("links", "on_break", "live")

    def __init__(self, links: np.ndarray, on_break: Callable[[], None]) -> None:
        self.links, self.on_break, self.live = links, on_break, True


class ActiveSets:
    """The active flow sets of a network, and their links set after set in growing arrays, to find the sets that share
    a link with a new one in one pass (not one test per active set: a 1,024-GPU run holds hundreds). A set that ends
    leaves its entries behind until they are half of all (its seq is no longer active)."""

    __slots__ = ("links", "seqs", "size", "sets", "stale")

    def __init__(self) -> None:
        self.links = np.zeros(1024, dtype=np.int64)
        self.seqs = np.zeros(1024, dtype=np.int64)
        self.size = self.stale = 0
        self.sets: dict[int, FlowSet] = {}  # the active sets by seq

    def add(self, fs: FlowSet) -> None:
        n = fs.links.shape[0]
        if self.size + n > self.links.shape[0]:
            grown = max(2 * self.links.shape[0], self.size + n)
            self.links = np.concatenate([self.links[: self.size], np.zeros(grown - self.size, dtype=np.int64)])
            self.seqs = np.concatenate([self.seqs[: self.size], np.zeros(grown - self.size, dtype=np.int64)])
        self.links[self.size : self.size + n] = fs.links
        self.seqs[self.size : self.size + n] = fs.seq
        self.size += n
        self.sets[fs.seq] = fs

    def remove(self, fs: FlowSet) -> None:
        if self.sets.pop(fs.seq, None) is None:
            return
        self.stale += fs.links.shape[0]
        if 2 * self.stale > self.size:
            kept = list(self.sets.values())
            self.size = self.stale = 0
            self.sets = {}
            for other in kept:
                self.add(other)

    def sharing(self, mask: np.ndarray) -> set[FlowSet]:
        """The active sets with a link in mask (a boolean per link)."""
        seqs = np.unique(self.seqs[: self.size][mask[self.links[: self.size]]]).tolist()
        return {self.sets[seq] for seq in seqs if seq in self.sets}

    def clear(self) -> None:
        self.size = self.stale = 0
        self.sets.clear()

    def __contains__(self, fs: FlowSet) -> bool:
        return self.sets.get(fs.seq) is fs

    def __len__(self) -> int:
        return len(self.sets)

    def __iter__(self):
        return iter(list(self.sets.values()))


def advance(fs: FlowSet, now: float) -> None:
    """Bring a set's bytes still to send and finish times from its last update to now at its rates."""
    dt = now - fs.t_last
    if dt > 0:  # bytes the clock cannot resolve any more count as sent, else a late, fast flow would be
        # re-solved forever at one instant (kernels.advance)
        kernels.advance(fs.remaining, fs.rate, dt, math.ulp(now), fs.finish_s, now, EPS_BYTES)
    fs.t_last = now


def materialize(fs: FlowSet, now: float, log: dict | None) -> None:
    """Turn a memoized isolated run into explicit remaining bytes at time now (the rates of its segments that
    began by then recorded in log, when a caller records a run: log_timeline)."""
    if fs.timeline is None:
        return
    elapsed, t_prev = now - fs.t_start, 0.0
    log_timeline(fs, elapsed, log)
    ended = fs.timeline.finish_offset_s <= elapsed
    fs.finish_s[ended] = fs.t_start + fs.timeline.finish_offset_s[ended]
    current = fs.rate
    for t_end, rate in fs.timeline.segments:
        span = min(t_end, elapsed) - t_prev
        if span <= 0:
            break
        fs.remaining = np.maximum(fs.remaining - rate * span, 0.0)
        t_prev, current = t_end, rate
    # now - t_start can round below a finish offset that t_start + offset, the set's own timer, reaches: the
    # flow is left a few ulps' worth of bytes and must end now, as advance ends it
    settle(fs, current, now)
    fs.t_last = now
    fs.timeline = None


def settle(fs: FlowSet, rate: np.ndarray, now: float) -> None:
    """A flow whose bytes left the clock cannot resolve any more (kernels.advance's rule at rate) has ended at now:
    a flow is live exactly while it has more than EPS_BYTES to send, and has a finish time exactly when not."""
    kernels.advance(fs.remaining, rate, 0.0, math.ulp(now), fs.finish_s, now, EPS_BYTES)


def log_timeline(fs: FlowSet, until_s: float, log: dict | None) -> None:
    """Record the rates of a memoized run's segments that began before offset until_s into log (FlowNetwork.log):
    a run that another set joined goes on from explicit bytes, its later solves logged as any others. A run that
    stays alone to its end logs nothing: its rates follow from its flows (isolated_timeline)."""
    if log is None or fs.timeline is None:  # (materialize calls it with a timeline)
        return
    entries, t_prev = log.setdefault(fs, []), 0.0
    for t_end, rate in fs.timeline.segments:
        if t_prev >= until_s:
            break
        entries.append((fs.t_start + t_prev, rate))
        t_prev = t_end


def check_finite(sizes: np.ndarray, key: Hashable | None, at_s: float) -> None:
    """A flow set's sizes must be finite: one clear error naming it (what it would do to the run is undefined)."""
    if not np.isfinite(sizes).all():
        raise RuntimeError(
            f"flow set {describe(key)} asked to start at {at_s!r} s with sizes "
            f"{sizes.tolist()[:4]} bytes: a size must be finite"
        )


def describe(key: Hashable | None) -> str:
    """A flow set's key for an error: its names (a collective's members, algorithm, role, phase index), with the
    byte strings of its route pattern elided."""
    if isinstance(key, bytes):
        return "..."
    if isinstance(key, tuple):
        return "(" + ", ".join(describe(k) for k in key) + ")"
    return repr(key)
