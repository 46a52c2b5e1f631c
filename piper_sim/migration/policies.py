"""Expert migration policies: one EP group, one layer. Given the load (routed rows) of each expert and
the current owner map, return a new owner map. Every rank keeps E / ep experts.

  none    the no-migration baseline: the map never changes.
  greedy  Piper's swap: take the most and the least loaded rank of the group, swap the expert pair
          (one from each) that narrows their gap the most; repeat while a swap narrows the gap, up to
          max_swaps. A swap of loads x (from the max rank) and y with 0 < x - y < gap lowers the max
          rank and leaves the min rank below the old max, so the group's max load never increases.
  lpt     full rebalance by sorted greedy assignment (longest processing time first): experts by
          descending load, each to the least loaded rank with a free slot; ranks then relabelled to keep
          as many experts in place as possible and refined with greedy swaps. The result is compared
          with Piper's greedy from the current map and the lower max load wins (ties: fewer moves), so
          lpt is never worse than greedy; the current map stays unless the max load strictly drops.
Pure numpy: no simpy, no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from piper_sim.migration.expert_placement import rank_loads
from piper_sim.registry import Registry


@dataclass(frozen=True, kw_only=True)
class Rebalance:
    owners: np.ndarray  # int64 [E]: the new map
    swaps: int  # swaps performed (greedy) or 0
    max_before: float
    max_after: float


PolicyFn = Callable[[np.ndarray, np.ndarray, int, int], Rebalance]  # (loads, owners, ep, max_swaps)
POLICIES: Registry[PolicyFn] = Registry("migration.policy")


@POLICIES.register("none")
def no_migration(loads: np.ndarray, owners: np.ndarray, ep: int, max_swaps: int = 0) -> Rebalance:
    peak = float(rank_loads(loads, owners, ep).max())
    return Rebalance(owners=np.array(owners, dtype=np.int64), swaps=0, max_before=peak, max_after=peak)


@POLICIES.register("greedy")
def greedy_swap(loads: np.ndarray, owners: np.ndarray, ep: int, max_swaps: int = 16) -> Rebalance:
    """Piper's most-vs-least loaded swap, repeated while it narrows the gap (at most max_swaps times)."""
    loads = np.asarray(loads, dtype=np.float64)
    owners = np.array(owners, dtype=np.int64)
    per_rank = rank_loads(loads, owners, ep)
    before = float(per_rank.max())
    swaps = 0
    while swaps < max_swaps:
        hi, lo = int(np.argmax(per_rank)), int(np.argmin(per_rank))
        gap = per_rank[hi] - per_rank[lo]
        if gap <= 0:
            break
        xs, ys = np.flatnonzero(owners == hi), np.flatnonzero(owners == lo)
        delta = loads[xs][:, None] - loads[ys][None, :]
        new_gap = np.where((delta > 0) & (delta < gap), np.abs(gap - 2 * delta), np.inf)
        best = np.unravel_index(np.argmin(new_gap), new_gap.shape)
        if not np.isfinite(new_gap[best]):
            break
        x, y = int(xs[best[0]]), int(ys[best[1]])
        owners[x], owners[y] = lo, hi
        per_rank[hi] -= delta[best]
        per_rank[lo] += delta[best]
        swaps += 1
    per_rank = rank_loads(loads, owners, ep)  # exact, without accumulated float error
    return Rebalance(owners=owners, swaps=swaps, max_before=before, max_after=float(per_rank.max()))


def lpt_assign(loads: np.ndarray, ep: int) -> np.ndarray:
    """Sorted greedy: experts by descending load (ties by id) to the least loaded rank with a free slot."""
    loads = np.asarray(loads, dtype=np.float64)
    slots = len(loads) // ep
    owners = np.empty(len(loads), dtype=np.int64)
    per_rank = np.zeros(ep)
    held = np.zeros(ep, dtype=np.int64)
    for e in np.argsort(-loads, kind="stable"):
        free = np.flatnonzero(held < slots)
        r = int(free[np.argmin(per_rank[free])])
        owners[e] = r
        per_rank[r] += loads[e]
        held[r] += 1
    return owners


def relabel_to_keep(new: np.ndarray, old: np.ndarray, ep: int) -> np.ndarray:
    """Permute rank labels of `new` (loads are label-free) to keep the most experts where they are.

    Greedy matching on the overlap matrix (largest overlap first); optimal matching would need an
    assignment solver, which this does not import.
    """
    overlap = np.zeros((ep, ep), dtype=np.int64)  # [new label, old rank]
    np.add.at(overlap, (new, old), 1)
    label = np.full(ep, -1, dtype=np.int64)
    taken = np.zeros(ep, dtype=bool)
    for flat in np.argsort(-overlap, axis=None, kind="stable"):
        a, b = divmod(int(flat), ep)
        if label[a] < 0 and not taken[b]:
            label[a], taken[b] = b, True
    return label[new]


@POLICIES.register("lpt")
def lpt_rebalance(loads: np.ndarray, owners: np.ndarray, ep: int, max_swaps: int = 16) -> Rebalance:
    """Full LPT rebalance (relabelled, refined by swaps) or Piper's greedy from the current map, whichever
    gives the lower max load (ties: fewer experts moved); the current map unless the max strictly drops."""
    loads = np.asarray(loads, dtype=np.float64)
    owners = np.asarray(owners, dtype=np.int64)
    before = float(rank_loads(loads, owners, ep).max())
    candidate = relabel_to_keep(lpt_assign(loads, ep), owners, ep)
    options = [greedy_swap(loads, candidate, ep, max(max_swaps, len(loads))), greedy_swap(loads, owners, ep, max_swaps)]
    best = min(options, key=lambda r: (r.max_after, int(np.count_nonzero(r.owners != owners))))
    if best.max_after < before:
        return Rebalance(owners=best.owners, swaps=0, max_before=before, max_after=best.max_after)
    return Rebalance(owners=owners.copy(), swaps=0, max_before=before, max_after=before)


def rebalance(policy: str, loads: np.ndarray, owners: np.ndarray, ep: int, max_swaps: int = 16) -> Rebalance:
    return POLICIES.get(policy, "migration.policy")(loads, owners, ep, max_swaps)
