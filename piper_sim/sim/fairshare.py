"""Max-min fair shares on a flow set, and the timeline of a flow set alone on its links.

Owns the progressive-filling solve (max_min_rates, fill_rates), the isolated run of one flow set
(isolated_timeline: filling resumed where ended flows froze) and of many sets sharing one route structure
(isolated_timelines), the Timeline record, and the store of runs solved ahead (SolvedAhead). Pure numpy;
the flow network (network.py) and the collective recorder (collective.py) use it.
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np

EPS_BYTES = 1e-3


def compact_ids(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sorted distinct non-negative ids, position of every id among them), without sorting all ids."""
    if ids.size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    present = np.bincount(ids) > 0
    used = np.flatnonzero(present)
    remap = np.cumsum(present) - 1
    return used, remap[ids]


def max_min_rates(entry_flow: np.ndarray, entry_link: np.ndarray, weight: np.ndarray,
                  capacity: np.ndarray) -> np.ndarray:
    """Max-min fair rate per flow (bytes/s) by progressive filling.

    entry_flow/entry_link list the (flow, link) incidences; weight[f] is how many identical flows
    flow f stands for (each gets the returned rate). Flows with no link get an infinite rate.
    """
    if not entry_flow.size:
        return np.full(weight.shape[0], np.inf)
    links, local_link = compact_ids(entry_link)
    return fill_rates(entry_flow, local_link, weight, capacity[links])


def fill_rates(entry_flow: np.ndarray, local_link: np.ndarray, weight: np.ndarray,
               capacity: np.ndarray) -> np.ndarray:
    """max_min_rates with links already numbered 0..L-1 (capacity[L]); links no entry uses are ignored."""
    return Filling(entry_flow, local_link, weight, capacity).solve(np.ones(weight.shape[0], dtype=bool))


class Filling:
    """Progressive filling over one incidence structure (links numbered 0..L-1), resumable after flows leave.

    solve(live) gives the max-min fair rates of the live flows (flow f stands for weight[f] identical flows; a
    live flow that crosses no link gets an infinite rate, the others 0). A later solve whose live flows are a
    subset of the previous one's (flows only left) resumes where the earliest leaver froze: the filling steps
    before it are unchanged (the links that saturated there carry no leaver, and taking leavers out only adds
    slack elsewhere), so their levels are kept, the flows frozen before it keep their rates, and only the flows
    still rising at that step are filled again, over their own incidences. The rates are those of a filling
    from zero on the live flows, up to float rounding. A live set that gained flows is filled from zero.
    """

    def __init__(self, entry_flow: np.ndarray, local_link: np.ndarray, weight: np.ndarray,
                 capacity: np.ndarray) -> None:
        self.cap_full = capacity.astype(float)
        self.floor = 1e-9 * self.cap_full  # a link whose spare capacity falls below this is saturated
        self.entries = (entry_flow, local_link, weight[entry_flow])
        self.flows, self.local, self.entry_weight = self.entries
        num_flows = weight.shape[0]
        self.has_link = np.zeros(num_flows, dtype=bool)
        self.has_link[entry_flow] = True
        self.frozen_at = np.zeros(num_flows, dtype=np.int64)  # filling step at which each flow froze
        self.levels: list[float] = []  # the rate of every still-rising flow after each filling step
        self.rate = np.zeros(num_flows)
        self.live: np.ndarray | None = None  # the live flows of the last solve

    def solve(self, live: np.ndarray) -> np.ndarray:
        free = live & ~self.has_link
        live = live & self.has_link
        if self.live is None or (live & ~self.live).any():  # the first solve, or flows came back: from zero
            step = 0
            self.flows, self.local, self.entry_weight = self.entries
        else:
            ended = self.live & ~live
            if not ended.any():
                return np.where(free, np.inf, self.rate) if free.any() else self.rate
            step = int(self.frozen_at[ended].min())
        keep = live[self.flows]
        if not keep.all():
            self.flows, self.local, self.entry_weight = self.flows[keep], self.local[keep], self.entry_weight[keep]
        flows, local, levels = self.flows, self.local, self.levels
        del levels[step:]
        level = levels[-1] if levels else 0.0
        rising = live & (self.frozen_at >= step)
        rate = np.where(rising, level, np.where(live, self.rate, 0.0))
        cap = self.cap_full - np.bincount(local, weights=self.entry_weight * rate[flows], minlength=self.cap_full.size)
        if rising.any():
            m = rising[flows]
            rf, rl, rw = flows[m], local[m], self.entry_weight[m]
            while True:
                load = np.bincount(rl, weights=rw, minlength=cap.size)
                used = load > 0
                inc = np.min(cap[used] / load[used])
                level += inc
                rate[rising] += inc
                cap -= inc * load
                frozen = rf[(used & (cap <= self.floor))[rl]]
                self.frozen_at[frozen] = len(levels)
                rising[frozen] = False
                levels.append(level)
                if not rising.any():
                    break
                m = rising[rf]
                rf, rl, rw = rf[m], rl[m], rw[m]
        self.rate, self.live = rate, live
        return np.where(free, np.inf, rate) if free.any() else rate


def isolated_timeline(entry_flow: np.ndarray, entry_link: np.ndarray, weight: np.ndarray, sizes: np.ndarray,
                      capacity: np.ndarray) -> Timeline:
    """A flow set's run alone on its links: solve the fair shares, run until the next flows end, repeat (each
    solve resumed where the ended flows froze: Filling)."""
    remaining = sizes.astype(float).copy()
    live = remaining > EPS_BYTES
    finish = np.where(live, np.nan, 0.0)
    links, local = compact_ids(entry_link)
    filling = Filling(entry_flow, local, weight, capacity[links])
    no_link = live & ~filling.has_link
    finish[no_link] = 0.0  # nothing to cross: arrived at once
    live &= ~no_link
    t, out = 0.0, []
    while live.any():
        rate = filling.solve(live)
        dt = float(np.min(remaining[live] / rate[live]))
        remaining = np.where(live, remaining - rate * dt, 0.0)
        t += dt
        ended = live & (remaining <= EPS_BYTES)
        finish[ended] = t
        live &= ~ended
        out.append((t, rate))
    return Timeline(out, finish)


BATCH_MAX_CELLS = 1 << 15  # flows x links of a flow set up to which timelines are solved in batches (dense)


def isolated_timelines(entry_flow: np.ndarray, entry_link: np.ndarray, sizes: np.ndarray,
                       capacity: np.ndarray, weight: np.ndarray | None = None) -> list[Timeline]:
    """isolated_timeline of K flow sets that share one route structure (one flow per entry_flow index, weight
    1 unless given), sizes[K, flows]: solved side by side, each wave of every set in the same array operations.

    Progressive filling from zero at every wave, over a dense flow x link incidence: loads are sums of the
    weights, so every rate, end and saturation is the one max_min_rates gives on that set's live flows.
    For small sets (flows x links up to BATCH_MAX_CELLS), where the cost of a wave is that of the array
    operations, not their size."""
    sizes = np.atleast_2d(np.asarray(sizes, dtype=float))
    num_sets, num_flows = sizes.shape
    links, local = compact_ids(entry_link)
    crosses = np.zeros((num_flows, links.size))
    np.add.at(crosses, (entry_flow, local), 1.0 if weight is None else weight[entry_flow])
    cap_full = capacity[links].astype(float)
    floor = 1e-9 * cap_full  # a link whose spare capacity falls below this is saturated
    remaining = sizes.copy()
    live = remaining > EPS_BYTES
    finish = np.where(live, np.nan, 0.0)
    no_link = live & (crosses.sum(axis=1) == 0)
    finish[no_link] = 0.0  # nothing to cross: arrived at once
    live &= ~no_link
    t = np.zeros(num_sets)
    segments: list[list[tuple[float, np.ndarray]]] = [[] for _ in range(num_sets)]
    with np.errstate(divide="ignore", invalid="ignore"):
        while live.any():
            running = live.any(axis=1)
            rate = np.zeros_like(remaining)
            rising = live.copy()
            cap = np.broadcast_to(cap_full, (num_sets, links.size)).copy()
            while rising.any():
                load = rising.astype(float) @ crosses
                used = load > 0
                inc = np.min(np.where(used, cap, np.inf) / load, axis=1)
                inc[~np.isfinite(inc)] = 0.0  # a set with nothing rising
                rate += inc[:, None] * rising
                cap -= inc[:, None] * load
                rising &= ~(((used & (cap <= floor)).astype(float) @ crosses.T) > 0)
            dt = np.min(np.where(live, remaining / rate, np.inf), axis=1)
            dt[~running] = 0.0
            remaining = np.where(live, remaining - rate * dt[:, None], 0.0)
            t += dt
            ended = live & (remaining <= EPS_BYTES)
            finish[ended] = np.broadcast_to(t[:, None], finish.shape)[ended]
            live &= ~ended
            for k in np.flatnonzero(running):
                segments[k].append((float(t[k]), rate[k].copy()))
    return [Timeline(seg, fin) for seg, fin in zip(segments, finish, strict=True)]


class Timeline:
    """A flow set's run on otherwise idle links: rate segments and each flow's finish offset."""

    __slots__ = ("segments", "finish_offset_s")

    def __init__(self, segments: list[tuple[float, np.ndarray]], finish_offset_s: np.ndarray) -> None:
        self.segments, self.finish_offset_s = segments, finish_offset_s

    @property
    def duration_s(self) -> float:
        return self.segments[-1][0] if self.segments else 0.0

    @property
    def num_floats(self) -> int:
        return sum(rate.size for _, rate in self.segments) + self.finish_offset_s.size


class SolvedAhead:
    """Isolated runs solved ahead of their use, by (route key, sizes bytes), each taken out when used; the oldest
    are dropped beyond max_floats rate values held (an unused one is solved again if needed: same result)."""

    def __init__(self, max_floats: int = 1 << 25) -> None:
        self._runs: dict[Hashable, Timeline] = {}
        self.max_floats, self.floats = max_floats, 0

    def __contains__(self, key: Hashable) -> bool:
        return key in self._runs

    def put(self, key: Hashable, timeline: Timeline) -> None:
        self._runs[key] = timeline
        self.floats += timeline.num_floats
        while self.floats > self.max_floats and self._runs:
            self.pop(next(iter(self._runs)))

    def pop(self, key: Hashable, default: Timeline | None = None) -> Timeline | None:
        timeline = self._runs.pop(key, None)
        if timeline is None:
            return default
        self.floats -= timeline.num_floats
        return timeline
