"""steady_state.simulate_figures: a long pipeline's figures from short runs equal those of its full run."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import yaml

from piper_sim import steady_state
from piper_sim.analysis.budget import trace_budget
from piper_sim.cli import main
from piper_sim.config import load_config
from piper_sim.schedule.build import build_schedule
from piper_sim.simulator import check_wall, simulate
from piper_sim.steady_state import NEAR_TOLERANCE, affine, expected_wall_s, near_affine, simulate_figures

FIGURES = (
    "step_time_s",
    "tokens_per_step",
    "tokens_per_s",
    "model_flops_per_step",
    "tflops_per_gpu",
    "mfu",
    "hfu",
    "compute_fraction",
    "bubble_fraction",
    "exposed_comm_fraction",
    "all_to_all_bandwidth_bytes_per_s",
)


@pytest.fixture
def always_short(monkeypatch):
    """Short runs even where the full run is quick (these cases simulate in well under FULL_WALL_S)."""
    monkeypatch.setattr(steady_state, "FULL_WALL_S", 0.0)


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def _assert_same(cfg) -> list[int]:
    """simulate_figures against the full simulation of cfg: every report figure, the memory, the busiest link and
    the budget; returns the counts simulated."""
    steady, full = simulate_figures(cfg), simulate(cfg)
    got, want = steady.report, full.report
    for name in FIGURES:
        assert _close(getattr(got, name), getattr(want, name)), (name, getattr(got, name), getattr(want, name))
    assert all(_close(a, b) for a, b in zip(got.step_times_s, want.step_times_s, strict=True))
    assert all(_close(a, b) for a, b in zip(got.peak_memory_bytes, want.peak_memory_bytes, strict=True))
    assert all(_close(a, b) for a, b in zip(got.memory_headroom_bytes, want.memory_headroom_bytes, strict=True))
    assert got.fits_memory == want.fits_memory
    assert got.busiest_link["link"] == want.busiest_link["link"]
    assert _close(got.busiest_link["utilization"], want.busiest_link["utilization"])
    budget = trace_budget(full.trace)
    assert steady.budget.keys() == budget.keys()
    assert all(_close(steady.budget[k], budget[k]) for k in budget), (steady.budget, budget)
    return got.microbatches_simulated


def test_1f1b_from_three_short_runs_equals_the_full_run(always_short):
    cfg = load_config("small-moe", ["parallel.pp=4", "parallel.num_microbatches=48", "sim.steps=2"])
    assert _assert_same(cfg) == [4, 5, 6, 12]  # on a line at 4-6, checked at 12


def test_interleaved_starts_past_its_fill(always_short):
    """Interleaved 1F1B takes micro-batches in multiples of pp; at M = pp it is all fill and drain, so its short
    runs start at 2 pp."""
    cfg = load_config(
        "small-moe",
        ["schedule=interleaved-1f1b", "parallel.pp=2", "parallel.vpp=2", "parallel.num_microbatches=64"],
    )
    assert _assert_same(cfg) == [4, 6, 8, 16]


def test_overlapped_pairs_on_dgx_h100_from_short_runs(always_short):
    """Interleaved pairs whose all-to-alls overlap the other pass's compute on the SMs their kernels leave."""
    cfg = load_config(
        "small-moe",
        [
            "schedule=interleaved-1f1b",
            "parallel.pp=2",
            "parallel.vpp=2",
            "parallel.ep=4",
            "parallel.num_microbatches=64",
            "topology=dgx-h100-superpod",
            "cost.profile=h100",
            "collectives.all_to_all=nccl",
            "collectives.overlap_all_to_all=true",
        ],
    )
    assert _assert_same(cfg) == [4, 6, 8, 16]


def test_a_contended_dragonfly_pipeline_with_tensor_parallelism(always_short):
    cfg = load_config(
        "small-moe",
        ["topology=frontier", "parallel.pp=4", "parallel.tp=2", "parallel.ep=2", "parallel.num_microbatches=40"],
    )
    assert _assert_same(cfg) == [4, 5, 6, 12]


# EP 32 all-to-alls across Frontier nodes beside TP 2 collectives: the step is on its line from 5 micro-batches, the
# split of the waiting between idle and exposed communication only from 6
CONTENDED = {
    "model": {"preset": "weak-1.7t", "num_layers": 4},
    "topology": "frontier",
    "cost": {"profile": "mi250x"},
    "parallel": {"pp": 4, "tp": 2, "sp": True, "ep": 32, "num_microbatches": 64},
    "schedule": "zb-h1",
    "collectives": {"all_to_all": "halo"},
    "optimizer": {"zero": 1},
}


def test_a_contended_plan_whose_waiting_settles_after_its_step(always_short, monkeypatch):
    """Short runs a micro-batch apart: no three counts have every total on one line within the counts 64
    micro-batches allow; the step's line (near_affine) checked at 14, extrapolated from 7 and 14, gives the full
    run's figures."""
    monkeypatch.setattr(steady_state, "PERIOD", 1)
    cfg = load_config(CONTENDED)
    assert _assert_same(cfg) == [4, 5, 6, 7, 14]
    assert simulate_figures(cfg).report.extrapolation == "near"


def test_simulate_says_which_figures_of_near_short_runs_are_approximate(always_short, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(steady_state, "PERIOD", 1)
    path = tmp_path / "contended.yaml"
    path.write_text(yaml.safe_dump(CONTENDED))
    assert main(["simulate", str(path), "--outputs", "report", "--out", str(tmp_path / "run")]) == 0
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["extrapolation"] == "near" and report["microbatches_simulated"] == [4, 5, 6, 7, 14]
    err = capsys.readouterr().err
    assert "figures from short runs of 4, 5, 6, 7, 14 micro-batches" in err and "approximate" in err


def test_short_runs_step_by_the_period_where_their_check_has_room(always_short):
    """A contended 1F1B plan can settle into a regime where pairs of micro-batches add the same time (PERIOD 2): the
    short runs step by 2 where the first three and their check stay within SAVING of the configured count."""
    cfg = load_config("small-moe", ["parallel.pp=4", "parallel.num_microbatches=96"])
    assert steady_state.short_runs(cfg).ladder[:3] == [4, 6, 8]
    assert _assert_same(cfg) == [4, 6, 8, 16]


def test_near_affine_takes_the_step_line_and_the_last_slope_of_the_shares():
    """The counted totals on one line, the step within NEAR_TOLERANCE of its makespan of the line of the runs
    before the last, the shares of the step drifting: every total from the last two runs' slope."""
    counts = [4, 5, 6, 12]
    idle = [1.0, 1.1, 1.25, 2.0]  # drifting, then steady
    runs = [{"makespan_s": 10.0 + m, "link:a": 3.0 * m, "idle_s": i} for m, i in zip(counts, idle, strict=True)]
    assert affine(runs, counts, 100) is None
    at = near_affine(runs, counts, 100)
    assert at == pytest.approx({"makespan_s": 110.0, "link:a": 300.0, "idle_s": 2.0 + 88 * 0.75 / 6})
    off = [*runs[:3], {**runs[3], "makespan_s": 22.0 * (1 + 2 * NEAR_TOLERANCE)}]  # the step leaves its line
    assert near_affine(off, counts, 100) is None
    counted = [*runs[:3], {**runs[3], "link:a": 36.001}]  # bytes are counted: on their line or refused
    assert near_affine(counted, counts, 100) is None


@pytest.mark.parametrize(
    "overrides",
    [
        ["schedule=gpipe", "parallel.pp=4", "parallel.num_microbatches=64"],  # in-flight micro-batches grow with M
        ["parallel.pp=2", "parallel.num_microbatches=64", "routing.kind=zipf"],  # micro-batches route differently
    ],
    ids=["gpipe", "skewed routing"],
)
def test_runs_without_a_steady_state_are_simulated_in_full(always_short, overrides):
    cfg = load_config("small-moe", overrides)
    steady = simulate_figures(cfg)
    assert steady.report.microbatches_simulated == [64]
    assert steady.report.step_time_s == simulate(cfg).report.step_time_s


def test_a_quick_run_is_simulated_in_full():
    cfg = load_config("small-moe", ["parallel.pp=4", "parallel.num_microbatches=48"])
    assert simulate_figures(cfg).report.microbatches_simulated == [48]


def test_affine_extrapolates_lines_and_refuses_curves():
    lines = [{"t": 1.0 + 2.0 * m, "c": 5.0} for m in (4, 5, 6)]
    assert affine(lines, [4, 5, 6], 100) == {"c": 5.0, "t": 201.0}
    curve = [{"t": float(m * m)} for m in (4, 5, 6)]
    assert affine(curve, [4, 5, 6], 100) is None
    assert affine([{"a": 1.0}, {"a": 2.0}, {"a": 3.0, "b": 1.0}], [1, 2, 3], 10) is None  # b appears late
    # a fourth count farther on checks the line: a step that leaves it past the three (a kink) is refused
    assert affine([*lines, {"t": 25.0, "c": 5.0}], [4, 5, 6, 12], 100) == {"c": 5.0, "t": 201.0}
    assert affine([*lines, {"t": 25.001, "c": 5.0}], [4, 5, 6, 12], 100) is None


def test_expected_wall_is_the_short_runs_where_they_are_taken(always_short):
    """The planner's refinement budget (plan --budget) counts what simulate_figures will simulate."""
    cfg = load_config("small-moe", ["parallel.pp=4", "parallel.num_microbatches=48"])
    full_s = check_wall(cfg, build_schedule(cfg), None).wall_s
    assert expected_wall_s(cfg) == pytest.approx(full_s * (4 + 5 + 6 + 12) / 48, rel=0.05)


def test_expected_wall_of_a_run_simulated_in_full():
    cfg = load_config("small-moe", ["parallel.pp=4", "parallel.num_microbatches=48"])
    assert expected_wall_s(cfg) == check_wall(cfg, build_schedule(cfg), None).wall_s


def test_simulate_report_only_writes_the_extrapolated_figures(always_short, tmp_path):
    """`simulate --outputs report` writes no trace, so it takes the short runs; report.json and links.csv hold the
    full run's figures."""
    overrides = ["parallel.pp=4", "parallel.num_microbatches=48"]
    out = tmp_path / "run"
    sets = [arg for o in overrides for arg in ("--set", o)]
    assert main(["simulate", "small-moe", *sets, "--outputs", "report", "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    full = simulate(load_config("small-moe", overrides))
    assert report["microbatches_simulated"] == [4, 5, 6, 12]
    assert _close(report["step_time_s"], full.report.step_time_s)
    links = pd.read_csv(out / "links.csv").set_index("link")
    want = full.links.set_index("link")
    assert sorted(links.index) == sorted(want.index)
    assert all(_close(links.loc[k, "utilization"], want.loc[k, "utilization"]) for k in want.index)


def test_short_runs_stop_where_a_line_could_no_longer_be_checked(always_short, monkeypatch):
    """Short runs that keep missing a line stop at the first count whose line could not be checked within SAVING
    of the configured count (4 + 5 + 6 + 7 and a check at 14 would simulate 36 of 48 micro-batches, over 0.7): the
    full run follows without the runs that could not have been used."""
    ran: list[int] = []

    def recorded(cfg, *args, **kwargs):
        ran.append(cfg.parallel.num_microbatches)
        return simulate(cfg, *args, **kwargs)

    monkeypatch.setattr(steady_state, "simulate", recorded)
    monkeypatch.setattr(steady_state, "affine", lambda *args: None)  # every line refused, as a drifting step is
    monkeypatch.setattr(steady_state, "near_affine", lambda *args: None)
    cfg = load_config("small-moe", ["parallel.pp=4", "parallel.num_microbatches=48"])
    assert steady_state.short_runs(cfg).ladder == [4, 5, 6, 7, 8]  # two apart (PERIOD), 4, 6, 8 and 16: over 0.7
    report = simulate_figures(cfg).report
    assert ran == [4, 5, 6, 48]
    assert report.microbatches_simulated == [48]
