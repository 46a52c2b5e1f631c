"""Predictions are unchanged by refactors: the 15 validation cases (cpu-2rank) and shipped configs with the
GPU profiles, against tests/golden/predictions.json (regenerate with `python tests/golden/predictions.py`
only when a change of the model is intended, and say so in the commit)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "golden"))
import predictions  # noqa: E402

STORED = json.loads(predictions.STORE.read_text())


def same(predicted: dict, stored: dict) -> None:
    """Discrete fields equal; every float within 1e-9 of the stored one (tests/golden/predictions.py says why)."""
    assert predicted.keys() == stored.keys()
    for name, entry in stored.items():
        got = predicted[name]
        assert got["num_tasks"] == entry["num_tasks"], name
        assert got["trace"]["rows_sha256"] == entry["trace"]["rows_sha256"], name
        floats, got_floats = flat_floats(entry), flat_floats(got)
        assert got_floats.keys() == floats.keys(), name
        assert got_floats == pytest.approx(floats, rel=1e-9, abs=1e-15), name


def flat_floats(entry: dict) -> dict:
    """The entry's floats by name, a list's items one by one (pytest.approx compares a list inside a mapping
    exactly, not within the tolerance)."""
    named = {
        "step_time_s": entry["step_time_s"],
        "mfu": entry["mfu"],
        "peak_memory_bytes": entry["peak_memory_bytes"],
        **entry["trace"]["float_sums"],
    }
    out = {}
    for key, value in named.items():
        for i, item in enumerate(value if isinstance(value, list) else [value]):
            out[f"{key}[{i}]"] = item
    return out


def test_validation_predictions_are_unchanged():
    same(predictions.validation_predictions(), STORED["validation"])


@pytest.mark.parametrize("name", sorted(STORED["gpu"]))
def test_gpu_profile_predictions_are_unchanged(name):
    same(predictions.gpu_predictions([name]), {name: STORED["gpu"][name]})


def test_a_changed_row_is_seen():
    """The fingerprint sees one task 1e-6 later, and two tasks' times swapped."""
    import pandas as pd

    trace = pd.DataFrame(
        {
            "step": [0, 0, 0],
            "rank": [0, 0, 1],
            "task_id": ["a", "b", "a"],
            "start_s": [0.0, 1.0, 2.0],
            "end_s": [1.0, 2.0, 3.0],
        }
    )
    base = predictions.trace_fingerprint(trace)["float_sums"]
    later = trace.assign(end_s=[1.0, 2.000001, 3.0])
    swapped = trace.assign(end_s=[2.0, 1.0, 3.0])
    for changed in (later, swapped):
        assert predictions.trace_fingerprint(changed)["float_sums"] != pytest.approx(base, rel=1e-9)
