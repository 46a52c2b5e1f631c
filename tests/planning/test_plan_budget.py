"""plan --budget: durations parsed ('90s', '3min', '1h') or refused naming the flag; the refinement starts the top plans
in the order of their estimates while the budget covers each one's predicted wall, on Dask or in this process; an
interrupted refinement, rerun, recomputes nothing it finished. tiny-moe on the uniform cluster keeps these fast."""

from __future__ import annotations

import pytest

from piper_sim.cli import main
from piper_sim.errors import ConfigError
from piper_sim.planning import planner
from piper_sim.planning.planner import PlanRequest, plan, refine_wall_s, simulate_point
from piper_sim.planning.refine import parse_duration, refine_points
from piper_sim.points.keys import keyed_point
from piper_sim.points.store import ResultStore

BASE = {"model": "tiny-moe", "topology": "uniform", "parallel": {"pp": 1, "ep": 1, "num_microbatches": 2}}


def _points(n: int):
    return [
        keyed_point({"config": {**BASE, "parallel": {**BASE["parallel"], "num_microbatches": 2 + i}}}) for i in range(n)
    ]


@pytest.mark.parametrize(
    "text, seconds", [("90s", 90), ("3min", 180), ("1h", 3600), ("1.5h", 5400), (" 2 min ", 120), (".5s", 0.5)]
)
def test_durations_parse(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["3", "3m", "0s", "-1s", "1e3s", "abc", "", "8000h", "nans", "3 min 2s"])
def test_a_bad_duration_names_the_flag_and_the_form(text):
    with pytest.raises(ConfigError, match="--budget.*such as 90s, 3min or 1h"):
        parse_duration(text)


def test_plan_refuses_a_bad_budget_before_any_work(tmp_path, capsys):
    assert (
        main(
            [
                "plan",
                "tiny-moe",
                "--gpus",
                "8",
                "--global-batch",
                "16",
                "--topology",
                "uniform",
                "--budget",
                "3 fortnights",
                "--workers",
                "0",
                "--out",
                str(tmp_path / "p"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--budget" in err and "3 fortnights" in err and not (tmp_path / "p").exists()


class Clock:
    """A clock that the work function moves: each point takes `step_s` seconds of it."""

    def __init__(self, step_s: float) -> None:
        self.now, self.step_s = 0.0, step_s

    def __call__(self) -> float:
        return self.now

    def run(self, payload: dict) -> dict:
        self.now += self.step_s
        return {**simulate_point(payload), "sim_wall_s": self.step_s}


def test_the_budget_stops_starting_new_refinements(tmp_path):
    clock = Clock(10.0)
    points = _points(5)
    done = refine_points(
        clock.run, points, ResultStore(tmp_path), lambda p: 10.0, budget_s=25.0, workers=0, clock=clock, progress=False
    )
    # starts at 0 s and 10 s fit (ends 10, 20 <= 25); the third would end at 30 s: it and those after stay
    assert list(done.rows) == [p.digest for p in points[:2]]
    assert done.left == [p.digest for p in points[2:]] and clock.now == 20.0


def test_the_prediction_is_scaled_by_the_plans_run(tmp_path):
    clock = Clock(30.0)  # each point takes 3x its prediction of 10 s
    points = _points(4)
    done = refine_points(
        clock.run, points, ResultStore(tmp_path), lambda p: 10.0, budget_s=65.0, workers=0, clock=clock, progress=False
    )
    # the first starts (10 s predicted); then 30 + 3 x 10 = 60 <= 65 starts the second; 60 + 30 > 65 stops
    assert len(done.rows) == 2 and done.scale == pytest.approx(3.0)


def test_an_interrupted_refinement_resumed_recomputes_nothing_done(tmp_path):
    points = _points(4)
    ran: list[int] = []

    def interrupted(payload: dict) -> dict:
        if len(ran) == 2:
            raise KeyboardInterrupt
        ran.append(payload["config"]["parallel"]["num_microbatches"])
        return simulate_point(payload)

    with pytest.raises(KeyboardInterrupt):
        refine_points(interrupted, points, ResultStore(tmp_path), lambda p: 1.0, workers=0, progress=False)
    again: list[int] = []
    store = ResultStore(tmp_path)
    done = refine_points(
        lambda payload: again.append(payload["config"]["parallel"]["num_microbatches"]) or simulate_point(payload),
        points,
        store,
        lambda p: 1.0,
        workers=0,
        progress=False,
    )
    assert ran == [2, 3] and again == [4, 5]
    assert store.tally.reused == 2 and store.tally.computed == 2 and len(done.rows) == 4 and not done.left


def test_on_dask_the_budget_stops_at_the_first_plan_that_does_not_fit(tmp_path, capsys):
    points = _points(4)
    slow = points[2].digest
    done = refine_points(
        simulate_point,
        points,
        ResultStore(tmp_path),
        lambda p: 1e6 if p.digest == slow else 1e-3,
        budget_s=600.0,
        workers=1,
    )
    assert list(done.rows) == [p.digest for p in points[:2]] and done.left == [p.digest for p in points[2:]]
    assert "2 of 4 left at the estimate tier (not started within the budget of 10 min)" in capsys.readouterr().err


def test_plan_ranks_the_plans_left_at_the_estimate_tier_after_the_refined(tmp_path, monkeypatch, capsys):
    request = PlanRequest(model="tiny-moe", num_gpus=4, global_batch=8, topology="uniform", top_k=3)
    predicted = {}

    def predict(point):
        predicted[point.digest] = refine_wall_s(point)
        return 1e6 if len(predicted) == 2 else predicted[point.digest]  # the second plan would not fit

    monkeypatch.setattr(planner, "refine_wall_s", predict)
    result = plan(request, tmp_path, workers=0, budget_s=120.0)
    assert all(0 < s < 60 for s in list(predicted.values())[:1])  # run_wall's prediction of a tiny plan
    assert int(result.table["refined"].sum()) == 1 and bool(result.table["refined"].iloc[0])
    err = capsys.readouterr().err
    assert "plan: refined 1 of the top 3:" in err and "plan: left at the estimate tier:" in err
