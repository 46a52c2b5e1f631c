"""Scoring one validation case: its prediction against its stored measurement.

Owns the step time and per-kind phase times of a trace (steady-state steps only: step 0 pays one-time
warm-up costs, gloo connections and the allocator, that no profile describes, so it is reported but not
scored), the per-case comparison (score_case: step time, phases, peak memory, the measured runs and the
machine references recorded with them) and the rounds of every measurement a case keeps
(measured_sessions). The summary over cases is validation.summary. Must not import torch or the CLI.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from piper_sim.errors import PiperError
from piper_sim.machine import Machine, build_machine
from piper_sim.result import RunResult
from piper_sim.schedule.ir import Schedule
from piper_sim.simulator import simulate
from piper_sim.trace.runtrace import read_trace
from piper_sim.validation.cases import Case, case_digest, prediction_config
from piper_sim.validation.concurrency import compute_concurrency, uninterrupted_share
from piper_sim.workload.cost import TaskCoster
from piper_sim.workload.presets import load_model
from piper_sim.workload.profile import DeviceProfile, HostProfile
from piper_sim.workload.task_kinds import P2P_KINDS


def steady(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["step"] > 0] if df["step"].max() > 0 else df


def step_time(df: pd.DataFrame) -> float:
    ends = df.groupby("step", observed=True)["end_s"].max().sort_index()
    times = ends.diff().dropna() if len(ends) > 1 else ends
    return float(times.mean())


def phase_times(df: pd.DataFrame, issued: frozenset[str] = frozenset()) -> pd.Series:
    """Mean per rank per step of the time in each blocking task kind (steady steps).

    Tasks issued without blocking are left out: send/recv, and the nonblocking collectives whose task ids are
    in `issued` (ZeRO-3's unit gathers and reduce-scatters, HSDP's all-reduce: issued_tasks). A real rank
    sees such a task from the moment it posts it until it notices the end, waiting included; the simulator
    from when its members are posted until the data arrives. Their cost shows in the step time and in the
    waits of the tasks that depend on them.
    """
    return _per_rank_step(df, df["end_s"] - df["start_s"], issued)


def phase_cpu(df: pd.DataFrame, issued: frozenset[str] = frozenset()) -> pd.Series:
    """Mean per rank per step of the CPU seconds in each blocking task kind (steady steps; the trace's cpu_s:
    measured on a real run, the work priced on one unshared core in a simulated one). NaN for a kind with a
    row without CPU (a run measured before the column existed)."""
    return _per_rank_step(df, df["cpu_s"], issued)


def issued_tasks(schedule: Schedule) -> frozenset[str]:
    """Task ids of the schedule's tasks issued without blocking the program counter (Task.is_issued)."""
    return frozenset(t.task_id for program in schedule.stage_programs for t in program if t.is_issued)


def _per_rank_step(df: pd.DataFrame, values: pd.Series, issued: frozenset[str]) -> pd.Series:
    s = steady(df)
    s = s[~s["kind"].isin(sorted(P2P_KINDS)) & ~s["task_id"].isin(issued)]
    ranks_steps = s[["rank", "step"]].drop_duplicates().shape[0]
    v = values.loc[s.index]
    kind = s["kind"].astype(str)
    sums = v.groupby(kind).sum() / ranks_steps
    return sums.where(~v.isna().groupby(kind).any())


def score_case(case: Case, profile: str | dict) -> dict:
    """The case's prediction from the profile against its measurement: one dict of figures per case (the
    columns of validation.csv, plus its phases, prediction and concurrency tables)."""
    if not (case.measured / "report.json").exists():
        raise PiperError(f"validate: case {case.name} has no measurement (run with --remeasure)")
    cfg = prediction_config(case, profile)
    machine = build_machine(cfg)  # its profiles price the prediction and the machine references
    result = simulate(cfg, machine=machine)
    measured = read_trace(case.measured)
    pred_step, meas_step = step_time(result.trace), step_time(measured)
    info = _measurement_info(case)
    runs = info.get("run_step_times_s") or []
    memory = _memory_scores(result, json.loads((case.measured / "report.json").read_text()))
    return {
        "case": case.name,
        "pair": case.pair,
        "description": case.description,
        "tolerance": case.tolerance,
        "predicted_step_s": pred_step,
        "measured_step_s": meas_step,
        "error": pred_step / meas_step - 1,
        **memory,
        "measured_runs_s": runs,
        "measured_sessions": measured_sessions(info),
        **_reference_scores(info.get("reference") or {}, machine),
        "measured_spread": max(runs) / min(runs) - 1 if len(runs) > 1 else float("nan"),
        "phases": _phase_table(result.trace, measured, issued_tasks(result.schedule)),
        "prediction": result,
        "predicted_uninterrupted_share": uninterrupted_share(steady(result.trace)),
        "measured_uninterrupted_share": uninterrupted_share(steady(measured)),
        "concurrency": pd.DataFrame(
            {"predicted": compute_concurrency(steady(result.trace)), "measured": compute_concurrency(steady(measured))}
        ).fillna(0.0),
    }


def _measurement_info(case: Case) -> dict:
    """The case's measured.json ({} without one); refused when the case changed since it was measured."""
    info_path = case.measured / "measured.json"
    info = json.loads(info_path.read_text()) if info_path.exists() else {}
    digest = case_digest(case)
    if info.get("case_digest", digest) != digest:
        raise PiperError(
            f"validate: case {case.name} changed (its config, topology or the backend's all-to-all "
            "revision) since it was measured; measure it again with --remeasure"
        )
    return info


def _phase_table(predicted: pd.DataFrame, measured: pd.DataFrame, issued: frozenset[str]) -> pd.DataFrame:
    """Per task kind: predicted and measured time, the error, and the CPU priced and measured (issued tasks left
    out: phase_times)."""
    phases = pd.DataFrame(
        {"predicted_s": phase_times(predicted, issued), "measured_s": phase_times(measured, issued)}
    ).fillna(0)
    phases["error"] = phases["predicted_s"] / phases["measured_s"].replace(0, np.nan) - 1
    phases["priced_cpu_s"], phases["measured_cpu_s"] = phase_cpu(predicted, issued), phase_cpu(measured, issued)
    return phases


def _memory_scores(result: RunResult, meas_report: dict) -> dict:
    """Peak memory per stage, predicted and measured, and the largest error; only for a measured run that
    counted tensors (NaN error and no measured figures otherwise)."""
    kind = str(meas_report.get("peak_memory_kind", ""))
    memory_ok = "tensor" in kind
    # a run that counts activations on step 0 is compared with the prediction's step-0 peak
    pred_mem = result.report.peak_memory_bytes_first_step if "step 0" in kind else result.report.peak_memory_bytes
    meas_mem = meas_report.get("peak_memory_bytes", [])
    memory_error = (
        max((p / m - 1 for p, m in zip(pred_mem, meas_mem, strict=False) if m > 0), key=abs, default=float("nan"))
        if memory_ok
        else float("nan")
    )
    return {
        "predicted_memory_bytes": pred_mem,
        "measured_memory_bytes": meas_mem if memory_ok else [],
        "memory_error": memory_error,
    }


def _reference_scores(reference: dict, machine: Machine) -> dict:
    """The machine references timed with the measurement's rounds beside the profile's own (the machine's)."""
    calibrated = machine.host_profile or HostProfile()
    return {
        "measured_reference_s": [t * 1e-6 for t in reference.get("cpu_us_per_iteration_by_run") or []],
        "reference_preset": reference.get("preset", ""),
        "calibrated_reference_s": calibrated.reference_cpu_s,
        "calibrated_reference_preset": calibrated.reference_preset,
        "cold_reference": dict(reference["cold"], priced_s=cold_priced_s(machine.profile, reference["cold"]))
        if reference.get("cold")
        else None,
    }


def measured_sessions(info: dict) -> dict[str, list[float]]:
    """The step time of each round of every measurement in measured.json (the scored one and its
    earlier_sessions), by its session id; {} when it lists no runs."""
    return {
        str(s.get("session", "")): list(s["run_step_times_s"])
        for s in [info, *info.get("earlier_sessions", [])]
        if s.get("run_step_times_s")
    }


def cold_priced_s(profile: DeviceProfile, cold: dict) -> float:
    """The cold reference's ops as the profile prices them (forward + backward, TaskCoster.op_s)."""
    coster = TaskCoster(load_model(cold["model"]), profile, int(cold["tokens"]))
    return sum(sum(coster.op_s(op, tuple(cold["expert_rows"]))) for op in cold["ops"])
