"""Validation cases: predict each measured run from a calibrated profile alone and score the errors.

Owns the case format (validation/cases/NAME/case.yaml plus measured/ from `piper-sim run`), the
prediction of a case (its config, the given profile, and the measured run's own routing trace so the
simulated experts see the loads the real router chose), the per-case comparison, the summary (MAPE,
max error, rank correlation of the cases by step time and the order their measurement sessions establish
(analysis.ordering), HALO-over-flat speedups of paired cases, how many ranks compute at once
(analysis.concurrency)) and re-measurement on the testbed, which keeps the earlier sessions' rounds of an
unchanged case (case_digest). Steady-state steps only: step 0 pays one-time warm-up costs (gloo
connections, allocator) that no profile describes, so it is reported but not scored. What validate
prints and writes is analysis.validation_report.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import platform
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from piper_sim.analysis.concurrency import compute_concurrency, mean_computing, uninterrupted_share
from piper_sim.analysis.ordering import order_summary, order_swaps
from piper_sim.errors import ConfigError, PiperError
from piper_sim.trace.runtrace import read_trace
from piper_sim.workload.cost import load_profile

CASE_KEYS = {"description", "config", "testbed", "tolerance", "pair", "measures"}
KEEP = ("report.json", "config.yaml", "routing.npz", "trace.parquet", "trace.csv")


@dataclass(frozen=True, kw_only=True)
class Case:
    name: str
    path: Path
    description: str
    config: dict
    testbed: str | None  # topology file the real run used for its emulated cluster, None = plain local ranks
    tolerance: float
    pair: str

    @property
    def measured(self) -> Path:
        return self.path / "measured"


def load_case(path: Path) -> Case:
    raw = yaml.safe_load((path / "case.yaml").read_text())
    bad = sorted(set(raw) - CASE_KEYS)
    if bad:
        raise ConfigError(f"{path.name}/case.yaml: {bad[0]}", raw[bad[0]], f"one of {', '.join(sorted(CASE_KEYS))}")
    return Case(name=path.name, path=path, description=raw.get("description", ""), config=raw["config"],
                testbed=raw.get("testbed"), tolerance=float(raw.get("tolerance", {}).get("step_time", 0.2)),
                pair=str(raw.get("pair", "")))


def find_cases(names: list[str], root: Path) -> list[Case]:
    if not names:
        dirs = sorted(p for p in root.iterdir() if (p / "case.yaml").exists())
    else:
        dirs = [Path(n) if Path(n).exists() else root / n for n in names]
        missing = [str(d) for d in dirs if not (d / "case.yaml").exists()]
        if missing:
            raise PiperError(f"validate: no case.yaml in {', '.join(missing)}; cases are in {root}")
    return [load_case(d) for d in dirs]


def steady(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["step"] > 0] if df["step"].max() > 0 else df


def step_time(df: pd.DataFrame) -> float:
    ends = df.groupby("step", observed=True)["end_s"].max().sort_index()
    times = ends.diff().dropna() if len(ends) > 1 else ends
    return float(times.mean())


def phase_times(df: pd.DataFrame) -> pd.Series:
    """Mean per rank per step of the time in each blocking task kind (steady steps).

    send/recv are left out: a real rank sees a transfer from the moment it posts it until it notices the
    end, the simulator from when both sides are posted until the data arrives; their cost shows in the
    step time and in the waits of the tasks that depend on them.
    """
    return _per_rank_step(df, df["end_s"] - df["start_s"])


def phase_cpu(df: pd.DataFrame) -> pd.Series:
    """Mean per rank per step of the CPU seconds in each blocking task kind (steady steps; the trace's cpu_s:
    measured on a real run, the work priced on one unshared core in a simulated one). NaN for a kind with a
    row without CPU (a run measured before the column existed)."""
    return _per_rank_step(df, df["cpu_s"])


def _per_rank_step(df: pd.DataFrame, values: pd.Series) -> pd.Series:
    s = steady(df)
    s = s[~s["kind"].isin(["send", "recv"])]
    ranks_steps = s[["rank", "step"]].drop_duplicates().shape[0]
    v = values.loc[s.index]
    kind = s["kind"].astype(str)
    sums = v.groupby(kind).sum() / ranks_steps
    return sums.where(~v.isna().groupby(kind).any())


def predict_case(case: Case, profile: str | dict):
    """Simulate the case from the profile, replaying the measured run's routing decisions."""
    from piper_sim.config import load_config
    from piper_sim.simulate import run_simulation

    raw = json.loads(json.dumps(case.config))
    raw["cost"] = {**raw.get("cost", {}), "profile": profile}
    if (case.measured / "routing.npz").exists():
        raw["routing"] = {"kind": "trace", "path": str(case.measured / "routing.npz")}
    base = case.path
    if isinstance(raw.get("topology"), str) and raw["topology"].endswith(".yaml"):
        raw["topology"] = str((base / raw["topology"]).resolve())
    return run_simulation(load_config(raw))


def score_case(case: Case, profile: str | dict) -> dict:
    if not (case.measured / "report.json").exists():
        raise PiperError(f"validate: case {case.name} has no measurement (run with --remeasure)")
    result = predict_case(case, profile)
    calibrated = load_profile(profile)
    measured = read_trace(case.measured)
    pred_step, meas_step = step_time(result.trace), step_time(measured)
    phases = pd.DataFrame({"predicted_s": phase_times(result.trace), "measured_s": phase_times(measured)}).fillna(0)
    phases["error"] = phases["predicted_s"] / phases["measured_s"].replace(0, np.nan) - 1
    phases["priced_cpu_s"], phases["measured_cpu_s"] = phase_cpu(result.trace), phase_cpu(measured)
    meas_report = json.loads((case.measured / "report.json").read_text())
    info_path = case.measured / "measured.json"
    info = json.loads(info_path.read_text()) if info_path.exists() else {}
    digest = case_digest(case)
    if info.get("case_digest", digest) != digest:
        raise PiperError(f"validate: case {case.name} changed (its config or topology) since it was measured; "
                         "measure it again with --remeasure")
    runs = info.get("run_step_times_s") or []
    reference = info.get("reference") or {}
    kind = str(meas_report.get("peak_memory_kind", ""))
    memory_ok = "tensor" in kind
    # a run that counts activations on step 0 is compared with the prediction's step-0 peak
    pred_mem = result.report["peak_memory_bytes_first_step" if "step 0" in kind else "peak_memory_bytes"]
    meas_mem = meas_report.get("peak_memory_bytes", [])
    memory_error = max((p / m - 1 for p, m in zip(pred_mem, meas_mem, strict=False) if m > 0), key=abs,
                       default=float("nan")) if memory_ok else float("nan")
    return {"case": case.name, "pair": case.pair, "description": case.description, "tolerance": case.tolerance,
            "predicted_step_s": pred_step, "measured_step_s": meas_step, "error": pred_step / meas_step - 1,
            "predicted_memory_bytes": pred_mem, "measured_memory_bytes": meas_mem if memory_ok else [],
            "memory_error": memory_error, "measured_runs_s": runs, "measured_sessions": measured_sessions(info),
            "measured_reference_s": [t * 1e-6 for t in reference.get("cpu_us_per_iteration_by_run") or []],
            "reference_preset": reference.get("preset", ""), "calibrated_reference_s": calibrated.reference_cpu_s,
            "calibrated_reference_preset": calibrated.reference_preset,
            "cold_reference": dict(reference["cold"], priced_s=cold_priced_s(profile, reference["cold"]))
            if reference.get("cold") else None,
            "measured_spread": max(runs) / min(runs) - 1 if len(runs) > 1 else float("nan"),
            "phases": phases, "prediction": result,
            "predicted_uninterrupted_share": uninterrupted_share(steady(result.trace)),
            "measured_uninterrupted_share": uninterrupted_share(steady(measured)),
            "concurrency": pd.DataFrame({"predicted": compute_concurrency(steady(result.trace)),
                                         "measured": compute_concurrency(steady(measured))}).fillna(0.0)}


def case_digest(case: Case) -> str:
    """A short hash of what a real run of the case depends on in the case: its config and the topology files
    it names. measured.json records it; validate refuses a measurement whose case has changed since."""
    digest = hashlib.sha256(json.dumps(case.config, sort_keys=True).encode())
    for rel in sorted({case.testbed, case.config.get("topology")} - {None}):
        if isinstance(rel, str) and rel.endswith(".yaml") and (case.path / rel).exists():
            digest.update((case.path / rel).read_bytes())
    return digest.hexdigest()[:16]


def measured_sessions(info: dict) -> dict[str, list[float]]:
    """The step time of each round of every measurement session in measured.json (the scored session and its
    earlier_sessions), by session id; {} when it lists no runs."""
    return {str(s.get("session", "")): list(s["run_step_times_s"])
            for s in [info, *info.get("earlier_sessions", [])] if s.get("run_step_times_s")}


def spearman(a: list[float], b: list[float]) -> float:
    if len(a) < 2:
        return 1.0
    return float(pd.Series(a).rank().corr(pd.Series(b).rank()))


def summarize(scores: list[dict]) -> dict:
    errors = np.array([abs(s["error"]) for s in scores])
    pairs: dict[str, dict[str, dict]] = {}
    for s in scores:
        if s["pair"]:
            algo = s["prediction"].report.get("all_to_all") or s["case"].rsplit("-", 1)[-1]
            pairs.setdefault(s["pair"], {})[algo] = s
    speedups = []
    for label, members in sorted(pairs.items()):
        if {"flat", "halo"} <= set(members):
            f, h = members["flat"], members["halo"]
            measured = f["measured_step_s"] / h["measured_step_s"]
            predicted = f["predicted_step_s"] / h["predicted_step_s"]
            speedups.append({"pair": label, "measured": measured, "predicted": predicted,
                             "error": predicted / measured - 1})
    memory = [abs(s["memory_error"]) for s in scores if not np.isnan(s["memory_error"])]
    swaps = order_swaps(scores)
    return {
        "memory_max_error": float(max(memory)) if memory else None,
        "memory_mean_error": float(np.mean(memory)) if memory else None,
        "cases": len(scores), "mape": float(errors.mean()) if len(errors) else 0.0,
        "max_error": float(errors.max()) if len(errors) else 0.0,
        "rank_correlation": spearman([s["predicted_step_s"] for s in scores], [s["measured_step_s"] for s in scores]),
        "same_order": not swaps, "order_swaps": swaps, "measured_order": order_summary(scores, swaps),
        "outside_tolerance": [s["case"] for s in scores if abs(s["error"]) > s["tolerance"]],
        "halo_over_flat": speedups,
        "machine_speed": machine_speed(scores),
        "compute_concurrency": concurrency_summary(scores),
        "pooled": pooled_summary(scores),
    }


def pooled_summary(scores: list[dict]) -> dict | None:
    """The prediction against the median of every round of every kept session of each case (the scored
    session's rounds and its earlier_sessions'), so that no one session's drift decides a case. A second
    view beside the scored run, printed, never the verdict; None unless every case has rounds."""
    pooled = {s["case"]: [t for runs in s.get("measured_sessions", {}).values() for t in runs] for s in scores}
    if not scores or not all(pooled.values()):
        return None
    errors = {s["case"]: s["predicted_step_s"] / float(np.median(pooled[s["case"]])) - 1 for s in scores}
    worst = max(errors, key=lambda c: abs(errors[c]))
    return {"mape": float(np.mean([abs(e) for e in errors.values()])), "max_error": abs(errors[worst]),
            "worst_case": worst, "errors": errors,
            "sessions": max(len(s["measured_sessions"]) for s in scores),
            "rounds_min": min(len(r) for r in pooled.values())}


def concurrency_summary(scores: list[dict]) -> dict | None:
    """Over the cases (each case's steady steps): the mean number of ranks inside a compute task, and the
    share of time with none, predicted and measured (analysis.concurrency); None without them."""
    tables = [s["concurrency"] for s in scores if s.get("concurrency") is not None]
    if not tables:
        return None
    out = {f"{side}_{what}": float(np.mean([fn(t[side]) for t in tables]))
           for side in ("predicted", "measured")
           for what, fn in (("mean_ranks_computing", mean_computing), ("share_none_computing", lambda c: c[0]))}
    # compute tasks with a core to themselves: over the cases whose measurement has CPU per task
    whole = [(s["predicted_uninterrupted_share"], s["measured_uninterrupted_share"]) for s in scores
             if not np.isnan(s.get("measured_uninterrupted_share", np.nan))]
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
    median = float(np.median(measured))
    out = {"preset": preset, "calibrated_s": cal_s, "measured_median_s": median, "measured_min_s": measured[0],
           "measured_max_s": measured[-1], "rounds": len(measured), "ratio": median / cal_s}
    colds = {json.dumps(s["cold_reference"], sort_keys=True) for s in scores if s.get("cold_reference")}
    if len(colds) == 1:
        cold = json.loads(colds.pop())
        times = sorted(t * 1e-6 for t in cold["measured_us_by_run"])
        out["cold"] = {"model": cold["model"], "ranks": cold["ranks"], "tokens": cold["tokens"],
                       "priced_s": cold["priced_s"], "measured_median_s": float(np.median(times)),
                       "measured_min_s": times[0], "measured_max_s": times[-1], "rounds": len(times),
                       "ratio": float(np.median(times)) / cold["priced_s"]}
    return out


def remeasure(cases: list[Case], *, repeats: int = 1, timeout_s: float = 900.0, reference_preset: str = "",
              reference_profile: str | None = None, reference_ranks: int = 2,
              progress: Callable[[str], None] = lambda _msg: None) -> None:
    """Run every case for real `repeats` times (round by round, so a slow phase of the machine does not land
    on one case's runs) and keep, per case, the run whose steady-state step time is the median in measured/;
    measured.json lists every run's step time. With reference_preset, each round starts by timing the
    machine's reference workload (calibrate.sharing.reference_speed, as calibrate times it), kept per run;
    with reference_profile too, also the preset's layer ops cold on reference_ranks ranks, as the framework
    benchmark times them (calibrate --check: cold_reference). A case's previous measurement is replaced
    only once all its runs are done."""
    if repeats < 1:
        raise PiperError(f"validate: --repeats {repeats}: give at least 1")
    for case in cases:
        for old in case.path.glob("measured.run*"):
            shutil.rmtree(old)
    references: list[dict] = []
    session = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    for rep in range(repeats):
        if reference_preset:
            from piper_sim.calibrate.sharing import reference_speed

            progress(f"[run {rep + 1}/{repeats}] timing the machine's reference workload ({reference_preset}) ...")
            references.append(reference_speed(reference_preset))
            if reference_profile is not None:
                references[-1]["cold"] = cold_reference(reference_profile, reference_preset, reference_ranks)
        for i, case in enumerate(cases):
            progress(f"[run {rep + 1}/{repeats}, {i + 1}/{len(cases)}] measuring {case.name} ...")
            _measure_once(case, case.path / f"measured.run{rep}", timeout_s)
    for case in cases:
        runs = [case.path / f"measured.run{rep}" for rep in range(repeats)]
        steps = [step_time(read_trace(run)) for run in runs]
        kept = sorted(range(repeats), key=lambda r: steps[r])[(repeats - 1) // 2]
        info = {"command": f"piper-sim validate {case.name} --remeasure --repeats {repeats}",
                "session": session, "case_digest": case_digest(case),
                "date": _dt.date.today().isoformat(), "machine": platform.platform(),
                "python": platform.python_version(), "testbed": case.testbed,
                "run_step_times_s": [round(t, 9) for t in steps], "kept_run": kept}
        if references:
            info["reference"] = {"preset": references[0]["preset"], "cores": references[0]["cores"],
                                 "cpu_us_per_iteration_by_run": [r["cpu_us_per_iteration"] for r in references]}
            if "cold" in references[0]:
                info["reference"]["cold"] = {**{k: v for k, v in references[0]["cold"].items() if k != "measured_us"},
                                             "measured_us_by_run": [r["cold"]["measured_us"] for r in references]}
        info["earlier_sessions"] = earlier_sessions(case)
        shutil.rmtree(case.measured, ignore_errors=True)
        runs[kept].rename(case.measured)
        (case.measured / "measured.json").write_text(json.dumps(info, indent=2))
        for run in runs:
            shutil.rmtree(run, ignore_errors=True)


def earlier_sessions(case: Case) -> list[dict]:
    """The sessions of the case's current measurement (measured.json: its own and its earlier ones) that
    measured the case as it is now (the same case_digest), newest first: what a new session keeps of them."""
    path = case.measured / "measured.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    keys = ("session", "date", "command", "machine", "case_digest", "run_step_times_s")
    return [{k: s[k] for k in keys if k in s} for s in [old, *old.get("earlier_sessions", [])]
            if s.get("run_step_times_s") and s.get("case_digest") == case_digest(case)]


def calibrated_ranks(profile: str) -> int:
    """How many ranks the profile's calibration ran at once (its machine facts; 1 when not recorded)."""
    from piper_sim.workload.cost import profile_path

    machine = (yaml.safe_load(profile_path(profile).read_text()) or {}).get("machine") or {}
    return int(machine.get("ranks") or 1)


def cold_reference(profile: str, preset: str, ranks: int) -> dict:
    """The preset's one-layer ops (forward + backward each), timed cold on `ranks` ranks at once as calibrate's
    framework benchmark times them (calibrate --check, about 15 s): {model, ranks, tokens, ops, expert_rows
    (of the experts op), measured_us (the sum)}. The cold, memory-bound work is what drifts most on a shared host."""
    from piper_sim.calibrate.crosscheck import crosscheck

    rows = crosscheck(profile, presets=(preset,), ranks=ranks)
    experts = next((r["expert_rows"] for r in rows if r["op"].startswith("experts:")), [])
    return {"model": preset, "ranks": ranks, "tokens": rows[0]["tokens"], "ops": [r["op"] for r in rows],
            "expert_rows": experts, "measured_us": round(sum(r["fwd_s"] + r["bwd_s"] for r in rows) * 1e6, 1)}


def cold_priced_s(profile: str | dict, cold: dict) -> float:
    """The cold reference's ops as the profile prices them (forward + backward, TaskCoster.op_s)."""
    from piper_sim.workload.cost import TaskCoster
    from piper_sim.workload.presets import load_model

    coster = TaskCoster(load_model(cold["model"]), load_profile(profile), int(cold["tokens"]))
    return sum(sum(coster.op_s(op, tuple(cold["expert_rows"]))) for op in cold["ops"])


def _measure_once(case: Case, out: Path, timeout_s: float) -> None:
    """Run the case for real (on its testbed when it names one); keep `piper-sim run`'s files in out."""
    from piper_sim.cli import write_measured_run
    from piper_sim.config import load_config

    raw = json.loads(json.dumps(case.config))
    if isinstance(raw.get("topology"), str) and raw["topology"].endswith(".yaml"):
        raw["topology"] = str((case.path / raw["topology"]).resolve())
    cfg = load_config(raw)
    work = case.path / "measured.tmp"
    shutil.rmtree(work, ignore_errors=True)
    prefix = None
    if case.testbed:
        from piper_sim import testbed

        prefix = "pstv"
        testbed.down(prefix)
        testbed.up((case.path / case.testbed).resolve(), prefix=prefix)
    try:
        write_measured_run(cfg, work, timeout_s=timeout_s, testbed=prefix)
    finally:
        if prefix:
            from piper_sim import testbed

            testbed.down(prefix)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for name in KEEP:
        if (work / name).exists():
            shutil.move(str(work / name), out / name)
    shutil.rmtree(work, ignore_errors=True)
