"""Stored predictions that refactors must not change: the 15 validation cases with their calibrated
CPU profile, and shipped configs with the GPU profiles (mi250x, h100).

`python tests/golden/predictions.py` rewrites predictions.json from the current code; tests/test_golden.py
compares against it. Each entry holds the predicted step time, report figures and a fingerprint of the whole
trace (every column, every row: trace_fingerprint), so any change in any task's timing shows.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
STORE = HERE / "predictions.json"
VALIDATION_PROFILE = "cpu-2rank"
# shipped configs priced with the GPU profiles: (name, example, overrides)
GPU_CASES = (
    ("small-moe-mi250x", "small-moe", ["cost.profile=mi250x"]),
    ("small-moe-h100-halo", "small-moe", ["cost.profile=h100", "collectives.all_to_all=halo"]),
    (
        "small-moe-mi250x-frontier-zipf",
        "small-moe",
        ["cost.profile=mi250x", "topology=frontier", "routing.kind=zipf", "routing.exponent=1.0", "schedule=zb-h1"],
    ),
)


def trace_fingerprint(trace: pd.DataFrame) -> dict:
    """Every row's discrete fields (digest, rows in (step, rank, task) order) and two sums of every float column
    (plain and with fixed per-row weights, so that a change of one row's value shows). Floats are compared
    within a relative tolerance: the same code on another CPU rounds sums in another order (numpy's SIMD
    reductions), which moves times by about 1e-16 and can order tied events differently."""
    frame = trace.reset_index(drop=True).copy()
    for col in frame.columns:
        if isinstance(frame[col].dtype, pd.CategoricalDtype):
            frame[col] = frame[col].astype(str)
    frame = frame.sort_values(["step", "rank", "task_id"], kind="stable").reset_index(drop=True)
    floats = [c for c in frame.columns if frame[c].dtype.kind == "f"]
    weight = 1.0 + (np.arange(len(frame)) * 2654435761 % 1009) / 1009.0
    return {
        "rows_sha256": hashlib.sha256(frame.drop(columns=floats).to_csv(index=False).encode()).hexdigest(),
        "float_sums": {c: [float(frame[c].sum()), float((frame[c] * weight).sum())] for c in floats},
    }


def summary(result) -> dict:
    r = result.report
    return {
        "step_time_s": r.step_time_s,
        "mfu": r.mfu,
        "peak_memory_bytes": r.peak_memory_bytes,
        "num_tasks": len(result.trace),
        "trace": trace_fingerprint(result.trace),
    }


def validation_predictions() -> dict:
    from piper_sim.paths import data_dir
    from piper_sim.validation.cases import find_cases, predict_case

    return {
        case.name: summary(predict_case(case, VALIDATION_PROFILE))
        for case in find_cases([], data_dir("validation") / "cases")
    }


def gpu_predictions(names: list[str] | None = None) -> dict:
    from piper_sim.config import load_config
    from piper_sim.paths import config_path
    from piper_sim.simulator import simulate

    return {
        name: summary(simulate(load_config(config_path(example), overrides)))
        for name, example, overrides in GPU_CASES
        if names is None or name in names
    }


def compute() -> dict:
    return {"validation": validation_predictions(), "gpu": gpu_predictions()}


if __name__ == "__main__":
    STORE.write_text(json.dumps(compute(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {STORE}", file=sys.stderr)
