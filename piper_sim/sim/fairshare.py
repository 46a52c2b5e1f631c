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


def max_min_rates(entry_flow: np.ndarray, entry_link: np.ndarray, weight: np.ndarray,
                  capacity: np.ndarray) -> np.ndarray:
    """Max-min fair rate per flow (bytes/s) by progressive filling.

    entry_flow/entry_link list the (flow, link) incidences; weight[f] is how many identical flows
    flow f stands for (each gets the returned rate). Flows with no link get an infinite rate.
    """
    if not entry_flow.size:
        return np.full(weight.shape[0], np.inf)
    links, local_link = np.unique(entry_link, return_inverse=True)
    return fill_rates(entry_flow, local_link, weight, capacity[links])


def fill_rates(entry_flow: np.ndarray, local_link: np.ndarray, weight: np.ndarray,
               capacity: np.ndarray) -> np.ndarray:
    """max_min_rates with links already numbered 0..L-1 (capacity[L]); links no entry uses are ignored."""
    num_flows = weight.shape[0]
    rate = np.zeros(num_flows)
    active = np.zeros(num_flows, dtype=bool)
    active[entry_flow] = True
    rate[~active] = np.inf
    cap = capacity.astype(float)
    floor = 1e-9 * cap  # a link whose spare capacity falls below this is saturated
    entry_weight = weight[entry_flow]
    while True:
        load = np.bincount(local_link, weights=entry_weight, minlength=cap.size)
        used = load > 0
        inc = np.min(cap[used] / load[used])
        rate[active] += inc
        cap -= inc * load
        saturated = used & (cap <= floor)
        active[entry_flow[saturated[local_link]]] = False
        if not active.any():
            return rate
        rising = active[entry_flow]  # the frozen flows' incidences load nothing any more: drop them
        entry_flow, local_link, entry_weight = entry_flow[rising], local_link[rising], entry_weight[rising]


def isolated_timeline(entry_flow: np.ndarray, entry_link: np.ndarray, weight: np.ndarray, sizes: np.ndarray,
                      capacity: np.ndarray) -> Timeline:
    """A flow set's run alone on its links: solve the fair shares, run until the next flows end, repeat.

    Each solve is progressive filling resumed where the ended flows joined it: filling is the same up to the
    step at which the earliest of them froze (their links were not saturated before it, so taking them out
    changes no earlier step), so the levels reached before that step are kept, the flows frozen before it keep
    their rates, and only the flows still rising at that step are filled again, over their own incidences.
    The rates are those of max_min_rates on the live flows, up to float rounding."""
    remaining = sizes.astype(float).copy()
    num_flows = remaining.shape[0]
    live = remaining > EPS_BYTES
    finish = np.where(live, np.nan, 0.0)
    links, local = np.unique(entry_link, return_inverse=True)
    cap_full = capacity[links].astype(float)
    floor = 1e-9 * cap_full  # a link whose spare capacity falls below this is saturated
    flows, entry_weight = entry_flow, weight[entry_flow]
    no_link = live.copy()
    no_link[flows] = False
    finish[no_link] = 0.0  # nothing to cross: arrived at once
    live &= ~no_link
    frozen_at = np.zeros(num_flows, dtype=np.int64)  # filling step at which each flow froze
    levels: list[float] = []  # the rate of every still-rising flow after each filling step
    rate = np.zeros(num_flows)
    ended = np.zeros(num_flows, dtype=bool)
    t, out = 0.0, []
    while live.any():
        keep = live[flows]
        if not keep.all():
            flows, local, entry_weight = flows[keep], local[keep], entry_weight[keep]
        step = int(frozen_at[ended].min()) if ended.any() else 0
        del levels[step:]
        level = levels[-1] if levels else 0.0
        rising = live & ((frozen_at >= step) | (step == 0))
        rate = np.where(rising, level, np.where(live, rate, 0.0))
        cap = cap_full - np.bincount(local, weights=entry_weight * rate[flows], minlength=cap_full.size)
        if rising.any():
            m = rising[flows]
            rf, rl, rw = flows[m], local[m], entry_weight[m]
            while True:
                load = np.bincount(rl, weights=rw, minlength=cap_full.size)
                used = load > 0
                inc = np.min(cap[used] / load[used])
                level += inc
                rate[rising] += inc
                cap -= inc * load
                frozen = rf[(used & (cap <= floor))[rl]]
                frozen_at[frozen] = len(levels)
                rising[frozen] = False
                levels.append(level)
                if not rising.any():
                    break
                m = rising[rf]
                rf, rl, rw = rf[m], rl[m], rw[m]
        dt = float(np.min(remaining[live] / rate[live]))
        remaining = np.where(live, remaining - rate * dt, 0.0)
        t += dt
        ended = live & (remaining <= EPS_BYTES)
        finish[ended] = t
        live &= ~ended
        out.append((t, rate.copy()))
    return Timeline(out, finish)


BATCH_MAX_CELLS = 1 << 15  # flows x links of a flow set up to which timelines are solved in batches (dense)


def isolated_timelines(entry_flow: np.ndarray, entry_link: np.ndarray, sizes: np.ndarray,
                       capacity: np.ndarray) -> list[Timeline]:
    """isolated_timeline of K flow sets that share one route structure (one flow per entry_flow index, weight
    1), sizes[K, flows]: solved side by side, each wave of every set in the same array operations.

    Progressive filling from zero at every wave, over a dense flow x link incidence: loads are sums of ones,
    so every rate, end and saturation is the one max_min_rates gives on that set's live flows, bit for bit.
    For small sets (flows x links up to BATCH_MAX_CELLS), where the cost of a wave is that of the array
    operations, not their size."""
    sizes = np.atleast_2d(np.asarray(sizes, dtype=float))
    num_sets, num_flows = sizes.shape
    links, local = np.unique(entry_link, return_inverse=True)
    crosses = np.zeros((num_flows, links.size))
    np.add.at(crosses, (entry_flow, local), 1.0)
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
