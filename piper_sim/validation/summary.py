"""The summary of a validation over its cases, from the per-case scores of validation.scoring.

Owns the statistics `piper-sim validate` judges and prints: MAPE, max error, the rank correlation of the
cases by step time, the order the measurements establish (validation.ordering), HALO-over-flat speedups of
paired cases, peak memory, the machine references, how many ranks compute at once (validation.concurrency)
and the pooled view over every kept round. Reads score dicts only: must not import torch, the CLI, or run
a simulation.
"""

from __future__ import annotations

import json

import numpy as np

from piper_sim.analysis.ranking import spearman
from piper_sim.validation.concurrency import mean_computing
from piper_sim.validation.ordering import order_summary, order_swaps


def summarize(scores: list[dict]) -> dict:
    errors = np.array([abs(s["error"]) for s in scores])
    memory = [abs(s["memory_error"]) for s in scores if not np.isnan(s["memory_error"])]
    swaps = order_swaps(scores)
    return {
        "memory_max_error": float(max(memory)) if memory else None,
        "memory_mean_error": float(np.mean(memory)) if memory else None,
        "cases": len(scores),
        "mape": float(errors.mean()) if len(errors) else 0.0,
        "max_error": float(errors.max()) if len(errors) else 0.0,
        "rank_correlation": spearman([s["predicted_step_s"] for s in scores], [s["measured_step_s"] for s in scores]),
        "same_order": not swaps,
        "order_swaps": swaps,
        "measured_order": order_summary(scores, swaps),
        "outside_tolerance": [s["case"] for s in scores if abs(s["error"]) > s["tolerance"]],
        "halo_over_flat": halo_over_flat(scores),
        "machine_speed": machine_speed(scores),
        "compute_concurrency": concurrency_summary(scores),
        "pooled": pooled_summary(scores),
    }


def halo_over_flat(scores: list[dict]) -> list[dict]:
    """The flat step time over the HALO one of each pair of cases that has both, measured and predicted."""
    pairs: dict[str, dict[str, dict]] = {}
    for s in scores:
        if s["pair"]:
            algo = s["prediction"].config.collectives.all_to_all
            pairs.setdefault(s["pair"], {})[algo] = s
    speedups = []
    for label, members in sorted(pairs.items()):
        if {"flat", "halo"} <= set(members):
            f, h = members["flat"], members["halo"]
            measured = f["measured_step_s"] / h["measured_step_s"]
            predicted = f["predicted_step_s"] / h["predicted_step_s"]
            speedups.append(
                {"pair": label, "measured": measured, "predicted": predicted, "error": predicted / measured - 1}
            )
    return speedups


def pooled_summary(scores: list[dict]) -> dict | None:
    """The prediction against the median of every round of every kept measurement of each case (the scored
    one's rounds and its earlier_sessions'), so that no one measurement's drift decides a case. A second
    view beside the scored run, printed, never the verdict; None unless every case has rounds."""
    pooled = {s["case"]: [t for runs in s.get("measured_sessions", {}).values() for t in runs] for s in scores}
    if not scores or not all(pooled.values()):
        return None
    errors = {s["case"]: s["predicted_step_s"] / float(np.median(pooled[s["case"]])) - 1 for s in scores}
    worst = max(errors, key=lambda c: abs(errors[c]))
    return {
        "mape": float(np.mean([abs(e) for e in errors.values()])),
        "max_error": abs(errors[worst]),
        "worst_case": worst,
        "errors": errors,
        "sessions": max(len(s["measured_sessions"]) for s in scores),
        "rounds_min": min(len(r) for r in pooled.values()),
    }


def concurrency_summary(scores: list[dict]) -> dict | None:
    """Over the cases (each case's steady steps): the mean number of ranks inside a compute task, and the
    share of time with none, predicted and measured (validation.concurrency); None without them."""
    tables = [s["concurrency"] for s in scores if s.get("concurrency") is not None]
    if not tables:
        return None
    out = {
        f"{side}_{what}": float(np.mean([fn(t[side]) for t in tables]))
        for side in ("predicted", "measured")
        for what, fn in (("mean_ranks_computing", mean_computing), ("share_none_computing", lambda c: c[0]))
    }
    # compute tasks with a core to themselves: over the cases whose measurement has CPU per task
    whole = [
        (s["predicted_uninterrupted_share"], s["measured_uninterrupted_share"])
        for s in scores
        if not np.isnan(s.get("measured_uninterrupted_share", np.nan))
    ]
    if whole:
        out["predicted_share_uninterrupted"], out["measured_share_uninterrupted"] = map(float, np.mean(whole, axis=0))
    return out


def machine_speed(scores: list[dict]) -> dict | None:
    """The reference workload timed during the measurement (each round, remeasure) against the profile's: the
    median over the rounds of every case, and their range. None unless both sides timed the same preset."""
    calibrated = {(s.get("calibrated_reference_s") or 0.0, s.get("calibrated_reference_preset")) for s in scores}
    # cases measured in the same rounds share one list of rounds: count each list once
    measured = sorted(t for rounds in {tuple(s.get("measured_reference_s") or ()) for s in scores} for t in rounds)
    presets = {s.get("reference_preset") for s in scores if s.get("measured_reference_s")}
    if len(calibrated) != 1 or not measured or len(presets) != 1:
        return None
    ((cal_s, preset),) = calibrated
    if cal_s <= 0 or presets != {preset}:
        return None
    out = {"preset": preset, "calibrated_s": cal_s, **_rounds(measured, cal_s)}
    colds = {json.dumps(s["cold_reference"], sort_keys=True) for s in scores if s.get("cold_reference")}
    if len(colds) == 1:
        cold = json.loads(colds.pop())
        out["cold"] = {
            "model": cold["model"],
            "ranks": cold["ranks"],
            "tokens": cold["tokens"],
            "priced_s": cold["priced_s"],
            **_rounds(sorted(t * 1e-6 for t in cold["measured_us_by_run"]), cold["priced_s"]),
        }
    return out


def _rounds(times: list[float], base_s: float) -> dict:
    """The median, range and count of sorted round times, and the median over base_s."""
    median = float(np.median(times))
    return {
        "measured_median_s": median,
        "measured_min_s": times[0],
        "measured_max_s": times[-1],
        "rounds": len(times),
        "ratio": median / base_s,
    }
