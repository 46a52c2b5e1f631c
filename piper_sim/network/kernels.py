"""Compiled inner loops of the fair-share solves (numba): progressive filling, and a flow set's run alone.

Pure numeric code over a flow set's incidences in compressed form (Incidence); fairshare.py owns what the
numbers mean and is the only caller. Progressive filling (_refill) raises every rising flow's rate by the same
increment until a link saturates (its spare capacity below 1e-9 of its capacity); the flows crossing it freeze
at that level. The loads of the links are kept as flows freeze instead of being summed again at every step. When
flows leave, every flow frozen below the lowest leaver's level keeps its rate (the links of a flow frozen at level
L all saturate at L or later, and with fewer flows later still), so the filling restarts at that level over the
flows at or above it, on spare capacity = capacity - the frozen flows' rates - level x the rising flows' weights:
a solve after departures (_resume) and each wave of a flow set's run alone (_timeline) cost the flows they refill.
Compiled on first use and cached on disk (numba's `cache=True`), so only a machine's first run pays for it.
"""

from __future__ import annotations

import numba
import numpy as np

SATURATED = 1e-9  # a link whose spare capacity falls below this share of its capacity is saturated
ROWS_UP_FRONT = 1 << 22  # rate values of a run allocated at once (it grows beyond)


class Incidence:
    """A flow set's (flow, link) incidences, flow-major and link-major, links numbered 0..L-1, with the scratch
    arrays its solves reuse."""

    __slots__ = ("flow_ptr", "flow_link", "link_ptr", "link_flow", "num_flows", "num_links", "has_link", "scratch")

    def __init__(self, entry_flow: np.ndarray, local_link: np.ndarray, num_flows: int, num_links: int) -> None:
        self.num_flows, self.num_links = num_flows, num_links
        self.flow_ptr, self.flow_link, self.link_ptr, self.link_flow = _compressed(
            np.asarray(entry_flow, dtype=np.int64), np.asarray(local_link, dtype=np.int64), num_flows, num_links
        )
        self.has_link = self.flow_ptr[1:] > self.flow_ptr[:-1]
        self.scratch = (
            np.zeros(num_links),
            np.zeros(num_links),
            np.zeros(num_links, dtype=np.int64),
            np.zeros(num_links, dtype=np.int64),
            np.zeros(num_flows, dtype=np.bool_),
        )
        # load, cap, rising_on, active, rising: a filling's (_refill) working arrays, all zero between fillings


def timeline(
    inc: Incidence,
    weight: np.ndarray,
    sizes: np.ndarray,
    capacity: np.ndarray,
    eps_bytes: float,
    keep_rates: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The set's run alone from time 0: (end of each wave, rates in it [wave, flow] (no rows unless keep_rates),
    each flow's finish), a wave lasting until the next flows end. Flows of at most eps_bytes, or crossing no link,
    finish at 0."""
    return _timeline(
        inc.flow_ptr,
        inc.flow_link,
        inc.link_ptr,
        inc.link_flow,
        np.asarray(weight, dtype=float),
        np.asarray(sizes, dtype=float),
        np.asarray(capacity, dtype=float),
        eps_bytes,
        keep_rates,
        *inc.scratch,
    )


def compressed(
    entry_flow: np.ndarray, local_link: np.ndarray, num_flows: int, num_links: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(flow pointers, links in flow order, link pointers, flows in link order) of int64 incidences."""
    return _compressed(entry_flow, local_link, num_flows, num_links)


@numba.njit(cache=True)
def _compressed(entry_flow, local_link, num_flows, num_links):  # pragma: no cover - compiled
    """(flow pointers, links in flow order, link pointers, flows in link order), each entry in its given order
    within its flow and its link (a counting sort)."""
    flow_ptr = np.zeros(num_flows + 1, dtype=np.int64)
    link_ptr = np.zeros(num_links + 1, dtype=np.int64)
    for e in range(entry_flow.shape[0]):
        flow_ptr[entry_flow[e] + 1] += 1
        link_ptr[local_link[e] + 1] += 1
    for f in range(num_flows):
        flow_ptr[f + 1] += flow_ptr[f]
    for link in range(num_links):
        link_ptr[link + 1] += link_ptr[link]
    flow_link = np.empty(entry_flow.shape[0], dtype=np.int64)
    link_flow = np.empty(entry_flow.shape[0], dtype=np.int64)
    at_flow = flow_ptr[:-1].copy()
    at_link = link_ptr[:-1].copy()
    for e in range(entry_flow.shape[0]):
        f, link = entry_flow[e], local_link[e]
        flow_link[at_flow[f]] = link
        at_flow[f] += 1
        link_flow[at_link[link]] = f
        at_link[link] += 1
    return flow_ptr, flow_link, link_ptr, link_flow


def refill(
    inc: Incidence,
    weight: np.ndarray,
    capacity: np.ndarray,
    live: np.ndarray,
    state: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> None:
    """Max-min fair rates of the live flows into state's rate array, resumed from the last solve on this incidence
    when flows only left since (state: rate, the live flows of the last solve, the frozen rates per link)."""
    _resume(
        live,
        inc.has_link,
        inc.flow_ptr,
        inc.flow_link,
        inc.link_ptr,
        inc.link_flow,
        np.asarray(weight, dtype=float),
        np.asarray(capacity, dtype=float),
        *state,
        *inc.scratch,
    )


@numba.njit(cache=True)
def _resume(
    live,
    has_link,
    flow_ptr,
    flow_link,
    link_ptr,
    link_flow,
    weight,
    capacity,
    rate,
    last_live,
    frozen_load,
    load,
    cap,
    rising_on,
    active,
    rising,
):  # pragma: no cover - compiled
    """Flows that left since the last solve (live then, not now) give up their rates, and every flow at or above the
    lowest of those rates refills from it (as _timeline's waves); a flow live now and not then starts it over."""
    num_flows = live.shape[0]
    members = np.empty(num_flows, dtype=np.int64)
    level = np.inf
    joined = False
    for f in range(num_flows):
        if not has_link[f]:
            continue
        if live[f] and not last_live[f]:
            joined = True
        elif last_live[f] and not live[f]:
            level = min(level, rate[f])
    count = 0
    if joined:
        frozen_load[:] = 0.0
        level = 0.0
        for f in range(num_flows):
            rate[f] = 0.0
            if live[f] and has_link[f]:
                members[count] = f
                count += 1
    else:
        for f in range(num_flows):
            if not has_link[f] or not last_live[f] or rate[f] < level:
                continue
            _unfreeze(f, flow_ptr, flow_link, weight, rate, frozen_load)
            if live[f]:
                members[count] = f
                count += 1
            else:
                rate[f] = 0.0
    for f in range(num_flows):
        last_live[f] = live[f] and has_link[f]
    if count:
        _refill(
            members,
            count,
            level,
            flow_ptr,
            flow_link,
            link_ptr,
            link_flow,
            weight,
            capacity,
            rate,
            frozen_load,
            load,
            cap,
            rising_on,
            active,
            rising,
        )


@numba.njit(cache=True)
def _min_ratio(index, count, numerator, denominator):  # pragma: no cover - compiled
    """The smallest numerator[j] / denominator[j] over j in index[:count] (inf when count is 0)."""
    low = np.inf
    for i in range(count):
        j = index[i]
        v = numerator[j] / denominator[j]
        if v < low:
            low = v
    return low


@numba.njit(cache=True)
def _timeline(
    flow_ptr,
    flow_link,
    link_ptr,
    link_flow,
    weight,
    sizes,
    capacity,
    eps_bytes,
    keep_rates,
    load,
    cap,
    rising_on,
    active,
    rising,
):  # pragma: no cover - compiled
    """A flow set alone from time 0, wave by wave, each wave's filling resumed at the lowest leaver's level (the
    module's docstring; frozen_load keeps the frozen rates per link). A flow's bytes left are kept from the time its
    rate last changed, so a wave touches only the flows it refills."""
    num_flows = sizes.shape[0]
    frozen_load = np.zeros(capacity.shape[0])
    finish = np.full(num_flows, np.nan)
    rate = np.zeros(num_flows)
    left = sizes.copy()  # bytes left at since[f]
    since = np.zeros(num_flows)
    members = np.empty(num_flows, dtype=np.int64)
    refill = np.empty(num_flows, dtype=np.int64)
    live = 0
    for f in range(num_flows):
        if left[f] > eps_bytes and flow_ptr[f + 1] > flow_ptr[f]:
            members[live] = f
            refill[live] = f
            live += 1
        else:
            finish[f] = 0.0
    rows = max(min(live, ROWS_UP_FRONT // max(num_flows, 1)), 1) if keep_rates else 0  # waves <= flows that end
    times = np.empty(max(live, 1))
    rates = np.zeros((rows, num_flows))
    end = np.full(num_flows, np.inf)  # when each live flow ends at its rate
    done_at = np.full(num_flows, np.inf)  # when it has eps_bytes left (a leaver of a wave ending then, at the latest)
    num_refill, level, waves, kept_end = live, 0.0, 0, np.inf
    while live > 0:
        _refill(
            refill,
            num_refill,
            level,
            flow_ptr,
            flow_link,
            link_ptr,
            link_flow,
            weight,
            capacity,
            rate,
            frozen_load,
            load,
            cap,
            rising_on,
            active,
            rising,
        )
        t_next = kept_end  # the next end: the earliest of the flows that kept their rates and of those refilled
        for i in range(num_refill):
            f = refill[i]
            end[f] = since[f] + left[f] / rate[f]
            done_at[f] = end[f] - eps_bytes / rate[f]
            t_next = min(t_next, end[f])
        if keep_rates:
            if waves == rows:
                rows *= 2
                grown = np.zeros((rows, num_flows))
                grown[:waves] = rates[:waves]
                rates = grown
            for i in range(live):
                rates[waves, members[i]] = rate[members[i]]
        times[waves] = t_next
        waves += 1
        level = np.inf  # the lowest level a leaver froze at
        kept = 0
        screen = t_next + 1e-12 * abs(t_next)
        for i in range(live):
            f = members[i]
            # a flow ends when what it has left at t_next is at most eps_bytes (done_at screens out the others)
            if done_at[f] <= screen and left[f] - rate[f] * (t_next - since[f]) <= eps_bytes:
                finish[f] = t_next
                level = min(level, rate[f])
                _unfreeze(f, flow_ptr, flow_link, weight, rate, frozen_load)
                rate[f] = 0.0
            else:
                members[kept] = f
                kept += 1
        live = kept
        num_refill, kept_end = 0, np.inf
        for i in range(live):
            f = members[i]
            if rate[f] >= level:
                left[f] -= rate[f] * (t_next - since[f])
                since[f] = t_next
                _unfreeze(f, flow_ptr, flow_link, weight, rate, frozen_load)
                refill[num_refill] = f
                num_refill += 1
            else:
                kept_end = min(kept_end, end[f])
    return times[:waves], rates[:waves], finish


@numba.njit(cache=True)
def _unfreeze(f, flow_ptr, flow_link, weight, rate, frozen_load):  # pragma: no cover - compiled
    for e in range(flow_ptr[f], flow_ptr[f + 1]):
        frozen_load[flow_link[e]] -= weight[f] * rate[f]


@numba.njit(cache=True)
def _refill(
    flows,
    num_flows,
    level,
    flow_ptr,
    flow_link,
    link_ptr,
    link_flow,
    weight,
    capacity,
    rate,
    frozen_load,
    load,
    cap,
    rising_on,
    active,
    rising,
):  # pragma: no cover - compiled
    """Progressive filling of flows[:num_flows] from `level` up, the other flows on their links frozen
    (frozen_load); each flow that freezes adds its rate to frozen_load."""
    num_active = 0
    for i in range(num_flows):
        f = flows[i]
        rising[f] = True
        for e in range(flow_ptr[f], flow_ptr[f + 1]):
            link = flow_link[e]
            if rising_on[link] == 0:
                active[num_active] = link
                num_active += 1
            load[link] += weight[f]
            rising_on[link] += 1
    for i in range(num_active):
        link = active[i]
        cap[link] = capacity[link] - frozen_load[link] - level * load[link]
    left = num_flows
    while left > 0:
        step = max(_min_ratio(active, num_active, cap, load), 0.0)
        level += step
        for i in range(num_active):
            link = active[i]
            cap[link] -= step * load[link]
        for i in range(num_active):
            link = active[i]
            if rising_on[link] == 0 or cap[link] > SATURATED * capacity[link]:
                continue
            for e in range(link_ptr[link], link_ptr[link + 1]):
                f = link_flow[e]
                if not rising[f]:
                    continue
                rising[f] = False
                rate[f] = level
                left -= 1
                for e2 in range(flow_ptr[f], flow_ptr[f + 1]):
                    other = flow_link[e2]
                    load[other] -= weight[f]
                    rising_on[other] -= 1
                    frozen_load[other] += weight[f] * level
        kept = 0
        for i in range(num_active):
            link = active[i]
            if rising_on[link] > 0:
                active[kept] = link
                kept += 1
            else:
                load[link] = 0.0
        num_active = kept


@numba.njit(cache=True)
def advance(remaining, rate, dt, ulp_now, finish, now, eps_bytes):  # pragma: no cover - compiled
    """Run flows at their rates for dt, in place: bytes the clock cannot resolve any more (8 of its spacing at
    `now`, times the rate) count as sent; flows that end get finish time `now`."""
    for f in range(remaining.shape[0]):
        left = remaining[f] - rate[f] * dt
        if left <= max(eps_bytes, rate[f] * 8 * ulp_now):
            left = 0.0
        remaining[f] = left
        if left <= eps_bytes and np.isnan(finish[f]):
            finish[f] = now


@numba.njit(cache=True)
def next_end(remaining, rate, eps_bytes):  # pragma: no cover - compiled
    """Time until the first live flow ends at its rate (0 when none is live)."""
    dt = np.inf
    for f in range(remaining.shape[0]):
        if remaining[f] > eps_bytes:
            v = remaining[f] / rate[f]
            if v < dt:
                dt = v
    return dt if dt < np.inf else 0.0


@numba.njit(cache=True)
def compact(ids):  # pragma: no cover - compiled
    """(sorted distinct ids, position of every id among them) of non-negative ids."""
    top = 0
    for i in range(ids.shape[0]):
        if ids[i] > top:
            top = ids[i]
    position = np.full(top + 1, -1, dtype=np.int64)
    for i in range(ids.shape[0]):
        position[ids[i]] = 0
    count = 0
    for v in range(top + 1):
        if position[v] == 0:
            position[v] = count
            count += 1
    used = np.empty(count, dtype=np.int64)
    local = np.empty(ids.shape[0], dtype=np.int64)
    for v in range(top + 1):
        if position[v] >= 0:
            used[position[v]] = v
    for i in range(ids.shape[0]):
        local[i] = position[ids[i]]
    return used, local
