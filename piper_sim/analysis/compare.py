"""Predicted vs measured: join two RunTraces on (step, rank, task_id) and summarize the errors.

Owns the comparison tables: per task kind, per step, and the headline metrics of both reports.
Error is (predicted - measured) / measured.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from piper_sim.errors import PiperError
from piper_sim.trace.runtrace import read_trace

KEYS = ["step", "rank", "task_id"]
HEADLINE = ("step_time_s", "tokens_per_s", "mfu", "bubble_fraction", "exposed_comm_fraction",
            "all_to_all_bandwidth_bytes_per_s")


@dataclass(kw_only=True)
class Comparison:
    by_kind: pd.DataFrame
    by_step: pd.DataFrame
    headline: pd.DataFrame
    matched_tasks: int
    unmatched_predicted: int
    unmatched_measured: int


def join_traces(predicted: pd.DataFrame, measured: pd.DataFrame) -> pd.DataFrame:
    cols = KEYS + ["kind", "start_s", "end_s", "bytes"]
    p = predicted[cols].astype({"task_id": str, "kind": str})
    m = measured[cols].astype({"task_id": str, "kind": str})
    joined = p.merge(m, on=KEYS, suffixes=("_pred", "_meas"), how="inner")
    joined["duration_pred_s"] = joined["end_s_pred"] - joined["start_s_pred"]
    joined["duration_meas_s"] = joined["end_s_meas"] - joined["start_s_meas"]
    return joined


def compare_runs(pred_dir: Path, meas_dir: Path) -> Comparison:
    predicted, measured = read_trace(pred_dir), read_trace(meas_dir)
    joined = join_traces(predicted, measured)
    if joined.empty:
        raise PiperError(f"no task of {pred_dir} matches one of {meas_dir}: are they runs of the same config?")
    by_kind = joined.groupby("kind_pred").agg(
        count=("duration_pred_s", "size"), predicted_mean_s=("duration_pred_s", "mean"),
        measured_mean_s=("duration_meas_s", "mean"), predicted_total_s=("duration_pred_s", "sum"),
        measured_total_s=("duration_meas_s", "sum")).reset_index().rename(columns={"kind_pred": "kind"})
    by_kind["error"] = by_kind["predicted_total_s"] / by_kind["measured_total_s"] - 1.0
    by_step = pd.DataFrame({
        "predicted_s": _step_times(predicted), "measured_s": _step_times(measured)}).dropna()
    by_step["error"] = by_step["predicted_s"] / by_step["measured_s"] - 1.0
    reports = [json.loads((Path(d) / "report.json").read_text()) for d in (pred_dir, meas_dir)]
    rows = [(k, reports[0].get(k), reports[1].get(k)) for k in HEADLINE if k in reports[0] and k in reports[1]]
    headline = pd.DataFrame(rows, columns=["metric", "predicted", "measured"])
    with np.errstate(divide="ignore", invalid="ignore"):
        headline["error"] = headline["predicted"] / headline["measured"] - 1.0
    return Comparison(by_kind=by_kind, by_step=by_step.reset_index(names="step"), headline=headline,
                      matched_tasks=len(joined), unmatched_predicted=len(predicted) - len(joined),
                      unmatched_measured=len(measured) - len(joined))


def _step_times(df: pd.DataFrame) -> pd.Series:
    ends = df.groupby("step", observed=True)["end_s"].max().sort_index()
    return ends.diff().fillna(ends)


def format_comparison(c: Comparison) -> str:
    lines = [f"matched tasks: {c.matched_tasks} (only predicted: {c.unmatched_predicted}, "
             f"only measured: {c.unmatched_measured})", "", "per task kind (total time over all ranks):"]
    lines.append(f"  {'kind':24s} {'count':>7s} {'pred mean ms':>13s} {'meas mean ms':>13s} {'error':>8s}")
    for r in c.by_kind.itertuples():
        lines.append(f"  {r.kind:24s} {r.count:7d} {r.predicted_mean_s * 1e3:13.4f} {r.measured_mean_s * 1e3:13.4f} "
                     f"{r.error * 100:7.1f}%")
    lines += ["", "per step:", f"  {'step':>4s} {'pred ms':>10s} {'meas ms':>10s} {'error':>8s}"]
    for r in c.by_step.itertuples():
        lines.append(f"  {r.step:4d} {r.predicted_s * 1e3:10.3f} {r.measured_s * 1e3:10.3f} {r.error * 100:7.1f}%")
    lines += ["", "headline:"]
    for r in c.headline.itertuples():
        lines.append(f"  {r.metric:34s} {r.predicted:14.6g} {r.measured:14.6g} {r.error * 100:7.1f}%")
    return "\n".join(lines)
