"""Ranks that share a machine's cores (the emulated testbed) compute under processor sharing."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml

from piper_sim.config import load_config
from piper_sim.simulate import run_simulation

RAW = {"model": "tiny-moe", "parallel": {"pp": 1, "ep": 8, "num_microbatches": 2}}


def first_forward_s(cores: int) -> float:
    raw = {**RAW, "topology": {"preset": "testbed-flat", "params": {"shared_cores": cores}}}
    trace = run_simulation(load_config(raw)).trace
    first = trace[(trace["task_id"] == "F:c0:m0:s0")]
    assert len(first) == 8 and first["start_s"].nunique() == 1  # all eight ranks start it together
    return float((first["end_s"] - first["start_s"]).iloc[0])


def test_eight_ranks_on_one_core_take_eight_times_longer():
    assert first_forward_s(1) == pytest.approx(8 * first_forward_s(0), rel=1e-9)


def test_eight_ranks_on_two_cores_take_four_times_longer():
    assert first_forward_s(2) == pytest.approx(4 * first_forward_s(0), rel=1e-9)


def test_more_cores_than_ranks_changes_nothing():
    assert first_forward_s(16) == pytest.approx(first_forward_s(0), rel=1e-9)


# ---- wake-up latency: a blocked rank woken by a message waits for a core while others compute ----------

def _profile_with_wake(tmp_path, extra_us: list[float]) -> str:
    """The shipped CPU profile with a wake-up latency curve over 0, 2 and 4 spinning processes on 2 cores."""
    from piper_sim.paths import data_dir

    raw = yaml.safe_load((data_dir("traces/profiles") / "cpu-2rank.yaml").read_text())
    raw["measurements"]["wake_latency"] = {"cores": 2, "competitors": [0, 2, 4], "extra_us": extra_us}
    path = tmp_path / f"wake-{'-'.join(str(int(x)) for x in extra_us)}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def _simulate(tmp_path, extra_us: list[float], parallel: dict) -> pd.DataFrame:
    raw = {"model": "tiny-moe", "parallel": parallel, "cost": {"profile": _profile_with_wake(tmp_path, extra_us)},
           "topology": {"preset": "testbed-flat", "params": {"shared_cores": 2}}}
    return run_simulation(load_config(raw)).trace


def _collective_s(tmp_path, extra_us: list[float], parallel: dict) -> pd.Series:
    trace = _simulate(tmp_path, extra_us, parallel)
    coll = trace[trace["kind"] == "all_to_all"]
    return (coll["end_s"] - coll["start_s"]).reset_index(drop=True)


def test_wake_delay_is_interpolated_in_processes_per_core():
    from piper_sim.workload.cost import load_profile

    profile = load_profile({"name": "w", "device": "cpu", "peak_bf16_TFLOPS": 0.1, "hbm_GiB": 1,
                            "hbm_bandwidth_GBps": 10, "gemm_efficiency": {"rows": [1, 2], "efficiency": [1, 1]},
                            "attention_efficiency": {"seq_len": [1, 2], "efficiency": [1, 1]},
                            "measurements": {"wake_latency": {"cores": 2, "competitors": [0, 2, 4],
                                                              "extra_us": [0, 500, 1000]}}})
    assert profile.wake_delay_s(0, 2) == 0.0
    assert profile.wake_delay_s(1, 2) == pytest.approx(250e-6)  # half a process per core
    assert profile.wake_delay_s(4, 4) == pytest.approx(500e-6)  # one per core, on a 4-core host
    assert profile.wake_delay_s(40, 2) == pytest.approx(1000e-6)  # flat beyond the measured load
    assert load_profile("cpu-2rank").wake_delay_s(3, 2) >= 0.0


def test_no_wake_delay_when_no_rank_computes_at_the_wake_up(tmp_path):
    # pp 1: every rank is inside the same all-to-all when it completes, so nobody competes for a core
    parallel = {"pp": 1, "ep": 8, "num_microbatches": 2}
    assert _collective_s(tmp_path, [0, 5000, 10000], parallel).tolist() == pytest.approx(
        _collective_s(tmp_path, [0, 0, 0], parallel).tolist(), rel=1e-12)


def test_wake_delay_lengthens_collectives_that_complete_while_other_stages_compute(tmp_path):
    parallel = {"pp": 2, "ep": 4, "num_microbatches": 4}
    calm, busy = _simulate(tmp_path, [0, 0, 0], parallel), _simulate(tmp_path, [0, 2000, 4000], parallel)
    duration = lambda t: (t["end_s"] - t["start_s"])[t["kind"] == "all_to_all"].sum()  # noqa: E731
    assert duration(busy) > duration(calm)
    # each wake-up waits at most 4 ms (8 ranks on 2 cores), once per library call (a flat all-to-all makes two)
    # and once per blocking receive, and no wait lengthens the step by more than itself
    wakeups = 2 * (busy["kind"] == "all_to_all").sum() + (busy["kind"] == "recv").sum()
    assert 0 < busy["end_s"].max() - calm["end_s"].max() <= wakeups * 4e-3
