"""The error band: the nearest family's published residuals, widened family by family, and its leave-one-family-out
check (analysis/band.py)."""

from __future__ import annotations

import pandas as pd
import pytest

from piper_sim.analysis.band import (
    Family,
    band_from,
    error_band,
    family_of,
    leave_one_family_out,
    scale_of,
)
from piper_sim.config import load_config


def _scored(rows: list[tuple[str, float, str, bool, str]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["name", "error", "hardware", "moe", "scale"])


SCORED = _scored(
    [
        ("a", -0.10, "a100", False, "<=64 GPUs"),
        ("b", 0.05, "a100", False, "<=64 GPUs"),
        ("c", -0.20, "a100", False, "<=64 GPUs"),
        ("d", -0.30, "mi250x", True, "65-512 GPUs"),
        ("e", -0.25, "mi250x", True, "65-512 GPUs"),
        ("f", -0.40, "mi250x", True, "<=64 GPUs"),
        ("g", 0.25, "h100", True, "65-512 GPUs"),
    ]
)


def test_the_band_is_the_measured_over_predicted_range_of_the_nearest_family():
    band = band_from(Family("a100", False, "<=64 GPUs"), SCORED, "des")
    assert band.runs == 3 and band.family == "a100 dense <=64 GPUs"
    # predicted 10% fast -> measured 1/0.9 - 1 = +11.1% of the prediction; 20% fast -> +25%; 5% slow -> -4.8%
    assert band.low == pytest.approx(1 / 1.05 - 1) and band.high == pytest.approx(1 / 0.8 - 1)


def test_a_family_with_too_few_runs_widens_to_its_hardware_then_to_every_run():
    by_hardware = band_from(Family("mi250x", True, ">512 GPUs"), SCORED, "des")  # no run at that scale
    assert by_hardware.family == "mi250x MoE" and by_hardware.runs == 3
    assert by_hardware.low == pytest.approx(1 / 0.75 - 1) and by_hardware.high == pytest.approx(1 / 0.6 - 1)
    everything = band_from(Family("h100", True, "65-512 GPUs"), SCORED, "des")  # one h100 run only
    assert everything.runs == len(SCORED) and everything.family == "every published run"
    assert band_from(Family("h100", True, "<=64 GPUs"), SCORED.iloc[:0], "des") is None


def test_leave_one_family_out_never_uses_the_runs_own_family():
    table = leave_one_family_out(SCORED, "des").set_index("name")
    # the a100 dense runs fall back to every other run: -0.40 .. +0.25 errors -> band -20% .. +66.7%
    assert table.loc["a", "band_low"] == pytest.approx(1 / 1.25 - 1)
    assert table.loc["a", "band_high"] == pytest.approx(1 / 0.6 - 1)
    assert bool(table.loc["a", "covered"])
    # the h100 run is 25% slow (measured -20% of the prediction): the others' band starts at 1/1.05 - 1 = -4.8%
    assert not bool(table.loc["g", "covered"])


def test_a_config_family_reads_the_profiles_device_and_whether_any_layer_is_moe():
    moe = load_config(
        {"model": "x-moe-small", "topology": "frontier", "parallel": {"pp": 2, "ep": 4, "num_microbatches": 4}}
    )
    assert family_of(moe) == Family("mi250x", True, "<=64 GPUs")
    assert scale_of(64) == "<=64 GPUs" and scale_of(65) == "65-512 GPUs" and scale_of(513) == ">512 GPUs"


def test_the_shipped_scores_give_a_band_for_a_frontier_moe_config():
    cfg = load_config(
        {"model": "x-moe-small", "topology": "frontier", "parallel": {"pp": 2, "ep": 4, "num_microbatches": 4}}
    )
    band = error_band(cfg, "des")
    assert band is not None and band.family.startswith("mi250x MoE") and band.runs >= 3
    assert band.low <= band.high and band.low > 0  # every X-MoE run is predicted fast: measured slower


def test_validate_published_reports_each_family_apart():
    from piper_sim.validation.published import band_coverage, family_summary

    scores = [
        {"name": n, "error": e, "hardware": h, "moe": m, "scale": s, "tier": "des"}
        for n, e, h, m, s in SCORED.itertuples(index=False)
    ]
    rows = {r["family"]: r for r in family_summary(scores)}
    assert rows["a100 dense"]["runs"] == 3 and rows["a100 dense"]["mape"] == pytest.approx((0.10 + 0.05 + 0.20) / 3)
    assert rows["a100 dense"]["mean_signed"] == pytest.approx(-0.25 / 3)
    assert rows["mi250x MoE"]["worst"] == "f" and rows["mi250x MoE 65-512 GPUs"]["runs"] == 2
    coverage = band_coverage(scores)
    assert list(coverage["name"]) == list(SCORED["name"]) and coverage["covered"].dtype == bool


def test_simulate_and_its_estimate_tier_write_the_error_band_into_report_json(tmp_path):
    import json

    from piper_sim.cli import main

    for tier in ("des", "estimate"):
        out = tmp_path / tier
        assert main(["simulate", "x-moe-small-frontier", "--tier", tier, "--out", str(out)]) == 0
        band = json.loads((out / "report.json").read_text())["error_band"]
        assert band["tier"] == tier and band["family"].startswith("mi250x MoE") and band["runs"] >= 3
        assert band["low"] <= band["high"]
