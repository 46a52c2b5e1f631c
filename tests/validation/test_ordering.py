"""The order of validation cases as their measurement sessions establish it."""

from __future__ import annotations

import pandas as pd
import pytest

from piper_sim.validation.ordering import measured_order, shared_rounds
from piper_sim.validation.report import format_validation
from piper_sim.validation.summary import summarize


def test_a_pair_is_ordered_when_one_case_was_faster_in_every_shared_round():
    a = {"s1": [1.0, 1.3, 1.1], "s2": [0.9, 1.0]}
    b = {"s1": [1.1, 1.4, 1.2], "s2": [1.0, 1.1]}
    assert shared_rounds(a, b) == ([(1.0, 1.1), (1.3, 1.4), (1.1, 1.2), (0.9, 1.0), (1.0, 1.1)], 2)
    assert measured_order(a, b) == -1 and measured_order(b, a) == 1  # runs overlap (1.3 > 1.1), rounds agree
    b["s2"] = [0.85, 1.1]  # the second session ran b faster once: the measurement no longer orders them
    assert measured_order(a, b) == 0


def test_sessions_that_do_not_pair_fall_back_to_every_run_against_every_run():
    a, b = {"s1": [1.0, 1.1]}, {"s2": [1.2, 1.3]}  # measured in different sessions: no shared round
    assert shared_rounds(a, b) == ([], 0)
    assert measured_order(a, b) == -1
    b = {"s2": [1.05, 1.3]}
    assert measured_order(a, b) == 0
    # the same session id with a different number of rounds is not one remeasure call: not paired either
    assert shared_rounds({"s": [1.0, 1.1]}, {"s": [1.2]}) == ([], 0)
    assert measured_order({"s": [1.0]}, {}) == 0  # nothing measured: nothing ordered


def _score(case, pred, meas, sessions):
    return {
        "case": case,
        "pair": "",
        "predicted_step_s": pred,
        "measured_step_s": meas,
        "error": pred / meas - 1,
        "tolerance": 0.2,
        "memory_error": float("nan"),
        "measured_runs_s": sessions["now"],
        "measured_sessions": sessions,
        "prediction": type("R", (), {"report": {}})(),
        "phases": pd.DataFrame({"predicted_s": [1.0], "measured_s": [1.0], "error": [0.0]}, index=["forward"]),
    }


def test_the_summary_holds_the_prediction_to_the_pairs_the_measurement_orders():
    # x and y swap between sessions; z is slower than both in every round
    x = _score("x", 1.05, 1.00, {"now": [0.98, 1.00, 1.02], "then": [1.06, 1.08]})
    y = _score("y", 1.00, 1.03, {"now": [1.01, 1.03, 1.05], "then": [1.02, 1.04]})
    z = _score("z", 1.50, 1.50, {"now": [1.40, 1.50, 1.60], "then": [1.45, 1.55]})
    s = summarize([x, y, z])
    assert s["same_order"] is False  # strict: the medians put x before y, the prediction y before x
    (swap,) = s["order_swaps"]
    assert (swap["faster"], swap["slower"], swap["ordered"]) == ("x", "y", False)
    assert swap["rounds_faster"] == [3, 5] and swap["sessions"] == 2
    order = s["measured_order"]
    assert order == {"pairs": 3, "ordered_pairs": 2, "swapped": [], "same": True, "sessions": 2}
    text = format_validation([x, y, z], s)
    assert "(faster in 3 of 5 rounds of 2 sessions; their runs overlap)" in text
    assert "2 of 3 pairs of cases ordered by the measurement" in text and "same measured order: True" in text
    z["predicted_step_s"] = 0.9  # now the prediction puts z first, against every round
    s = summarize([x, y, z])
    assert s["measured_order"]["same"] is False
    assert sorted(s["measured_order"]["swapped"]) == ["x < z", "y < z"]
    assert "ORDERED BY THE MEASUREMENT" in format_validation([x, y, z], s)


def test_the_pooled_view_scores_each_case_against_the_median_of_every_round_of_every_session():
    x = _score("x", 1.20, 1.00, {"now": [0.98, 1.00, 1.02], "then": [1.10, 1.12]})  # median of all five: 1.02
    y = _score("y", 1.00, 1.03, {"now": [1.01, 1.03, 1.05], "then": [1.02, 1.04]})  # 1.03
    s = summarize([x, y])
    pooled = s["pooled"]
    assert pooled["errors"]["x"] == 1.20 / 1.02 - 1 and pooled["errors"]["y"] == 1.00 / 1.03 - 1
    assert (pooled["worst_case"], pooled["sessions"], pooled["rounds_min"]) == ("x", 2, 5)
    assert pooled["mape"] == (abs(1.20 / 1.02 - 1) + abs(1.00 / 1.03 - 1)) / 2
    assert s["max_error"] == pytest.approx(0.2)  # the scored run's verdict is unchanged by the pooled view
    assert "MAPE 10.3%   max error 17.6% (x +17.6%)" in format_validation([x, y], s)
    y["measured_sessions"] = {}  # a case without recorded rounds: no pooled view at all
    assert summarize([x, y])["pooled"] is None
