"""Rank agreement of two series of figures (the planner's tiers, predictions against measurements).

Owns spearman. Pure pandas; no simpy or torch.
"""

from __future__ import annotations

import pandas as pd


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation of a and b (1.0 for fewer than two values)."""
    if len(a) < 2:
        return 1.0
    return float(pd.Series(a).rank().corr(pd.Series(b).rank()))
