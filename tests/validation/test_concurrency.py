"""How many ranks compute at once, from a trace with known intervals."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from piper_sim.validation.concurrency import compute_concurrency, mean_computing, uninterrupted_share


def _trace(rows):
    return pd.DataFrame(rows, columns=["rank", "kind", "start_s", "end_s"])


def test_the_share_of_time_at_each_count_of_ranks_computing():
    trace = _trace([(0, "forward", 0.0, 2.0), (1, "backward_expert", 1.0, 3.0), (1, "all_to_all", 3.0, 4.0)])
    share = compute_concurrency(trace)
    assert share.to_dict() == pytest.approx({0: 0.25, 1: 0.5, 2: 0.25})
    assert mean_computing(share) == pytest.approx(1.0)


def test_back_to_back_tasks_of_one_rank_are_one_rank_computing():
    trace = _trace([(0, "forward", 0.0, 1.0), (0, "backward", 1.0, 2.0), (1, "recv", 0.0, 2.0)])
    assert compute_concurrency(trace).to_dict() == pytest.approx({0: 0.0, 1: 1.0, 2: 0.0})


def test_compute_tasks_with_a_core_to_themselves_use_about_their_wall_time_in_cpu():
    rows = [
        (0, "forward", 0.0, 2.0, 1.9),
        (1, "backward", 0.0, 2.0, 1.0),
        (0, "backward_expert", 2.0, 3.0, 0.95),
        (1, "all_to_all", 2.0, 3.0, 0.1),
    ]  # not a compute task
    trace = pd.DataFrame(rows, columns=["rank", "kind", "start_s", "end_s", "cpu_s"])
    assert uninterrupted_share(trace) == pytest.approx(2 / 3)
    assert math.isnan(uninterrupted_share(trace.assign(cpu_s=float("nan"))))  # measured before cpu_s existed
