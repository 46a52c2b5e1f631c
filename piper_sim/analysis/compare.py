"""Predicted vs measured: join two RunTraces on (step, rank, task_id) and summarize the errors.

Owns reading the two run folders (each must be a finished output of `simulate` or `run`), the check that they
are comparable (the same model, plan, schedule, recompute, optimizer and all-to-all; a prediction of a run on
CPU made with a CPU profile), and the comparison tables: per task kind, per step, and the headline metrics of
both reports. Error is (predicted - measured) / measured.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from piper_sim.analysis.run_report import steps_note
from piper_sim.errors import PiperError
from piper_sim.profile_choice import CPU, profile_name
from piper_sim.rundir import is_unfinished
from piper_sim.trace.runtrace import read_trace
from piper_sim.workload.profile_file import profile_device_kind

# config sections that must be equal for two runs' tasks to be the same tasks
MUST_MATCH = ("model", "parallel", "schedule", "recompute", "recompute_layers", "optimizer", "collectives")

KEYS = ["step", "rank", "task_id"]
HEADLINE = (
    "step_time_s",
    "tokens_per_s",
    "mfu",
    "bubble_fraction",
    "exposed_comm_fraction",
    "all_to_all_bandwidth_bytes_per_s",
)


@dataclass(kw_only=True)
class Comparison:
    by_kind: pd.DataFrame
    by_step: pd.DataFrame
    headline: pd.DataFrame
    matched_tasks: int
    unmatched_predicted: int
    unmatched_measured: int
    steps: str = ""  # which steps the headline is over, where the measured run left warm-up out (report.steps_note)
    mfu_peaks: tuple[str, str] = ("", "")  # the profiles whose peaks the two MFUs are against (compared where equal)


def join_traces(predicted: pd.DataFrame, measured: pd.DataFrame) -> pd.DataFrame:
    cols = KEYS + ["kind", "start_s", "end_s", "bytes"]
    p = predicted[cols].astype({"task_id": str, "kind": str})
    m = measured[cols].astype({"task_id": str, "kind": str})
    joined = p.merge(m, on=KEYS, suffixes=("_pred", "_meas"), how="inner")
    joined["duration_pred_s"] = joined["end_s_pred"] - joined["start_s_pred"]
    joined["duration_meas_s"] = joined["end_s_meas"] - joined["start_s_meas"]
    return joined


@dataclass(frozen=True)
class RunDir:
    path: Path
    trace: pd.DataFrame
    report: dict
    config: dict


def read_run(path: Path) -> RunDir:
    """A finished run folder: its trace, report.json and config.yaml, each checked."""
    path = Path(path)
    if not path.is_dir():
        raise PiperError(f"{path}: not a run folder (run `piper-sim simulate` or `run` with --out {path})")
    if is_unfinished(path):
        raise PiperError(f"{path}: the run that wrote it did not finish (it holds UNFINISHED); rerun it")
    parts = {}
    for name, parse in (("report.json", json.loads), ("config.yaml", yaml.safe_load)):
        try:
            parts[name] = parse((path / name).read_text())
        except OSError as exc:
            raise PiperError(f"{path / name}: cannot read it ({exc.strerror}); is {path} a run folder?") from None
        except (ValueError, yaml.YAMLError) as exc:
            raise PiperError(
                f"{path / name}: not valid {name.rsplit('.', 1)[1].upper()} ({' '.join(str(exc).split())[:100]})"
            ) from None
        if not isinstance(parts[name], dict):
            raise PiperError(f"{path / name}: not a mapping, as piper-sim writes it")
    try:
        trace = read_trace(path)
    except PiperError:
        raise
    except Exception as exc:  # pyarrow and pandas raise many types for a torn or foreign file
        raise PiperError(
            f"{path}: its trace cannot be read ({type(exc).__name__}: {' '.join(str(exc).split())[:100]})"
        ) from None
    return RunDir(path=path, trace=trace, report=parts["report.json"], config=parts["config.yaml"])


def check_comparable(predicted: RunDir, measured: RunDir) -> None:
    """Refuse runs whose tasks are not the same tasks, and a CPU run predicted with a profile of another device."""
    differ = [k for k in MUST_MATCH if predicted.config.get(k) != measured.config.get(k)]
    if differ:
        raise PiperError(
            f"{predicted.path} and {measured.path} are runs of different configs ({', '.join(differ)} "
            "differ): compare a prediction with a run of the same config"
        )
    profile = (predicted.config.get("cost") or {}).get("profile")
    if measured.report.get("device") == "cpu" and predicted.report.get("backend") == "sim":
        device = profile_device_kind(profile) if profile is not None else ""
        if device != CPU:
            raise PiperError(
                f"{predicted.path} was predicted with cost profile {profile_name(profile)} "
                f"(device_kind {device or 'none'}), "
                f"{measured.path} ran on CPU: predict with a profile calibrated on that machine "
                "(--set cost.profile=NAME, traces/profiles/cpu-*.yaml)"
            )


def mfu_peaks(predicted: RunDir, measured: RunDir) -> tuple[str, str]:
    """The profiles whose peak FLOP/s the prediction's and the measured run's MFU are against."""
    own = profile_name((predicted.config.get("cost") or {}).get("profile"))
    return (str(predicted.report.get("mfu_peak_profile", own)), str(measured.report.get("mfu_peak_profile", own)))


def compare_runs(pred_dir: Path, meas_dir: Path) -> Comparison:
    pred, meas = read_run(pred_dir), read_run(meas_dir)
    check_comparable(pred, meas)
    predicted, measured = pred.trace, meas.trace
    joined = join_traces(predicted, measured)
    if joined.empty:
        raise PiperError(f"no task of {pred_dir} matches one of {meas_dir}: are they runs of the same config?")
    by_kind = (
        joined.groupby("kind_pred")
        .agg(
            count=("duration_pred_s", "size"),
            predicted_mean_s=("duration_pred_s", "mean"),
            measured_mean_s=("duration_meas_s", "mean"),
            predicted_total_s=("duration_pred_s", "sum"),
            measured_total_s=("duration_meas_s", "sum"),
        )
        .reset_index()
        .rename(columns={"kind_pred": "kind"})
    )
    by_kind["error"] = by_kind["predicted_total_s"] / by_kind["measured_total_s"] - 1.0
    by_step = pd.DataFrame({"predicted_s": _step_times(predicted), "measured_s": _step_times(measured)}).dropna()
    by_step["error"] = by_step["predicted_s"] / by_step["measured_s"] - 1.0
    reports = [same_steps(pred.report, int(meas.report.get("warmup_steps") or 0)), meas.report]
    peaks = mfu_peaks(pred, meas)
    rows = [
        (k, reports[0].get(k), reports[1].get(k))
        for k in HEADLINE
        if k in reports[0] and k in reports[1] and (k != "mfu" or peaks[0] == peaks[1])
    ]
    headline = pd.DataFrame(rows, columns=["metric", "predicted", "measured"])
    with np.errstate(divide="ignore", invalid="ignore"):
        headline["error"] = headline["predicted"] / headline["measured"] - 1.0
    return Comparison(
        by_kind=by_kind,
        by_step=by_step.reset_index(names="step"),
        headline=headline,
        matched_tasks=len(joined),
        unmatched_predicted=len(predicted) - len(joined),
        unmatched_measured=len(measured) - len(joined),
        steps=steps_note(meas.report),
        mfu_peaks=peaks,
    )


def same_steps(report: dict, warmup_steps: int) -> dict:
    """A prediction's report with its step-time figures over the steps a measured run's are (its first
    warmup_steps left out): step time, tokens/s, TFLOPS and MFU go as one over the step time."""
    times = report.get("step_times_s") or []
    if warmup_steps <= 0 or len(times) <= warmup_steps or "warmup_steps" in report:
        return report
    step_s = float(np.mean(times[warmup_steps:]))
    scale = report["step_time_s"] / step_s
    out = {**report, "step_time_s": step_s, "warmup_steps": warmup_steps}
    for key in ("tokens_per_s", "tflops_per_gpu", "mfu", "hfu"):
        if key in report:
            out[key] = report[key] * scale
    return out


def _step_times(df: pd.DataFrame) -> pd.Series:
    ends = df.groupby("step", observed=True)["end_s"].max().sort_index()
    return ends.diff().fillna(ends)


def format_comparison(c: Comparison) -> str:
    lines = [
        f"matched tasks: {c.matched_tasks} (only predicted: {c.unmatched_predicted}, "
        f"only measured: {c.unmatched_measured})",
        "",
        "per task kind (total time over all ranks):",
    ]
    lines.append(f"  {'kind':24s} {'count':>7s} {'pred mean ms':>13s} {'meas mean ms':>13s} {'error':>8s}")
    for r in c.by_kind.itertuples():
        lines.append(
            f"  {r.kind:24s} {r.count:7d} {r.predicted_mean_s * 1e3:13.4f} {r.measured_mean_s * 1e3:13.4f} "
            f"{r.error * 100:7.1f}%"
        )
    lines += ["", "per step:", f"  {'step':>4s} {'pred ms':>10s} {'meas ms':>10s} {'error':>8s}"]
    for r in c.by_step.itertuples():
        lines.append(f"  {r.step:4d} {r.predicted_s * 1e3:10.3f} {r.measured_s * 1e3:10.3f} {r.error * 100:7.1f}%")
    lines += ["", f"headline (both over {c.steps}):" if c.steps else "headline:"]
    for r in c.headline.itertuples():
        lines.append(f"  {r.metric:34s} {r.predicted:14.6g} {r.measured:14.6g} {r.error * 100:7.1f}%")
    if c.mfu_peaks[0] != c.mfu_peaks[1]:
        lines.append(
            f"  mfu not compared: predicted against {c.mfu_peaks[0]}'s peak, measured against "
            f"{c.mfu_peaks[1]}'s (tokens_per_s compares the same work)"
        )
    return "\n".join(lines)
