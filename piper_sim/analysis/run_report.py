"""report.json: step time, MFU, bubble and exposed communication, memory, all-to-all bandwidth.

Owns the metric definitions (docs/metrics.md repeats them):
- step_time_s: mean over steps of (end of the step's last task - end of the previous step), the first
  warmup_steps left out (a real run's first step pays one-time costs: allocation, first calls, connections);
  every figure below is over the same steps: from the end of the last warm-up step to the end of the run.
- model_flops_per_step: FLOPs of the useful forward and backward work of one step, summed over
  all ranks (active experts only, no recomputation), from the tasks' flops.
- mfu: model_flops_per_step / (step_time_s x num_gpus x peak FLOP/s of one GPU).
- hfu: the same with the FLOPs of activation recomputation included (hardware FLOPs; equal to mfu
  without recomputation).
- bubble_fraction: mean over ranks of the time the rank is neither computing nor communicating.
- exposed_comm_fraction: mean over ranks of communication time not hidden under compute.
- all_to_all_bandwidth_bytes_per_s: mean over all-to-all calls of the mean bytes a member sends
  divided by the call's duration from the last member's arrival to its end.
Report is the typed record of all of them; report_of builds it from a run's TraceFigures (frame_figures of a trace
frame, either backend; analysis.task_arrays for a simulated run's arrays), make_report from a frame, and
Report.to_dict gives report.json.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import pandas as pd

from piper_sim.workload.task_kinds import RECOMPUTE_KINDS, Stream, TaskKind


def union_length_by_rank(rank: np.ndarray, start: np.ndarray, end: np.ndarray, num_ranks: int) -> np.ndarray:
    """Length of the union of the [start, end) intervals of each rank (one interval per entry)."""
    out = np.zeros(num_ranks)
    if rank.size == 0:
        return out
    span = float(end.max() - start.min()) + 1.0
    offset = rank * span
    order = np.argsort(start + offset, kind="stable")
    start, end, rank = (start + offset)[order], (end + offset)[order], rank[order]
    reach = np.maximum.accumulate(end)
    prev = np.concatenate(([-np.inf], reach[:-1]))
    length = np.clip(end - np.maximum(start, prev), 0, None)
    np.add.at(out, rank, length)
    return out


def step_times(df: pd.DataFrame) -> list[float]:
    ends = df.groupby("step", observed=True)["end_s"].max().sort_index().to_numpy()
    return np.diff(np.concatenate(([0.0], ends))).tolist()


def a2a_call_bandwidths(df: pd.DataFrame) -> np.ndarray:
    """Per all-to-all call of a positive duration: the mean bytes a member sends over the call's duration from the
    last member's arrival to its end."""
    a2a = df[df["kind"] == TaskKind.ALL_TO_ALL]
    if a2a.empty:
        return np.zeros(0)
    calls = a2a.groupby(["step", "task_id", "peers"], observed=True).agg(
        last_arrival=("start_s", "max"), end=("end_s", "max"), sent=("bytes", "mean")
    )
    duration = (calls["end"] - calls["last_arrival"]).to_numpy()
    ok = duration > 0
    return calls["sent"].to_numpy()[ok] / duration[ok]


def busiest_link_row(links: pd.DataFrame | None) -> dict | None:
    """The links table's first row (the busiest link) as plain values; None without link loads."""
    if links is None or links.empty:
        return None
    return {k: (v.item() if hasattr(v, "item") else v) for k, v in links.iloc[0].to_dict().items()}


@dataclass(frozen=True, kw_only=True)
class Report:
    """report.json as a record (docs/metrics.md defines every key); backend-only figures are None elsewhere, and
    the estimate tier (planning/estimate_report.py) has None for the figures only a simulation gives."""

    num_gpus: int
    num_steps: int
    step_time_s: float
    step_times_s: list[float] | None
    tokens_per_step: int
    tokens_per_s: float
    model_flops_per_step: float
    tflops_per_gpu: float
    mfu: float
    hfu: float | None
    compute_fraction: float | None
    bubble_fraction: float | None
    exposed_comm_fraction: float | None
    peak_memory_bytes: list[float]  # per stage
    all_to_all_bandwidth_bytes_per_s: float | None
    busiest_link: dict | None = None  # the links table's first row, where the run has a topology's link loads
    # simulator
    sim_wall_s: float | None = None
    hbm_bytes: float | None = None
    framework_reserve_bytes: float | None = None  # HBM a plan may not use (workload/memory.py reserve_bytes)
    # per stage, against hbm_bytes less the framework reserve (workload/memory.py)
    memory_headroom_bytes: list[float] | None = None
    fits_memory: list[bool] | None = None
    peak_memory_bytes_first_step: list[float] | None = None
    imbalance: dict | None = None
    migration: dict | None = None
    tier: str | None = None  # a simulator's report: "des" (the event simulation) or "estimate" (the estimator)
    estimate: dict | None = None  # the estimate tier: the estimator's terms (planning.estimate.Estimate)
    error_band: dict | None = None  # a prediction's expected error (analysis/band.py; docs/metrics.md)
    mfu_fp8_peak: float | None = None  # cost.precision fp8: model FLOPs over the fp8 peak (mfu stays over bf16's)
    # torch backend
    backend: str | None = None
    device: str | None = None
    losses: list[float] | None = None
    run_wall_s: float | None = None
    peak_memory_kind: str | None = None
    peak_rss_bytes: list[float] | None = None
    peak_device_memory_bytes: list[float] | None = None
    mfu_peak_profile: str | None = None
    testbed: str | None = None
    warmup_steps: int | None = None  # the first steps left out of every figure (the torch backend: 1 of 2 or more)
    # the micro-batch counts simulated: the configured one, or the short runs it was extrapolated from (three on a
    # line and the count that checked it; steady_state.py; None: a run's report, not the planner's or validation's)
    microbatches_simulated: list[int] | None = None
    # how figures of short runs were extrapolated: "exact" (every total on one line) or "near" (a contended plan: the
    # step on its line, the shares of the step from the last runs' slope); None: the configured count simulated
    extrapolation: str | None = None

    def to_dict(self, nulls: tuple[str, ...] = ()) -> dict:
        """report.json: every figure the run has (None fields left out, but those named in `nulls`)."""
        return {
            f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None or f.name in nulls
        }


def steady_window(df: pd.DataFrame, warmup_steps: int) -> tuple[pd.DataFrame, float]:
    """The rows of the steps after the first warmup_steps, and when they begin (the end of the last warm-up
    step; 0 without one)."""
    if warmup_steps <= 0:
        return df, 0.0
    steps = df["step"].to_numpy()
    first = np.unique(steps)[warmup_steps]
    return df[steps >= first], float(df.loc[steps < first, "end_s"].max())


@dataclass(frozen=True, kw_only=True)
class TraceFigures:
    """What a report is made of, from a run's tasks (a trace frame: frame_figures; the simulator's arrays:
    analysis.task_arrays.TaskArrays.figures): every step's time, the window the other figures cover (from begin_s,
    the end of the last warm-up step, to end_s, the last task's end), the FLOPs in it (all, and recomputation's),
    each rank's busy time in it (compute stream, and any task) and the all-to-all calls' bandwidths."""

    step_times_s: list[float]
    begin_s: float
    end_s: float
    hardware_flops: float
    recompute_flops: float
    busy_compute_s: np.ndarray  # per rank
    busy_any_s: np.ndarray  # per rank
    a2a_call_bandwidths: np.ndarray


def frame_figures(df: pd.DataFrame, num_gpus: int, warmup_steps: int | None = None) -> TraceFigures:
    """A trace frame's TraceFigures; warmup_steps: the first steps left out of every figure but the step times
    (fewer than the run's steps)."""
    all_steps = step_times(df)
    if warmup_steps is not None and not 0 <= warmup_steps < len(all_steps):
        raise ValueError(f"warmup_steps {warmup_steps} of a run of {len(all_steps)} steps")
    df, begin_s = steady_window(df, warmup_steps or 0)
    recompute = df["kind"].isin(sorted(RECOMPUTE_KINDS))
    is_compute = (df["stream"] == Stream.COMPUTE).to_numpy()
    rank, end = df["rank"].to_numpy(), df["end_s"].to_numpy()
    start = np.maximum(df["start_s"].to_numpy(), begin_s)
    compute = np.flatnonzero(is_compute)
    every = np.concatenate([compute, np.flatnonzero(~is_compute)])  # compute first, as the intervals were always taken
    return TraceFigures(
        step_times_s=all_steps,
        begin_s=begin_s,
        end_s=float(df["end_s"].max()),
        hardware_flops=float(df["flops"].sum()),
        recompute_flops=float(df.loc[recompute, "flops"].sum()) if recompute.any() else 0.0,
        busy_compute_s=union_length_by_rank(rank[compute], start[compute], end[compute], num_gpus),
        busy_any_s=union_length_by_rank(rank[every], start[every], end[every], num_gpus),
        a2a_call_bandwidths=a2a_call_bandwidths(df),
    )


def make_report(
    df: pd.DataFrame,
    *,
    num_gpus: int,
    warmup_steps: int | None = None,
    **figures,
) -> Report:
    """The report of one run's trace frame (report_of: the other arguments). warmup_steps: the first steps left out
    of every figure (fewer than the run's steps)."""
    return report_of(frame_figures(df, num_gpus, warmup_steps), num_gpus=num_gpus, warmup_steps=warmup_steps, **figures)


def report_of(
    figures: TraceFigures,
    *,
    num_gpus: int,
    peak_flops_per_s: float,
    tokens_per_step: int,
    peak_memory_by_stage: list[float],
    links: pd.DataFrame | None = None,
    warmup_steps: int | None = None,
    peak_fp8_flops_per_s: float | None = None,
    **backend_figures,
) -> Report:
    """The report of one run's figures; backend_figures are the Report fields only one backend has. warmup_steps:
    the steps the figures leave out. peak_fp8_flops_per_s: a run in fp8, whose MFU is also given over the fp8 peak
    (mfu_fp8_peak)."""
    all_steps = figures.step_times_s
    steps = all_steps[warmup_steps or 0 :]
    num_steps = len(steps)
    step_time = float(np.mean(steps))
    makespan = figures.end_s - figures.begin_s
    hardware_flops = figures.hardware_flops / num_steps
    model_flops = hardware_flops - figures.recompute_flops / num_steps if figures.recompute_flops else hardware_flops
    busy_compute, busy_any = figures.busy_compute_s, figures.busy_any_s
    calls = figures.a2a_call_bandwidths
    return Report(
        num_gpus=num_gpus,
        num_steps=len(all_steps),
        step_time_s=step_time,
        step_times_s=all_steps,
        tokens_per_step=tokens_per_step,
        tokens_per_s=tokens_per_step / step_time,
        model_flops_per_step=model_flops,
        tflops_per_gpu=model_flops / step_time / num_gpus / 1e12,
        mfu=model_flops / (step_time * num_gpus * peak_flops_per_s),
        mfu_fp8_peak=mfu_over_peak(model_flops, step_time, num_gpus, peak_fp8_flops_per_s),
        hfu=hardware_flops / (step_time * num_gpus * peak_flops_per_s),
        compute_fraction=float(np.mean(busy_compute) / makespan),
        bubble_fraction=float(np.mean(makespan - busy_any) / makespan),
        exposed_comm_fraction=float(np.mean(busy_any - busy_compute) / makespan),
        peak_memory_bytes=[float(x) for x in peak_memory_by_stage],
        all_to_all_bandwidth_bytes_per_s=float(np.mean(calls)) if calls.size else 0.0,
        busiest_link=busiest_link_row(links),
        warmup_steps=warmup_steps,
        **backend_figures,
    )


def mfu_over_peak(
    model_flops_per_step: float, step_time_s: float, num_gpus: int, peak_flops_per_s: float | None
) -> float | None:
    """Model FLOPs per step over what the GPUs' peak does in a step; None without a peak (a bf16 run's fp8 MFU)."""
    if peak_flops_per_s is None:
        return None
    return model_flops_per_step / (step_time_s * num_gpus * peak_flops_per_s)


def steps_note(report: dict) -> str:
    """Which steps a real run's figures are over (report.json: warmup_steps), in words; "" for a prediction."""
    if "warmup_steps" not in report:
        return ""
    warm, steps = report["warmup_steps"], report["num_steps"]
    if warm == 0:
        return (
            f"all {steps} steps, warm-up included (run 2 or more steps to leave step 1 out)"
            if steps > 1
            else "step 1, warm-up included (run 2 or more steps to leave it out)"
        )
    kept = f"step {steps}" if warm + 1 == steps else f"steps {warm + 1}-{steps}"
    return f"{kept}; " + ("step 1 is warm-up" if warm == 1 else f"steps 1-{warm} are warm-up")


def kind_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per task kind: count and mean/total duration (s), total bytes and FLOPs."""
    dur = df["end_s"] - df["start_s"]
    return (
        df.assign(duration_s=dur)
        .groupby("kind", observed=True)
        .agg(
            count=("duration_s", "size"),
            mean_s=("duration_s", "mean"),
            total_s=("duration_s", "sum"),
            bytes=("bytes", "sum"),
            flops=("flops", "sum"),
        )
        .reset_index()
    )
