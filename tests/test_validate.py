"""`piper-sim validate` on stored measurements; the summary's statistics on known numbers."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from piper_sim.analysis.validation import spearman, summarize
from piper_sim.cli import main


def test_validate_scores_a_stored_case(tmp_path, capsys):
    code = main(["validate", "flat-1f1b-pp2ep4-flat", "2g-1f1b-pp2ep4-flat", "--profile", "cpu-2rank",
                 "--out", str(tmp_path)])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["cases"] == 2
    assert code == (1 if summary["outside_tolerance"] else 0)
    table = pd.read_csv(tmp_path / "validation.csv")
    assert (table["measured_step_s"] > 0).all() and (table["predicted_step_s"] > 0).all()
    assert "MAPE" in capsys.readouterr().out


def _score(case, pred, meas, pair=""):
    return {"case": case, "pair": pair, "predicted_step_s": pred, "measured_step_s": meas, "error": pred / meas - 1,
            "tolerance": 0.2, "memory_error": float("nan"), "prediction": type("R", (), {"report": {}})()}


def test_summary_statistics():
    scores = [_score("a-flat", 1.1, 1.0, "p"), _score("a-halo", 0.9, 1.0, "p"), _score("b", 3.0, 2.0)]
    s = summarize(scores)
    assert s["mape"] == pytest.approx((0.1 + 0.1 + 0.5) / 3)
    assert s["max_error"] == pytest.approx(0.5)
    assert s["outside_tolerance"] == ["b"]
    (pair,) = s["halo_over_flat"]
    assert pair["measured"] == pytest.approx(1.0) and pair["predicted"] == pytest.approx(1.1 / 0.9)
    assert spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert spearman([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)


def test_cases_out_of_order_are_listed_with_their_measured_gap():
    scores = [_score("x", 1.05, 1.00), _score("y", 1.00, 1.02), _score("z", 2.0, 3.0)]
    s = summarize(scores)
    assert s["same_order"] is False
    (swap,) = s["order_swaps"]
    assert (swap["faster"], swap["slower"]) == ("x", "y") and swap["measured_gap"] == pytest.approx(0.02)
    in_order = summarize([_score("x", 1.0, 1.0), _score("y", 1.1, 1.02)])
    assert in_order["same_order"] is True and in_order["order_swaps"] == []
