"""Fits that turn micro-benchmark times into profile numbers. Pure numpy: no torch, no I/O.

Owns: the per-message (per-op) overhead + bandwidth fit of a linear time model, the general
non-negative linear fit it rests on, peak FLOP/s, efficiency curves over a size axis, and the
optimizer's bytes per parameter. Every fit weights points by relative error, so a 1 us point counts as
much as a 10 ms one (absolute least squares would ignore the small sizes, where overheads live).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MIN_EFFICIENCY = 1e-4  # cost profiles need efficiencies in (0, 1]


@dataclass(frozen=True, kw_only=True)
class LinearFit:
    """time = overhead_s + size / bandwidth (size in bytes, or any unit of work)."""

    overhead_s: float
    bandwidth_per_s: float  # size units per second (inf when the size term is zero)
    rms_relative_error: float
    num_points: int

    def time_s(self, size: float) -> float:
        return self.overhead_s + size / self.bandwidth_per_s


def fit_nonnegative(features: np.ndarray, times_s: Sequence[float]) -> tuple[np.ndarray, float]:
    """Coefficients c >= 0 minimising sum(((features @ c) - t) / t)^2, and the rms relative error.

    features: (points, terms). A term whose unconstrained coefficient comes out negative is dropped
    (set to zero) and the rest refitted, until all are non-negative (active set, small problems).
    """
    x = np.asarray(features, dtype=float)
    t = np.asarray(times_s, dtype=float)
    if x.ndim != 2 or x.shape[0] != t.shape[0] or x.shape[0] == 0:
        raise ValueError(f"features {x.shape} and times {t.shape} do not match")
    if np.any(t <= 0):
        raise ValueError("times must be positive")
    weights = 1.0 / t
    active = list(range(x.shape[1]))
    coef = np.zeros(x.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(x[:, active] * weights[:, None], np.ones_like(t), rcond=None)
        if np.all(sol >= 0):
            coef[:] = 0.0
            coef[active] = sol
            break
        active.pop(int(np.argmin(sol)))
    rel = (x @ coef - t) / t
    return coef, float(np.sqrt(np.mean(rel**2)))


def fit_overhead_bandwidth(sizes: Sequence[float], times_s: Sequence[float]) -> LinearFit:
    """Fit time = overhead + size / bandwidth (both non-negative) to measured (size, time) points."""
    s = np.asarray(sizes, dtype=float)
    coef, rms = fit_nonnegative(np.column_stack([np.ones_like(s), s]), times_s)
    bandwidth = 1.0 / coef[1] if coef[1] > 0 else float("inf")
    return LinearFit(overhead_s=float(coef[0]), bandwidth_per_s=bandwidth, rms_relative_error=rms, num_points=len(s))


def net_time_s(time_s: float, overhead_s: float, floor_fraction: float = 0.1) -> float:
    """Time of the work itself: measured time less one fixed per-op overhead (the cost model adds that
    overhead per kernel separately), never below floor_fraction of the measurement (noise guard)."""
    return max(time_s - overhead_s, floor_fraction * time_s)


def peak_rate(work: Sequence[float], times_s: Sequence[float], overhead_s: float = 0.0) -> float:
    """Best achieved rate (e.g. FLOP/s) over the measurements, from times net of the per-op overhead."""
    rates = [w / net_time_s(t, overhead_s) for w, t in zip(work, times_s, strict=True)]
    if not rates:
        raise ValueError("no measurements")
    return max(rates)


def efficiency_curve(
    xs: Sequence[float], work: Sequence[float], times_s: Sequence[float], peak: float, overhead_s: float = 0.0
) -> tuple[list[float], list[float]]:
    """Efficiency over x (e.g. GEMM rows): for each distinct x, the median over its points of
    work / (peak x net time). Returns (increasing x, efficiencies clipped to (0, 1])."""
    by_x: dict[float, list[float]] = {}
    for x, w, t in zip(xs, work, times_s, strict=True):
        by_x.setdefault(float(x), []).append(w / (peak * net_time_s(t, overhead_s)))
    out_x = sorted(by_x)
    out_e = [float(np.clip(np.median(by_x[x]), MIN_EFFICIENCY, 1.0)) for x in out_x]
    return out_x, out_e


def fit_optimizer(
    num_params: Sequence[float], num_tensors: Sequence[float], times_s: Sequence[float]
) -> tuple[float, float, float, float]:
    """Fit an optimizer step: time = fixed + per_tensor x tensors + per_param x params.

    Returns (fixed_s, per_tensor_s, per_param_s, rms relative error).
    """
    p = np.asarray(num_params, dtype=float)
    n = np.asarray(num_tensors, dtype=float)
    coef, rms = fit_nonnegative(np.column_stack([np.ones_like(p), n, p]), times_s)
    return float(coef[0]), float(coef[1]), float(coef[2]), rms


def optimizer_bytes_per_param(per_param_s: float, bandwidth_bytes_per_s: float) -> float:
    """Bytes per parameter that make params x bytes / bandwidth equal the measured per-parameter time."""
    return per_param_s * bandwidth_bytes_per_s


def median(values: Sequence[float]) -> float:
    return float(np.median(np.asarray(values, dtype=float)))
