"""points.dask_runner.run_points starts points of a higher priority first (reproduce's long poles first)."""

from __future__ import annotations

import time
from pathlib import Path

from piper_sim.points.dask_runner import run_points
from piper_sim.points.keys import keyed_point
from piper_sim.points.store import ResultStore
from piper_sim.reproduce.run import long_poles_first


def _stamp(payload: dict) -> dict:
    return {"i": payload["i"], "at": time.monotonic()}  # one worker process: one clock


def _points() -> list:
    return [keyed_point({"i": i, "cost": cost}) for i, cost in enumerate([0, 5, 0, 9, 5])]


def _order(rows: dict) -> list[int]:
    return [row["i"] for row in sorted(rows.values(), key=lambda row: row["at"])]


def test_points_start_by_priority_in_process(tmp_path):
    rows = run_points(_stamp, _points(), ResultStore(Path(tmp_path)), workers=0, priority=lambda p: p["cost"])
    assert _order(rows) == [3, 1, 4, 0, 2]  # 9, then the two 5s and the two 0s in their order


def test_points_start_by_priority_on_one_dask_worker(tmp_path):
    rows = run_points(_stamp, _points(), ResultStore(Path(tmp_path)), workers=1, priority=lambda p: p["cost"])
    assert _order(rows)[0] == 3 and set(_order(rows)[:3]) == {1, 3, 4}


def test_reproduce_starts_its_planned_points_first():
    def plan(gpus: int, top_k: int) -> dict:
        return {"kind": "plan", "name": "m", "request": {"num_gpus": gpus, "top_k": top_k}}

    assert long_poles_first(plan(512, 2)) > long_poles_first(plan(128, 2)) > long_poles_first(plan(128, 0)) > 0
    assert long_poles_first({"kind": "network"}) == 0.0
