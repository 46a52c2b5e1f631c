"""Capacity factor and token dropping; the top-k feasibility limit; integer apportionment.

Capacity (docs/routing.md): each source EP rank may send each expert at most
    C = ceil(capacity_factor x tokens_per_source x top_k / num_experts)
rows per all-to-all (GShard / Megatron-Core convention: capacity per expert per local batch, rounded up).
Rows beyond C are dropped: they are not dispatched, not computed by the expert and not combined (the
token keeps its residual path). capacity_factor None is no-drop mode (C is unbounded).
Must not import simpy or torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, kw_only=True)
class RoutedCounts:
    """One all-to-all's routing: kept + dropped = routed rows, per [source, expert]."""

    kept: np.ndarray  # int64 [source, expert]: rows dispatched to the expert (and combined back)
    dropped: np.ndarray  # int64 [source, expert]: rows over capacity, never dispatched
    capacity: int | None  # rows per (source, expert); None in no-drop mode

    @property
    def routed(self) -> np.ndarray:
        return self.kept + self.dropped

    @property
    def num_dropped(self) -> int:
        return int(self.dropped.sum())

    @property
    def drop_fraction(self) -> float:
        total = int(self.kept.sum()) + self.num_dropped
        return self.num_dropped / total if total else 0.0


def expert_capacity(capacity_factor: float | None, tokens_per_source: int, top_k: int, num_experts: int) -> int | None:
    """Rows one source may send one expert: ceil(cf x tokens x top_k / E); None without a capacity factor."""
    if capacity_factor is None:
        return None
    # round away float noise (1.25 * 4096 * 2 / 8 must be exactly 1280) before the ceiling
    return math.ceil(round(capacity_factor * tokens_per_source * top_k / num_experts, 9))


def apply_capacity(counts: np.ndarray, capacity: int | None) -> RoutedCounts:
    counts = np.asarray(counts, dtype=np.int64)
    if capacity is None:
        return RoutedCounts(kept=counts, dropped=np.zeros_like(counts), capacity=None)
    kept = np.minimum(counts, capacity)
    return RoutedCounts(kept=kept, dropped=counts - kept, capacity=capacity)


def even_split(total: int, num_parts: int) -> np.ndarray:
    """total split into num_parts integers differing by at most one (the first get the extra)."""
    base, extra = divmod(total, num_parts)
    out = np.full(num_parts, base, dtype=np.int64)
    out[:extra] += 1
    return out


def apportion(total: int, weights: np.ndarray) -> np.ndarray:
    """Integers proportional to weights summing to total (largest remainder; ties to the lower index)."""
    weights = np.asarray(weights, dtype=np.float64)
    wsum = weights.sum()
    if total == 0:
        return np.zeros(len(weights), dtype=np.int64)
    if wsum <= 0:
        return even_split(total, len(weights))
    exact = weights * (total / wsum)
    out = np.floor(exact).astype(np.int64)
    short = total - int(out.sum())
    if short > 0:
        order = np.argsort(-(exact - out), kind="stable")
        out[order[:short]] += 1
    return out


def cap_probabilities(probs: np.ndarray, limit: float) -> np.ndarray:
    """Water-filling: no entry above `limit` (1 / top_k), the excess spread over the rest in proportion."""
    p = np.asarray(probs, dtype=np.float64)
    p = p / p.sum()
    if limit * len(p) < 1 - 1e-12:
        raise ValueError(f"cannot cap {len(p)} probabilities at {limit}")
    for _ in range(len(p)):
        over = p > limit * (1 + 1e-12)
        if not over.any():
            break
        excess = float((p[over] - limit).sum())
        p[over] = limit
        free = p < limit * (1 - 1e-12)
        room = p[free].sum()
        if room > 0:
            p[free] += excess * p[free] / room
        else:
            p[free] += excess / free.sum()
    return p


def cap_rows(counts: np.ndarray, limit: int, weights: np.ndarray) -> np.ndarray:
    """Per source, move rows above `limit` (the tokens a source has) to experts with room, by weight.

    An expert can receive at most one copy of each token; multinomial sampling near the 1/top_k cap
    can break that, so the overflow is re-apportioned. Row sums are preserved.
    """
    out = np.asarray(counts, dtype=np.int64).copy()
    weights = np.asarray(weights, dtype=np.float64) + 1e-12  # every expert with room can take rows
    for i in np.flatnonzero(out.max(axis=1) > limit):
        row = out[i]
        excess = int(np.maximum(row - limit, 0).sum())
        np.minimum(row, limit, out=row)
        while excess:  # terminates: each pass places >= 1 row, and rows <= limit x experts
            room = limit - row
            give = np.minimum(apportion(excess, np.where(room > 0, weights, 0.0)), room)
            row += give
            excess -= int(give.sum())
    return out
