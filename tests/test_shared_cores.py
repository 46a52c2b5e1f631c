"""Ranks that share a machine's cores (the emulated testbed) compute under processor sharing."""

from __future__ import annotations

import pytest
import yaml

from piper_sim.config import load_config
from piper_sim.simulate import run_simulation

RAW = {"model": "tiny-moe", "parallel": {"pp": 1, "ep": 8, "num_microbatches": 2}}


def first_forward_s(cores: int, profile: str | dict | None = None) -> float:
    raw = {**RAW, "topology": {"preset": "testbed-flat", "params": {"shared_cores": cores}}}
    if profile is not None:
        raw["cost"] = {"profile": profile}
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


def _profile_with_core_sharing(levels: list[float], factors: list[float]) -> dict:
    from piper_sim.paths import data_dir

    raw = yaml.safe_load((data_dir("traces/profiles") / "mi250x.yaml").read_text())
    raw["measurements"] = {"core_sharing": {"ranks_per_core": levels, "cpu_time_factor": factors}}
    return raw


def test_ranks_taking_turns_on_a_core_pay_the_measured_core_sharing_factor():
    plain = first_forward_s(0)
    profile = _profile_with_core_sharing([1, 2, 4], [1.0, 1.1, 1.3])
    assert first_forward_s(0, profile) == pytest.approx(plain, rel=1e-9)  # no shared cores: nothing changes
    assert first_forward_s(2, profile) == pytest.approx(4 * 1.3 * plain, rel=1e-9)  # 8 ranks on 2 cores: 4 per core
    assert first_forward_s(4, profile) == pytest.approx(2 * 1.1 * plain, rel=1e-9)
    assert first_forward_s(8, profile) == pytest.approx(plain, rel=1e-9)  # one per core: no sharing


def test_a_malformed_core_sharing_table_is_one_clear_error():
    from piper_sim.errors import ConfigError

    with pytest.raises(ConfigError, match="core_sharing"):
        run_simulation(load_config({**RAW, "cost": {"profile": _profile_with_core_sharing([2, 1], [1.0, 1.2])}}))


def test_an_all_to_all_in_a_group_of_one_costs_nothing():
    # ep 1: the torch backend keeps the rows and makes no library call, so no host cost is charged
    raw = {**RAW, "parallel": {"pp": 2, "ep": 1, "num_microbatches": 2},
           "topology": {"preset": "testbed-flat", "params": {"shared_cores": 2}}, "cost": {"profile": "cpu-2rank"}}
    trace = run_simulation(load_config(raw)).trace
    a2a = trace[trace["kind"] == "all_to_all"]
    assert len(a2a) > 0 and ((a2a["end_s"] - a2a["start_s"]) == 0).all()
