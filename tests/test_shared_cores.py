"""Ranks that share a machine's cores (the emulated testbed) compute under processor sharing."""

from __future__ import annotations

import pytest

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
