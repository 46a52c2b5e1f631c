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


def test_validation_predictions_are_unchanged():
    assert predictions.validation_predictions() == STORED["validation"]


@pytest.mark.parametrize("name", sorted(STORED["gpu"]))
def test_gpu_profile_predictions_are_unchanged(name):
    assert predictions.gpu_predictions([name]) == {name: STORED["gpu"][name]}
