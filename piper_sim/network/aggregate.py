"""Exact flow aggregation for the max-min flow network: merge identical flows, lump symmetric ones.

Owns two reductions of a flow set (incidence arrays entry_flow/entry_link, bytes per flow) that leave
every flow's completion time unchanged under progressive filling (piper_sim.network.flows):

- `merge_identical`: flows with the same multiset of links and the same size become one flow whose
  weight is the sum of their weights. FlowNetwork already treats weight w as w identical flows (each
  gets the returned rate, links carry w times it), so this is exact. Drop-in for FlowNetwork.start,
  same link ids, e.g. in CollectiveRunner._phase:
      agg = merge_identical(routes.entry_flow, routes.entry_link, sizes)
      yield self.network.start(agg.entry_flow, agg.entry_link, agg.sizes, weight=agg.weight, key=pattern)
- `lump`: the quotient by the coarsest equitable partition (colour refinement, as in graph
  isomorphism testing) of the bipartite flow/link incidence graph, starting from flows coloured by
  (size, colour) and links by capacity. Equitable: every flow of class C crosses the same number
  m(C, L) of links of class L, and every link of class L is crossed by the same number n(L, C) of
  flows of class C. Progressive filling then keeps all flows of a class at one rate and all links of a
  class at one load (induction over the filling steps: equal loads -> equal saturation times -> equal
  freezing), and equal sizes give equal completion times, after which the active set is again a
  union of classes. So the quotient -- one flow per class with weight |C|, one link per class with
  capacity |L| x capacity, class C listed m(C, L) times on link L -- has the same rates, exactly:
  its link load sum_C |C| m(C, L) r_C equals |L| times the per-link load sum_C n(L, C) r_C.
  The quotient has its own link ids, so it needs its own FlowNetwork (piper_sim.studies.reduced_collective).

Inputs may already be a quotient (a flow standing for `count` flows, a link for `link_count` links,
e.g. host-symmetry orbits): refinement then uses the per-link counts n(L, C) = sum count / link_count.
Signatures are hashed (sums of random integers below 2^20, exact in float64), and the final partition
is checked exactly; a failed check (a hash collision) falls back to the identity partition.
Pure numpy; must not import simpy or torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from piper_sim.network.fairshare import compact_ids

HASH_BITS = 20
MAX_ROUNDS = 64
DENSE_HISTOGRAM_CELLS = 40_000_000  # links x flow classes up to which the equitability check is one histogram


@dataclass(frozen=True, kw_only=True)
class Merged:
    """Flows after merging identical ones; flow_of maps each input flow to its merged flow."""

    entry_flow: np.ndarray
    entry_link: np.ndarray
    sizes: np.ndarray
    weight: np.ndarray
    flow_of: np.ndarray


def dense_rows(*columns: np.ndarray) -> np.ndarray:
    """Dense ids 0..k-1 of the distinct rows of the given equal-length columns (first column major)."""
    n = columns[0].shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort(columns[::-1])
    new = np.zeros(n, dtype=bool)
    new[0] = True
    for col in columns:
        s = col[order]
        new[1:] |= s[1:] != s[:-1]
    ids = np.empty(n, dtype=np.int64)
    ids[order] = np.cumsum(new) - 1
    return ids


def _canonical(ids: np.ndarray) -> np.ndarray:
    """Renumber ids by first occurrence (deterministic class numbering)."""
    _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    rank = np.empty(first.size, dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.size)
    return rank[inverse]


def merge_identical(
    entry_flow: np.ndarray, entry_link: np.ndarray, sizes: np.ndarray, weight: np.ndarray | None = None
) -> Merged:
    """Merge flows whose sorted link lists and sizes are equal; weights add up."""
    num = sizes.shape[0]
    weight = np.ones(num) if weight is None else np.asarray(weight, dtype=float)
    order = np.lexsort((entry_link, entry_flow))
    flow_sorted, link_sorted = entry_flow[order], entry_link[order]
    length = np.bincount(entry_flow, minlength=num)
    width = int(length.max()) if num and entry_flow.size else 0
    start = np.concatenate(([0], np.cumsum(length)[:-1]))
    table = np.full((num, width), -1, dtype=np.int64)
    table[flow_sorted, np.arange(flow_sorted.size) - start[flow_sorted]] = link_sorted
    flow_of = _canonical(dense_rows(sizes.astype(float), *table.T))
    k = int(flow_of.max()) + 1 if num else 0
    rep = np.full(k, num, dtype=np.int64)
    np.minimum.at(rep, flow_of, np.arange(num))
    keep = np.isin(entry_flow, rep)
    return Merged(
        entry_flow=flow_of[entry_flow[keep]],
        entry_link=entry_link[keep],
        sizes=sizes[rep].astype(float),
        weight=np.bincount(flow_of, weights=weight, minlength=k),
        flow_of=flow_of,
    )


@dataclass(frozen=True, kw_only=True)
class Lumped:
    """The quotient of a flow set by an equitable partition.

    flow_class[f] / link_class[l]: class of input flow f / input link id l (-1: link unused).
    Class arrays: weight (flows the class stands for), sizes, capacity (sum over member links),
    link_count (real links per class). entry_flow/entry_link list class incidences with multiplicity.
    """

    flow_class: np.ndarray
    link_class: np.ndarray
    entry_flow: np.ndarray
    entry_link: np.ndarray
    sizes: np.ndarray
    weight: np.ndarray
    capacity: np.ndarray
    link_count: np.ndarray
    rounds: int
    exact_check: bool

    @property
    def num_flow_classes(self) -> int:
        return int(self.sizes.shape[0])

    @property
    def num_link_classes(self) -> int:
        return int(self.capacity.shape[0])


def _mix(h: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer on uint64 arrays."""
    with np.errstate(over="ignore"):
        h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return h ^ (h >> np.uint64(31))


def _relabel(*cols: np.ndarray) -> np.ndarray:
    """Dense ids of the distinct rows of integer-valued columns, via a 64-bit hash (checked later)."""
    h = np.zeros(cols[0].shape[0], dtype=np.uint64)
    with np.errstate(over="ignore"):
        for n, col in enumerate(cols):
            salt = np.uint64((0x9E3779B97F4A7C15 * (n + 1)) % (1 << 64))
            h = _mix(h + np.asarray(col).astype(np.int64).astype(np.uint64) + salt)
    distinct = np.unique(h)  # hash-based for integers; the inverse by binary search over few classes
    return np.searchsorted(distinct, h).astype(np.int64)


def _hash_table(k: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, 1 << HASH_BITS, size=k).astype(float)


def _refine(
    colors: np.ndarray,
    entry_owner: np.ndarray,
    entry_other_color: np.ndarray,
    weight: np.ndarray | None,
    divisor: np.ndarray | None,
    seed: int,
) -> np.ndarray:
    """New colours: (old colour, two hashed multisets of neighbour colours weighted by `weight`)."""
    k = int(entry_other_color.max()) + 1 if entry_other_color.size else 1
    sig = []
    for salt in (0, 1):
        h = _hash_table(k, seed * 2 + salt)[entry_other_color]
        total = np.bincount(entry_owner, weights=h if weight is None else h * weight, minlength=colors.size)
        sig.append(np.rint(total / divisor) if divisor is not None else total)
    return _relabel(colors, *sig)


def _first_of(classes: np.ndarray) -> np.ndarray:
    """Index of the first member of every class."""
    return np.unique(classes, return_index=True)[1]


def _flows_equitable(fcls: np.ndarray, entry_flow: np.ndarray, entry_lcol: np.ndarray) -> bool:
    """Every flow of a class crosses the same multiset of link classes (exact)."""
    num = fcls.size
    if entry_flow.size and not np.all(entry_flow[1:] >= entry_flow[:-1]):
        order = np.argsort(entry_flow, kind="stable")
        entry_flow, entry_lcol = entry_flow[order], entry_lcol[order]
    length = np.bincount(entry_flow, minlength=num)
    width = int(length.max()) if entry_flow.size else 0
    small = entry_lcol.size == 0 or int(entry_lcol.max()) < np.iinfo(np.int32).max
    table = np.full((num, max(width, 1)), -1, dtype=np.int32 if small else np.int64)
    start = np.cumsum(length) - length
    table[entry_flow, np.arange(entry_flow.size) - start[entry_flow]] = entry_lcol
    table.sort(axis=1)
    return bool(np.array_equal(table, table[_first_of(fcls)[fcls]]))


def _links_equitable(
    lcls: np.ndarray, local_link: np.ndarray, entry_fcol: np.ndarray, entry_count: np.ndarray, lcount: np.ndarray
) -> bool:
    """Every link of a class carries the same number of flows of each flow class (exact)."""
    num_l, num_f = lcls.size, int(entry_fcol.max()) + 1 if entry_fcol.size else 1
    key = local_link * num_f + entry_fcol
    if num_l * num_f <= DENSE_HISTOGRAM_CELLS:
        hist: np.ndarray = np.bincount(key, weights=entry_count, minlength=num_l * num_f).reshape(num_l, num_f)
        hist /= lcount[:, None]
        return bool(np.array_equal(hist, hist[_first_of(lcls)[lcls]]))
    if entry_count.size and np.all(entry_count == entry_count[0]):  # counts are run lengths of the sorted keys
        key = np.sort(key)
        start = np.flatnonzero(np.concatenate(([True], key[1:] != key[:-1])))
        uniq = key[start]
        carried = np.diff(np.append(start, key.size)) * float(entry_count[0])
    else:  # sorted keys and their counts summed per run (fewer temporaries than np.unique's inverse)
        order = np.argsort(key)
        key = key[order]
        weights = entry_count[order]
        del order
        start = np.flatnonzero(np.concatenate(([True], key[1:] != key[:-1])))
        uniq = key[start]
        del key
        carried = np.add.reduceat(weights, start) if start.size else np.zeros(0)
    who = uniq // num_f
    per = carried / lcount[who]
    cls_col = lcls[who] * num_f + uniq % num_f  # (link class, flow class) of each (link, flow class) pair
    order = np.argsort(cls_col, kind="stable")
    cls_col, per = cls_col[order], per[order]
    repeat = cls_col[1:] == cls_col[:-1]
    if np.any(per[1:][repeat] != per[:-1][repeat]):  # two links of a class carry a flow class unequally
        return False
    pairs = cls_col[np.concatenate(([True], ~repeat))]
    return bool(
        np.all(np.bincount(who, minlength=num_l) == np.bincount(pairs // num_f, minlength=int(lcls.max()) + 1)[lcls])
    )


def _same_within(classes: np.ndarray, values: np.ndarray) -> bool:
    """values are constant inside every class."""
    return bool(np.array_equal(values, values[_first_of(classes)[classes]])) if classes.size else True


def lump(
    entry_flow: np.ndarray,
    entry_link: np.ndarray,
    sizes: np.ndarray,
    capacity: np.ndarray,
    *,
    count: np.ndarray | None = None,
    link_count: np.ndarray | None = None,
    color: np.ndarray | None = None,
    refine: bool = True,
    seed: int = 0,
) -> Lumped:
    """Quotient of the flow set by the coarsest equitable partition refining (size, colour) / capacity.

    capacity[l] is the capacity of one link with id l (all ids of the topology); count[f] the number of
    identical flows f stands for (default 1); link_count[l] the number of real links id l stands for.
    refine=False keeps every flow and link apart (the unreduced system in the same form).
    """
    num_flows = sizes.shape[0]
    count = np.ones(num_flows) if count is None else np.asarray(count, dtype=float)
    used, local_link = compact_ids(entry_link)
    lcount = np.ones(used.size) if link_count is None else np.asarray(link_count, dtype=float)[used]
    sizes_f = np.asarray(sizes, dtype=float)
    cap_used = np.asarray(capacity, dtype=float)[used]
    if not refine:
        return _quotient(
            entry_flow,
            local_link,
            used,
            sizes_f,
            capacity,
            count,
            lcount,
            np.arange(num_flows),
            np.arange(used.size),
            0,
            True,
        )
    fcol = _relabel(sizes_f.view(np.int64), np.zeros(num_flows, dtype=np.int64) if color is None else color)
    lcol = _relabel(cap_used.view(np.int64))
    entry_count = count[entry_flow]
    rounds = 0
    for rounds in range(1, MAX_ROUNDS + 1):
        new_l = _refine(lcol, local_link, fcol[entry_flow], entry_count, lcount, seed + rounds)
        new_f = _refine(fcol, entry_flow, new_l[local_link], None, None, seed + 1000 + rounds)
        stable = new_l.max(initial=-1) == lcol.max(initial=-1) and new_f.max(initial=-1) == fcol.max(initial=-1)
        lcol, fcol = new_l, new_f
        if stable:
            break
    exact = (
        _same_within(fcol, sizes_f)
        and _same_within(lcol, cap_used)
        and _flows_equitable(fcol, entry_flow, lcol[local_link])
        and _links_equitable(lcol, local_link, fcol[entry_flow], entry_count, lcount)
    )
    if not exact:  # a hash collision merged unequal items: keep every flow and link apart
        fcol, lcol = np.arange(num_flows), np.arange(used.size)
    return _quotient(
        entry_flow,
        local_link,
        used,
        sizes_f,
        capacity,
        count,
        lcount,
        _canonical(fcol),
        _canonical(lcol),
        rounds,
        exact,
    )


def _quotient(
    entry_flow: np.ndarray,
    local_link: np.ndarray,
    used: np.ndarray,
    sizes: np.ndarray,
    capacity: np.ndarray,
    count: np.ndarray,
    lcount: np.ndarray,
    fcls: np.ndarray,
    lcls: np.ndarray,
    rounds: int,
    exact: bool,
) -> Lumped:
    num_fc = int(fcls.max()) + 1 if fcls.size else 0
    num_lc = int(lcls.max()) + 1 if lcls.size else 0
    rep = _first_of(fcls)
    is_rep = np.zeros(fcls.size, dtype=bool)
    is_rep[rep] = True
    keep = is_rep[entry_flow]
    link_count = np.bincount(lcls, weights=lcount, minlength=num_lc)
    cap_one = np.zeros(num_lc)
    cap_one[lcls] = np.asarray(capacity, dtype=float)[used]
    link_class = np.full(np.asarray(capacity).shape[0], -1, dtype=np.int64)
    link_class[used] = lcls
    order = np.argsort(fcls[entry_flow[keep]], kind="stable")
    return Lumped(
        flow_class=fcls,
        link_class=link_class,
        entry_flow=fcls[entry_flow[keep]][order],
        entry_link=lcls[local_link[keep]][order],
        sizes=np.asarray(sizes, dtype=float)[rep],
        weight=np.bincount(fcls, weights=count, minlength=num_fc),
        capacity=cap_one * link_count,
        link_count=link_count,
        rounds=rounds,
        exact_check=exact,
    )
