"""`piper-sim validate` on stored measurements; the summary's statistics on known numbers."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pandas as pd
import pytest

from piper_sim import progress
from piper_sim.analysis.ranking import spearman
from piper_sim.cli import main
from piper_sim.collectives.algorithms import CollectiveChoice
from piper_sim.validation.report import format_validation
from piper_sim.validation.summary import summarize


def test_validate_scores_a_stored_case(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(progress.ENV, "1")  # the progress line of cases done, forced on and drawn at once
    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    code = main(
        ["validate", "flat-1f1b-pp2ep4-flat", "2g-1f1b-pp2ep4-flat", "--profile", "cpu-2rank", "--out", str(tmp_path)]
    )
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["cases"] == 2
    assert code == (1 if summary["outside_tolerance"] else 0)
    table = pd.read_csv(tmp_path / "validation.csv")
    assert (table["measured_step_s"] > 0).all() and (table["predicted_step_s"] > 0).all()
    captured = capsys.readouterr()
    assert "MAPE" in captured.out
    err = captured.err.replace("\r", "\n")
    assert "[2/2] predicting 2g-1f1b-pp2ep4-flat" in err and "validate: 2/2 cases" in err
    shares = pd.read_csv(tmp_path / "concurrency.csv").groupby("case")[["predicted_share", "measured_share"]].sum()
    assert len(shares) == 2 and (shares - 1).abs().max().max() < 1e-9  # each case's span, covered once
    assert 0 < summary["compute_concurrency"]["measured_mean_ranks_computing"] <= 8
    # the stored runs carry CPU per task: the share of compute tasks with a core to themselves, both sides
    conc = summary["compute_concurrency"]
    assert 0 < conc["measured_share_uninterrupted"] < 1 and 0 <= conc["predicted_share_uninterrupted"] <= 1
    assert table["measured_uninterrupted_share"].between(0, 1).all()


def _score(case, pred, meas, pair=""):
    return {
        "case": case,
        "pair": pair,
        "predicted_step_s": pred,
        "measured_step_s": meas,
        "error": pred / meas - 1,
        "tolerance": 0.2,
        "memory_error": float("nan"),
        "prediction": SimpleNamespace(
            config=SimpleNamespace(collectives=CollectiveChoice(all_to_all=case.rsplit("-", 1)[-1]))
        ),
    }


def _phases():
    return pd.DataFrame({"predicted_s": [1.0], "measured_s": [1.0], "error": [0.0]}, index=["forward"])


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
    assert swap["runs_overlap"] is False  # run once each: nothing says the measurement cannot order them
    in_order = summarize([_score("x", 1.0, 1.0), _score("y", 1.1, 1.02)])
    assert in_order["same_order"] is True and in_order["order_swaps"] == []


def test_a_swap_of_cases_whose_runs_overlap_is_marked_and_counted():
    x, y = _score("x", 1.05, 1.00), _score("y", 1.00, 1.02)
    x["measured_runs_s"], y["measured_runs_s"] = [0.95, 1.00, 1.04], [0.99, 1.02, 1.06]  # 1.04 >= 0.99
    s = summarize([x, y])
    assert s["same_order"] is False and s["order_swaps"][0]["runs_overlap"] is True
    y["measured_runs_s"] = [1.01, 1.02, 1.06]  # x's slowest run (1.04) slower than y's fastest: still overlap
    assert summarize([x, y])["order_swaps"][0]["runs_overlap"] is True
    y["measured_runs_s"] = [1.045, 1.05, 1.06]  # every run of y slower than every run of x
    s = summarize([x, y])
    assert s["order_swaps"][0]["runs_overlap"] is False
    assert "1 of 1 swapped pairs were measured apart" in format_validation(
        [dict(x, phases=_phases()), dict(y, phases=_phases())], s
    )


def test_a_swap_counts_the_rounds_in_which_the_faster_case_ran_faster():
    x, y = _score("x", 1.05, 1.00), _score("y", 1.00, 1.02)
    # round 2 was slow for both: x's runs overlap y's, but x was faster in every round
    x["measured_runs_s"], y["measured_runs_s"] = [0.98, 1.20, 1.00], [1.00, 1.25, 1.02]
    (swap,) = summarize([x, y])["order_swaps"]
    assert swap["runs_overlap"] is True and swap["rounds_faster"] == [3, 3]
    y["measured_runs_s"] = [0.97, 1.25, 1.02]
    s = summarize([x, y])
    assert s["order_swaps"][0]["rounds_faster"] == [2, 3]
    assert "(faster in 2 of 3 rounds; their runs overlap)" in format_validation(
        [dict(x, phases=_phases()), dict(y, phases=_phases())], s
    )
    y["measured_runs_s"] = [1.02, 1.03]  # not the same rounds: no pairing
    assert summarize([x, y])["order_swaps"][0]["rounds_faster"] is None


@pytest.mark.slow  # measures validation cases on the testbed several times (about 5 minutes)
def test_remeasure_runs_each_case_repeatedly_and_keeps_the_median_run(tmp_path):
    # a real local run (no testbed, no root): pp1 x ep2 of a 2-layer tiny-moe, 3 steps, twice
    from piper_sim.errors import PiperError
    from piper_sim.trace.runtrace import read_trace
    from piper_sim.validation.cases import load_case
    from piper_sim.validation.remeasure import earlier_sessions, remeasure
    from piper_sim.validation.scoring import score_case, step_time

    case_dir = tmp_path / "local-pp1ep2"
    case_dir.mkdir()
    config = {
        "model": {"preset": "tiny-moe", "num_layers": 2, "seq_len": 32},
        "parallel": {"pp": 1, "ep": 2, "num_microbatches": 2, "micro_batch_size": 1},
        "sim": {"steps": 3},
    }
    (case_dir / "case.yaml").write_text(json.dumps({"description": "local", "config": config}))
    case = load_case(case_dir)
    messages = []
    remeasure(
        [case],
        repeats=2,
        reference_preset="tiny-moe",
        reference_profile="cpu-2rank",
        reference_ranks=2,
        progress=messages.append,
    )
    assert messages == [
        "[run 1/2] timing the machine's reference workload (tiny-moe) ...",
        "[run 1/2, 1/1] measuring local-pp1ep2 ...",
        "[run 2/2] timing the machine's reference workload (tiny-moe) ...",
        "[run 2/2, 1/1] measuring local-pp1ep2 ...",
    ]
    info = json.loads((case.measured / "measured.json").read_text())
    reference = info["reference"]
    assert reference["preset"] == "tiny-moe" and len(reference["cpu_us_per_iteration_by_run"]) == 2
    assert all(t > 0 for t in reference["cpu_us_per_iteration_by_run"])
    cold = reference["cold"]  # the layer's ops timed cold on 2 ranks, each round
    assert cold["model"] == "tiny-moe" and cold["ranks"] == 2 and "experts:0" in cold["ops"]
    assert len(cold["measured_us_by_run"]) == 2 and all(t > 0 for t in cold["measured_us_by_run"])
    assert sum(cold["expert_rows"]) == cold["tokens"] * 2  # every token's top-2 rows reached an expert
    runs = info["run_step_times_s"]
    assert len(runs) == 2 and all(t > 0 for t in runs)
    assert step_time(read_trace(case.measured)) == pytest.approx(min(runs), rel=1e-5)  # the lower median of two
    assert runs[info["kept_run"]] == min(runs)
    assert sorted(p.name for p in case_dir.iterdir()) == ["case.yaml", "measured"]  # no run left behind
    score = score_case(case, "cpu-2rank")
    assert score["measured_runs_s"] == runs and score["measured_spread"] == pytest.approx(max(runs) / min(runs) - 1)
    speed = summarize([score])["machine_speed"]  # cpu-2rank timed the same workload when it was calibrated
    assert speed["preset"] == "tiny-moe" and speed["rounds"] == 2
    assert speed["ratio"] == pytest.approx(speed["measured_median_s"] / speed["calibrated_s"])
    assert speed["cold"]["priced_s"] > 0 and speed["cold"]["rounds"] == 2
    assert speed["cold"]["ratio"] == pytest.approx(speed["cold"]["measured_median_s"] / speed["cold"]["priced_s"])
    # a second session keeps the first one's rounds, by session id, for the measured order of cases
    first = info["session"]
    remeasure([case], repeats=1)
    again = json.loads((case.measured / "measured.json").read_text())
    assert again["session"] >= first and again["case_digest"] == info["case_digest"]
    assert [(s["session"], s["run_step_times_s"]) for s in again["earlier_sessions"]] == [(first, runs)]
    assert score_case(case, "cpu-2rank")["measured_sessions"] == {
        again["session"]: again["run_step_times_s"],
        first: runs,
    }
    # a case whose config changed since: its measurement is refused, and a new session drops the old rounds
    config["sim"]["steps"] = 4
    (case_dir / "case.yaml").write_text(json.dumps({"description": "local", "config": config}))
    changed = load_case(case_dir)
    with pytest.raises(PiperError, match="changed .* since it was measured; measure it again with --remeasure"):
        score_case(changed, "cpu-2rank")
    assert earlier_sessions(changed) == []


def test_machine_speed_compares_the_rounds_reference_with_the_profiles():
    x, y = _score("x", 1.0, 1.0), _score("y", 1.0, 1.0)
    for s in (x, y):
        s.update(
            calibrated_reference_s=5e-3,
            calibrated_reference_preset="tiny-moe",
            reference_preset="tiny-moe",
            measured_reference_s=[5.5e-3, 6.5e-3, 6.0e-3],
            phases=_phases(),
        )
    summary = summarize([x, y])
    speed = summary["machine_speed"]
    assert speed["rounds"] == 3 and speed["ratio"] == pytest.approx(1.2)
    assert (speed["measured_min_s"], speed["measured_max_s"]) == (5.5e-3, 6.5e-3)
    assert "5000 us at calibration, 6000 us during the measurement (median of 3 rounds, 5500-6500): +20%" in (
        format_validation([x, y], summary)
    )
    cold = {
        "model": "tiny-moe",
        "ranks": 2,
        "tokens": 128,
        "ops": ["attn:0"],
        "expert_rows": [],
        "measured_us_by_run": [900.0, 1100.0, 1000.0],
        "priced_s": 800e-6,
    }
    x["cold_reference"] = y["cold_reference"] = cold
    summary = summarize([x, y])
    assert summary["machine_speed"]["cold"]["ratio"] == pytest.approx(1.25)
    text = format_validation([x, y], summary)
    assert (
        "cold reference (tiny-moe layer ops, forward + backward, cold on 2 ranks, 128 tokens): priced 800 us "
        "by the profile, measured 1000 us (median of 3 rounds, 900-1100): +25%"
    ) in text
    y["reference_preset"] = x["reference_preset"] = "small-moe"  # another workload: not comparable
    assert summarize([x, y])["machine_speed"] is None
    assert summarize([_score("z", 1.0, 1.0)])["machine_speed"] is None  # measured without the reference


def test_repeats_must_be_positive(tmp_path):
    from piper_sim.errors import PiperError
    from piper_sim.validation.cases import load_case
    from piper_sim.validation.remeasure import remeasure

    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "case.yaml").write_text(json.dumps({"config": {"model": "tiny-moe"}}))
    with pytest.raises(PiperError, match="--repeats 0"):
        remeasure([load_case(tmp_path / "c")], repeats=0)
