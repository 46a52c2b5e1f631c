"""Measuring validation cases for real: `piper-sim validate --remeasure`.

Owns running every case on the testbed (or as plain local ranks) round by round, keeping the run with the
median step time in the case's measured/, and measured.json: every run's step time, the machine
references timed with each round, and the rounds of the earlier measurements of the case as it is now
(case_digest). Must not import torch: the real runs go through the measuring backend's entry point
(measure.measure, which loads torch only in the ranks it launches) and the machine references through
calibrate's (calibrate.reference_speed.reference_speed, calibrate.crosscheck), which load it only while timing.
"""

from __future__ import annotations

import datetime as _dt
import json
import platform
import shutil
from collections.abc import Callable
from pathlib import Path

import yaml

from piper_sim import testbed
from piper_sim.calibrate.crosscheck import crosscheck
from piper_sim.calibrate.reference_speed import reference_speed
from piper_sim.config import load_config
from piper_sim.errors import PiperError
from piper_sim.measure import measure
from piper_sim.outputs import write_run
from piper_sim.trace.runtrace import read_trace
from piper_sim.validation.cases import Case, case_config, case_digest
from piper_sim.validation.scoring import step_time
from piper_sim.workload.profile_file import profile_path

KEEP = ("report.json", "config.yaml", "routing.npz", "trace.parquet", "trace.csv")
TESTBED_PREFIX = "pstv"


def remeasure(
    cases: list[Case],
    *,
    repeats: int = 1,
    timeout_s: float = 900.0,
    reference_preset: str = "",
    reference_profile: str | None = None,
    reference_ranks: int = 2,
    progress: Callable[[str], None] = lambda _msg: None,
) -> None:
    """Run every case for real `repeats` times (round by round, so a slow phase of the machine does not land
    on one case's runs) and keep, per case, the run whose steady-state step time is the median in measured/;
    measured.json lists every run's step time. With reference_preset, each round starts by timing the
    machine's reference workload (calibrate.reference_speed.reference_speed, as calibrate times it), kept per run;
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
            progress(f"[run {rep + 1}/{repeats}] timing the machine's reference workload ({reference_preset}) ...")
            references.append(_reference_round(reference_preset, reference_profile, reference_ranks))
        for i, case in enumerate(cases):
            progress(f"[run {rep + 1}/{repeats}, {i + 1}/{len(cases)}] measuring {case.name} ...")
            _measure_once(case, case.path / f"measured.run{rep}", timeout_s)
    for case in cases:
        _keep_median_run(case, repeats, session, references)


def _reference_round(preset: str, profile: str | None, ranks: int) -> dict:
    """The machine's reference workload timed once (and, with a profile, the cold reference too)."""
    reference = reference_speed(preset)
    if profile is not None:
        reference["cold"] = cold_reference(profile, preset, ranks)
    return reference


def _keep_median_run(case: Case, repeats: int, session: str, references: list[dict]) -> None:
    """Move the case's run with the median step time to measured/ with its measured.json; drop the others."""
    runs = [case.path / f"measured.run{rep}" for rep in range(repeats)]
    steps = [step_time(read_trace(run)) for run in runs]
    kept = sorted(range(repeats), key=lambda r: steps[r])[(repeats - 1) // 2]
    info = {
        "command": f"piper-sim validate {case.name} --remeasure --repeats {repeats}",
        "session": session,
        "case_digest": case_digest(case),
        "date": _dt.date.today().isoformat(),
        "machine": platform.platform(),
        "python": platform.python_version(),
        "testbed": case.testbed,
        "run_step_times_s": [round(t, 9) for t in steps],
        "kept_run": kept,
    }
    if references:
        info["reference"] = _reference_record(references)
    info["earlier_sessions"] = earlier_sessions(case)
    shutil.rmtree(case.measured, ignore_errors=True)
    runs[kept].rename(case.measured)
    (case.measured / "measured.json").write_text(json.dumps(info, indent=2))
    for run in runs:
        shutil.rmtree(run, ignore_errors=True)


def _reference_record(references: list[dict]) -> dict:
    """measured.json's reference: the preset and each round's time (and the cold reference's)."""
    record = {
        "preset": references[0]["preset"],
        "cores": references[0]["cores"],
        "cpu_us_per_iteration_by_run": [r["cpu_us_per_iteration"] for r in references],
    }
    if "cold" in references[0]:
        record["cold"] = {
            **{k: v for k, v in references[0]["cold"].items() if k != "measured_us"},
            "measured_us_by_run": [r["cold"]["measured_us"] for r in references],
        }
    return record


def earlier_sessions(case: Case) -> list[dict]:
    """The measurements in the case's measured.json (its own and its earlier ones) that measured the case as
    it is now (the same case_digest), newest first: what a new measurement keeps of them."""
    path = case.measured / "measured.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    keys = ("session", "date", "command", "machine", "case_digest", "run_step_times_s")
    return [
        {k: s[k] for k in keys if k in s}
        for s in [old, *old.get("earlier_sessions", [])]
        if s.get("run_step_times_s") and s.get("case_digest") == case_digest(case)
    ]


def calibrated_ranks(profile: str) -> int:
    """How many ranks the profile's calibration ran at once (its machine facts; 1 when not recorded)."""
    machine = (yaml.safe_load(profile_path(profile).read_text()) or {}).get("machine") or {}
    return int(machine.get("ranks") or 1)


def cold_reference(profile: str, preset: str, ranks: int) -> dict:
    """The preset's one-layer ops (forward + backward each), timed cold on `ranks` ranks at once as calibrate's
    framework benchmark times them (calibrate --check, about 15 s): {model, ranks, tokens, ops, expert_rows
    (of the experts op), measured_us (the sum)}. The cold, memory-bound work is what drifts most on a shared host."""
    rows = crosscheck(profile, presets=(preset,), ranks=ranks)
    experts = next((r["expert_rows"] for r in rows if r["op"].startswith("experts:")), [])
    return {
        "model": preset,
        "ranks": ranks,
        "tokens": rows[0]["tokens"],
        "ops": [r["op"] for r in rows],
        "expert_rows": experts,
        "measured_us": round(sum(r["fwd_s"] + r["bwd_s"] for r in rows) * 1e6, 1),
    }


def _measure_once(case: Case, out: Path, timeout_s: float) -> None:
    """Run the case for real (on its testbed when it names one); keep `piper-sim run`'s files in out."""
    cfg = load_config(case_config(case))
    work = case.path / "measured.tmp"
    shutil.rmtree(work, ignore_errors=True)
    prefix = None
    if case.testbed:
        prefix = TESTBED_PREFIX
        testbed.down(prefix)
        testbed.up((case.path / case.testbed).resolve(), prefix=prefix)
    try:
        write_run(work, measure(cfg, work, timeout_s=timeout_s, testbed=prefix))
    finally:
        if prefix:
            testbed.down(prefix)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for name in KEEP:
        if (work / name).exists():
            shutil.move(str(work / name), out / name)
    shutil.rmtree(work, ignore_errors=True)
