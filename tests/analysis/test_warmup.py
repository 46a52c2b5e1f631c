"""A real run's warm-up step is left out of its figures (analysis.run_report warmup_steps), compare puts the
prediction over the same steps, and a CPU run's MFU is against a CPU profile's peak."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from piper_sim.analysis.compare import compare_runs, same_steps
from piper_sim.analysis.run_report import make_report, steps_note
from piper_sim.cli import main
from piper_sim.paths import data_dir
from piper_sim.workload.profile_load import load_profile

PEAK = 1e12


def _trace(step_s: list[float], flops: float = 1e9) -> pd.DataFrame:
    """Two ranks; each step one compute task per rank over the whole step, then nothing."""
    rows, t = [], 0.0
    for step, length in enumerate(step_s):
        for rank in (0, 1):
            rows.append(
                {
                    "step": step,
                    "rank": rank,
                    "task_id": f"F{step}",
                    "kind": "forward",
                    "stream": "compute",
                    "start_s": t + (0.5 * length if rank else 0.0),
                    "end_s": t + length,
                    "flops": flops,
                    "bytes": 0.0,
                    "peers": "",
                }
            )
        t += length
    return pd.DataFrame(rows)


def _report(step_s: list[float], warmup: int | None):
    return make_report(
        _trace(step_s),
        num_gpus=2,
        peak_flops_per_s=PEAK,
        tokens_per_step=100,
        peak_memory_by_stage=[0.0],
        warmup_steps=warmup,
    )


def test_the_warm_up_step_is_left_out_of_every_figure():
    report = _report([10.0, 1.0, 1.0], warmup=1)
    assert report.step_time_s == pytest.approx(1.0)  # not (10 + 1 + 1) / 3
    assert report.step_times_s == pytest.approx([10.0, 1.0, 1.0]) and report.num_steps == 3  # all kept on record
    assert report.tokens_per_s == pytest.approx(100.0)
    assert report.mfu == pytest.approx(2e9 / (1.0 * 2 * PEAK))  # two ranks' flops per step over one step
    # rank 1 computes the second half of each step: busy half of the window from the end of step 1 on
    assert report.compute_fraction == pytest.approx(0.75) and report.bubble_fraction == pytest.approx(0.25)
    assert steps_note(report.to_dict()) == "steps 2-3; step 1 is warm-up"


def test_without_warm_up_every_step_counts():
    report = _report([10.0, 1.0, 1.0], warmup=None)  # the simulator's
    assert report.step_time_s == pytest.approx(4.0) and report.warmup_steps is None
    assert steps_note(report.to_dict()) == ""
    assert _report([3.0], warmup=0).step_time_s == pytest.approx(3.0)  # one step: it is the warm-up, kept
    with pytest.raises(ValueError):
        _report([3.0], warmup=1)


def test_compare_puts_the_prediction_over_the_measured_steps():
    predicted = _report([2.0, 1.0, 1.0], warmup=None).to_dict()
    aligned = same_steps(predicted, 1)
    assert aligned["step_time_s"] == pytest.approx(1.0)
    assert aligned["tokens_per_s"] == pytest.approx(100.0)
    assert aligned["mfu"] == pytest.approx(2e9 / (2 * PEAK))
    assert same_steps(predicted, 0) is predicted


@pytest.mark.slow  # a real run of 4 gloo ranks on this machine's CPUs (about 20 s on 2 cores)
def test_a_cpu_run_and_its_prediction_compare_over_the_same_steps_and_peak(tmp_path):
    config = tmp_path / "tiny.yaml"  # the tiny-moe example without a cost profile
    raw = yaml.safe_load((data_dir("examples") / "tiny-moe.yaml").read_text())
    raw.pop("cost")
    config.write_text(yaml.safe_dump({**raw, "sim": {"steps": 2, "seed": 0}}))
    real, sim = tmp_path / "real", tmp_path / "sim"
    assert main(["run", str(config), "--out", str(real)]) == 0
    report = json.loads((real / "report.json").read_text())
    assert report["mfu_peak_profile"] == "cpu-dev" and report["warmup_steps"] == 1  # not the MI250X's peak
    assert report["step_time_s"] == pytest.approx(report["step_times_s"][1])
    peak = report["model_flops_per_step"] / (report["step_time_s"] * report["num_gpus"] * report["mfu"])
    assert peak == pytest.approx(load_profile("cpu-dev").peak_flops_per_s, rel=1e-9)
    assert (
        main(
            [
                "simulate",
                str(config),
                "--out",
                str(sim),
                "--set",
                "cost.profile=cpu-dev",
                "--set",
                "routing.kind=trace",
                "--set",
                f"routing.path={real / 'routing.npz'}",
            ]
        )
        == 0
    )
    c = compare_runs(sim, real)
    errors = c.headline.set_index("metric")["error"]
    assert errors["mfu"] == pytest.approx(errors["tokens_per_s"], rel=1e-9)  # one peak: MFU moves with throughput
    predicted = json.loads((sim / "report.json").read_text())["step_times_s"][1]
    assert c.headline.set_index("metric").loc["step_time_s", "predicted"] == pytest.approx(predicted)
    assert c.steps == "step 2; step 1 is warm-up"
