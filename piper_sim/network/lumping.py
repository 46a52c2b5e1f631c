"""A contended component's quotient: the coarsest equitable partition of its flows and links.

Owns `structural_classes`, which finds the partition of a component's flows coloured by their flow set and weight
(links by capacity) by compiled colour refinement, None where the component has little symmetry; and Classes, the
partition with its quotient, which says whether a moment's live flows and bytes still to send respect it.
fairshare.LumpedFilling solves on it; fairshare.PartitionMemo keeps the partitions by the sets' keys (routes), since
the same collectives meet again micro-batch after micro-batch.

The argument is aggregate.lump's (exact, not an approximation): once every flow of a class crosses the same number
of links of each link class and every link of a class carries the same number of flows of each flow class,
progressive filling gives all flows of a class one rate, so the quotient (one flow per class with the class's weight,
one link per class with its links' capacity summed, a class listed on a link class as often as each of its flows
crosses one) has the same rates. The partition stays equitable on any union of its classes (the counts of the classes
left do not change), so it serves every solve whose live flows are such a union; and where a class's live flows also
have equal bytes still to send, equal rates keep them equal as they advance (bit for bit), so they end together and
the next solves are unions too. Each solve of the component then costs its classes, not its flows.

Refinement hashes the neighbours' colours (splitmix64 sums of 64-bit integers, wrapping); the partition is then
checked exactly (each flow's multiset of link classes and each link's multiset of flow classes against its class's
first member's), and a failed check (a collision) gives None. Pure numeric; imports numba and numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from piper_sim.network import kernels

MAX_CLASS_SHARE = 0.5  # a component whose flows fall into more classes than this share of them is solved unlumped
MAX_ROUNDS = 64
GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@dataclass(frozen=True, eq=False)
class Classes:
    """A component's equitable partition and its quotient: flow_class per flow, rep (the first flow of each class),
    unit_weight (each class's flows' weight), the quotient's incidences (flow class, link class), its flows' weights
    (unit weight x members) and its links' capacities (the members' summed)."""

    flow_class: np.ndarray
    rep: np.ndarray
    unit_weight: np.ndarray
    entry_flow: np.ndarray
    entry_link: np.ndarray
    weight: np.ndarray
    capacity: np.ndarray

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in vars(self).values())

    def holds(self, live: np.ndarray, remaining: np.ndarray, weight: np.ndarray) -> bool:
        """Whether the live flows are a union of classes whose flows have equal bytes still to send, every flow with
        its class's weight: the partition serves this moment's solve and the next ones."""
        return bool(_holds(self.flow_class, self.unit_weight, live, remaining, weight, self.rep.shape[0]))

    def live_classes(self, live: np.ndarray) -> np.ndarray | None:
        """Which classes are live, where the live flows are a union of classes; else None."""
        live_class = live[self.rep]
        return live_class if _union(self.flow_class, live_class, live) else None

    def spread(self, class_values: np.ndarray) -> np.ndarray:
        """Per flow, its class's value."""
        return _gather(class_values, self.flow_class)


def structural_classes(
    entry_flow: np.ndarray, local_link: np.ndarray, weight: np.ndarray, capacity: np.ndarray, flow_set: np.ndarray
) -> Classes | None:
    """The coarsest equitable partition of a component's flows coloured by flow set (flow_set: any integer id per
    flow) and weight, links by capacity; None where its flows fall into more than MAX_CLASS_SHARE as many classes,
    refinement does not settle within MAX_ROUNDS or the exact check fails. entry_flow/local_link: its incidences
    (links numbered 0..L-1, capacity[L])."""
    num_flows = weight.shape[0]
    if num_flows < 2 or not entry_flow.size:
        return None
    entry_flow = np.asarray(entry_flow, dtype=np.int64)
    local_link = np.asarray(local_link, dtype=np.int64)
    weight, capacity = np.asarray(weight, dtype=np.float64), np.asarray(capacity, dtype=np.float64)
    fcol, nf = _dense(np.asarray(flow_set, dtype=np.int64), weight.view(np.uint64))
    lcol, nl = _dense(np.zeros(capacity.shape[0], dtype=np.int64), capacity.view(np.uint64))
    fcol, lcol, nf, nl, ok = _refine(entry_flow, local_link, fcol, lcol, nf, nl, int(num_flows * MAX_CLASS_SHARE))
    if not ok:
        return None
    flow_ptr, flow_link, link_ptr, link_flow = kernels.compressed(entry_flow, local_link, num_flows, lcol.shape[0])
    rep = _first(fcol, nf)
    # weight and capacity are equal within classes by construction: the first colours are their exact values
    # (_dense compares the pairs themselves), and refinement only splits classes
    if not (
        _same_neighbours(flow_ptr, flow_link, lcol, fcol, rep, nl)
        and _same_neighbours(link_ptr, link_flow, fcol, lcol, _first(lcol, nl), nf)
    ):
        return None
    q_flow, q_link = _quotient_entries(flow_ptr, flow_link, lcol, rep)
    return Classes(
        flow_class=fcol.astype(np.uint16 if nf <= 1 << 16 else np.int32),  # a partition kept holds one per flow
        rep=rep,
        unit_weight=weight[rep],
        entry_flow=q_flow,
        entry_link=q_link,
        weight=np.bincount(fcol, weights=weight, minlength=nf),
        capacity=np.bincount(lcol, weights=capacity, minlength=nl),
    )


@numba.njit(cache=True)
def _mix(h):  # pragma: no cover - compiled
    """splitmix64's finalizer (wrapping uint64 arithmetic)."""
    h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


@numba.njit(cache=True)
def _dense(old, sig):  # pragma: no cover - compiled
    """Dense ids, in order of first occurrence, of the distinct (old, sig) pairs (an open-addressing table), and
    their number."""
    n = old.shape[0]
    size = 1
    while size < 2 * n:
        size <<= 1
    keys_old = np.full(size, -1, dtype=np.int64)
    keys_sig = np.zeros(size, dtype=np.uint64)
    ids = np.empty(size, dtype=np.int64)
    new = np.empty(n, dtype=np.int64)
    count = 0
    for i in range(n):
        j = np.int64(_mix(np.uint64(old[i]) * GOLDEN ^ sig[i]) & np.uint64(size - 1))
        while True:
            if keys_old[j] == -1:
                keys_old[j], keys_sig[j], ids[j] = old[i], sig[i], count
                new[i] = count
                count += 1
                break
            if keys_old[j] == old[i] and keys_sig[j] == sig[i]:
                new[i] = ids[j]
                break
            j = (j + 1) & (size - 1)
    return new, count


@numba.njit(cache=True)
def _refine(entry_flow, local_link, fcol, lcol, nf, nl, max_classes):  # pragma: no cover - compiled
    """Colour refinement: a link's new colour is its colour with the multiset of its flows' colours, a flow's its
    colour with the multiset of its links' new colours, until no class splits. (colours, counts, settled within
    MAX_ROUNDS with at most max_classes flow classes)."""
    for r in range(MAX_ROUNDS):
        new_l, new_nl = _dense(lcol, _signatures(local_link, entry_flow, fcol, nf, lcol.shape[0], 2 * r + 1))
        sig = _signatures(entry_flow, local_link, new_l, new_nl, fcol.shape[0], 2 * r + 2)
        new_f, new_nf = _dense(fcol, sig)
        settled = new_nf == nf and new_nl == nl
        fcol, lcol, nf, nl = new_f, new_l, new_nf, new_nl
        if nf > max_classes:
            return fcol, lcol, nf, nl, False
        if settled:
            return fcol, lcol, nf, nl, True
    return fcol, lcol, nf, nl, False


@numba.njit(cache=True)
def _signatures(entry_owner, entry_other, other_colour, num_colours, num_owners, salt):  # pragma: no cover - compiled
    """Per owner, a hash of the multiset of its entries' other ends' colours (a sum of per-colour hashes)."""
    hashes = np.empty(num_colours, dtype=np.uint64)
    for c in range(num_colours):
        hashes[c] = _mix(np.uint64(c) + np.uint64(salt) * GOLDEN)
    sig = np.zeros(num_owners, dtype=np.uint64)
    for e in range(entry_owner.shape[0]):
        sig[entry_owner[e]] += hashes[other_colour[entry_other[e]]]
    return sig


@numba.njit(cache=True)
def _first(colour, count):  # pragma: no cover - compiled
    """The first member of every class."""
    first = np.full(count, -1, dtype=np.int64)
    for i in range(colour.shape[0]):
        if first[colour[i]] < 0:
            first[colour[i]] = i
    return first


@numba.njit(cache=True)
def _same_neighbours(ptr, neighbour, neighbour_colour, colour, first, num_neighbour_colours):  # pragma: no cover
    """Every item's multiset of neighbour colours equals its class's first member's (a scratch histogram per item:
    its neighbours counted up, the first member's down, all back to zero)."""
    scratch = np.zeros(num_neighbour_colours, dtype=np.int64)
    for i in range(colour.shape[0]):
        r = first[colour[i]]
        if r == i:
            continue
        if ptr[i + 1] - ptr[i] != ptr[r + 1] - ptr[r]:
            return False
        for p in range(ptr[i], ptr[i + 1]):
            scratch[neighbour_colour[neighbour[p]]] += 1
        for p in range(ptr[r], ptr[r + 1]):
            scratch[neighbour_colour[neighbour[p]]] -= 1
        same = True
        for p in range(ptr[i], ptr[i + 1]):
            c = neighbour_colour[neighbour[p]]
            if scratch[c] != 0:
                same = False
            scratch[c] = 0
        if not same:
            return False
    return True


@numba.njit(cache=True)
def _quotient_entries(flow_ptr, flow_link, lcol, rep):  # pragma: no cover - compiled
    """The quotient's incidences: each class's first flow's entries, as (flow class, link class)."""
    count = 0
    for c in range(rep.shape[0]):
        count += flow_ptr[rep[c] + 1] - flow_ptr[rep[c]]
    q_flow = np.empty(count, dtype=np.int64)
    q_link = np.empty(count, dtype=np.int64)
    k = 0
    for c in range(rep.shape[0]):
        for p in range(flow_ptr[rep[c]], flow_ptr[rep[c] + 1]):
            q_flow[k], q_link[k] = c, lcol[flow_link[p]]
            k += 1
    return q_flow, q_link


@numba.njit(cache=True)
def _holds(flow_class, unit_weight, live, remaining, weight, num_classes):  # pragma: no cover - compiled
    """Every class all live or all not, its live flows with one value of bytes still to send, and every flow with its
    class's weight."""
    state = np.full(num_classes, -1, dtype=np.int8)
    left = np.zeros(num_classes)
    for f in range(flow_class.shape[0]):
        c = flow_class[f]
        if weight[f] != unit_weight[c]:
            return False
        if state[c] < 0:
            state[c] = 1 if live[f] else 0
            left[c] = remaining[f]
        elif (state[c] == 1) != live[f] or live[f] and remaining[f] != left[c]:
            return False
    return True


@numba.njit(cache=True)
def _union(flow_class, live_class, live):  # pragma: no cover - compiled
    for f in range(flow_class.shape[0]):
        if live[f] != live_class[flow_class[f]]:
            return False
    return True


@numba.njit(cache=True)
def _gather(values, index):  # pragma: no cover - compiled
    out = np.empty(index.shape[0], dtype=values.dtype)
    for i in range(index.shape[0]):
        out[i] = values[index[i]]
    return out
