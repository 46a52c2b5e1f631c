"""A simulated run's figures from its task arrays equal those the same functions give on its trace frame."""

from __future__ import annotations

import numpy as np
import pytest

from piper_sim.analysis.budget import busiest_rank, trace_budget
from piper_sim.analysis.run_report import a2a_call_bandwidths, frame_figures, make_report, report_of
from piper_sim.analysis.task_arrays import TaskArrays, union_length_rows
from piper_sim.config import load_config
from piper_sim.outputs import write_run
from piper_sim.simulator import simulate
from piper_sim.workload.task_kinds import Role

PLANS = {
    "moe-pipeline-recompute-zero2": {
        "model": "x-moe-small",
        "topology": "frontier",
        "collectives": {"all_to_all": "halo"},
        "parallel": {"pp": 2, "ep": 4, "num_microbatches": 4},
        "recompute": "full",
        "optimizer": {"zero": 2},
        "sim": {"steps": 2},
    },
    "tp-sp-interleaved": {
        "model": "x-moe-small",
        "schedule": "interleaved-1f1b",
        "parallel": {"pp": 2, "ep": 2, "tp": 2, "sp": True, "vpp": 2, "num_microbatches": 4},
    },
    "skewed-migration": {
        "model": "small-moe",
        "routing": {"kind": "zipf", "exponent": 1.0},
        "migration": {"enabled": True, "policy": "greedy"},
        "parallel": {"pp": 2, "ep": 4, "num_microbatches": 2},
        "sim": {"steps": 3},
    },
}


@pytest.fixture(scope="module", params=sorted(PLANS))
def run(request):
    return simulate(load_config(PLANS[request.param]))


def test_figures_from_arrays_equal_the_frames(run):
    tasks = run.tasks
    assert isinstance(tasks, TaskArrays)
    frame = tasks.frame
    gpus = run.config.parallel.num_gpus
    ours, theirs = tasks.figures(), frame_figures(frame, gpus)
    assert ours.step_times_s == pytest.approx(theirs.step_times_s, rel=1e-12, abs=0)
    assert (ours.begin_s, ours.end_s) == (theirs.begin_s, theirs.end_s)
    assert ours.hardware_flops == pytest.approx(theirs.hardware_flops, rel=1e-12)
    assert ours.recompute_flops == pytest.approx(theirs.recompute_flops, rel=1e-12, abs=0)
    np.testing.assert_allclose(ours.busy_compute_s, theirs.busy_compute_s, rtol=1e-12)
    np.testing.assert_allclose(ours.busy_any_s, theirs.busy_any_s, rtol=1e-12)
    np.testing.assert_allclose(np.sort(ours.a2a_call_bandwidths), np.sort(a2a_call_bandwidths(frame)), rtol=1e-12)
    assert tasks.num_rows == len(frame)
    assert tasks.last_end_s - tasks.first_start_s == float(frame["end_s"].max() - frame["start_s"].min())


def test_the_simulators_report_is_the_frames(run):
    frame, report = run.trace, run.report
    peak = report.model_flops_per_step / (report.mfu * report.step_time_s * report.num_gpus)  # the profile's
    again = make_report(
        frame,
        num_gpus=report.num_gpus,
        peak_flops_per_s=peak,
        tokens_per_step=report.tokens_per_step,
        peak_memory_by_stage=report.peak_memory_bytes,
    )
    for key in ("step_time_s", "mfu", "hfu", "compute_fraction", "bubble_fraction", "exposed_comm_fraction"):
        assert getattr(report, key) == pytest.approx(getattr(again, key), rel=1e-9), key
    assert report.all_to_all_bandwidth_bytes_per_s == pytest.approx(again.all_to_all_bandwidth_bytes_per_s, rel=1e-9)
    migrate = frame[frame["role"] == Role.MIGRATE]
    seconds = float((migrate["end_s"] - migrate["start_s"]).sum())
    assert run.tasks.seconds_of(lambda t: t.role == Role.MIGRATE) == pytest.approx(seconds, rel=1e-12, abs=0)


def test_one_ranks_budget_from_arrays_is_the_frames(run):
    tasks, frame = run.tasks, run.trace
    assert tasks.busiest_rank() == busiest_rank(frame)
    for rank in {0, tasks.busiest_rank(), run.config.parallel.num_gpus - 1}:
        ours, theirs = tasks.budget(rank), trace_budget(frame, rank)
        assert ours == pytest.approx(theirs, rel=1e-12, abs=1e-15), rank


def test_a_report_from_figures_needs_no_frame(tmp_path):
    cfg = load_config(PLANS["tp-sp-interleaved"])
    result = simulate(cfg)
    write_run(tmp_path, result, outputs="report")
    assert (tmp_path / "report.json").is_file()
    assert "frame" not in vars(result.tasks)  # the report, stats, links and report files were made without it
    report = report_of(
        result.tasks.figures(),
        num_gpus=result.report.num_gpus,
        peak_flops_per_s=1e12,
        tokens_per_step=result.report.tokens_per_step,
        peak_memory_by_stage=result.report.peak_memory_bytes,
    )
    assert report.step_time_s == result.report.step_time_s
    assert len(result.trace) == result.stats["num_tasks"]  # built on the first ask
    assert "frame" in vars(result.tasks)


def test_union_length_rows():
    start = np.array([[0.0, 1.0, 5.0, 2.0], [3.0, 3.0, 0.0, 10.0]])
    end = np.array([[2.0, 3.0, 6.0, 2.5], [4.0, 3.5, 1.0, 10.0]])
    np.testing.assert_array_equal(union_length_rows(start, end), [4.0, 2.0])  # [0, 3) and [5, 6); [0, 1) and [3, 4)
    assert union_length_rows(np.zeros((3, 0)), np.zeros((3, 0))).tolist() == [0.0, 0.0, 0.0]
