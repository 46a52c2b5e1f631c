"""A simulate run's wall time: estimated before it starts from its rank tasks (and skewed all-to-alls), shown, kept in
the run's stats, and refused beyond --max-wall-minutes, naming the flag and what to lower. Per-unit costs are
monkeypatched here; no long run."""

from __future__ import annotations

import pytest

from piper_sim import run_wall
from piper_sim.cli import main
from piper_sim.config import load_config
from piper_sim.errors import ConfigError
from piper_sim.schedule.build import build_schedule
from piper_sim.simulator import check_wall, simulate
from piper_sim.workload.task_kinds import TaskKind

CONFIG = "small-moe"


def test_the_work_counted_is_the_run_s_rank_tasks():
    cfg = load_config(CONFIG, ["sim.steps=2", "parallel.dp=2"])
    result = simulate(cfg)
    work = check_wall(cfg, result.schedule, None)
    assert work.rank_tasks == result.stats["num_tasks"] == len(result.trace)
    assert work.skewed_all_to_all_members == 0  # uniform routing: one lane a stage, one matrix for every group
    assert result.stats["wall_estimate_s"] == pytest.approx(work.rank_tasks * run_wall.RANK_TASK_S)


def test_skewed_routing_counts_every_member_of_every_all_to_all():
    cfg = load_config(CONFIG, ["routing.kind=zipf", "sim.steps=3"])
    schedule = build_schedule(cfg)
    per_stage = schedule.mesh.num_ranks // schedule.mesh.pp
    all_to_alls = sum(t.kind == TaskKind.ALL_TO_ALL for program in schedule.stage_programs for t in program)
    work = check_wall(cfg, schedule, None)
    assert all_to_alls > 0
    assert work.skewed_all_to_all_members == 3 * per_stage * all_to_alls
    assert work.wall_s > run_work_uniform(cfg).wall_s


def run_work_uniform(cfg):
    return run_wall.run_work(build_schedule(cfg), cfg.steps, skewed=False)


def test_a_run_past_the_limit_is_refused_before_it_starts(monkeypatch):
    cfg = load_config(CONFIG)
    monkeypatch.setattr(run_wall, "RANK_TASK_S", 1.0)  # 2,320 rank tasks: about 39 minutes
    with pytest.raises(ConfigError) as err:
        simulate(cfg, max_wall_minutes=30)
    assert err.value.key == "--max-wall-minutes"
    result = simulate(cfg, max_wall_minutes=40)  # raised past the estimate: it runs
    assert result.stats["wall_estimate_s"] == pytest.approx(2320.0)


def test_cli_simulate_refuses_by_default_and_runs_when_the_limit_is_raised(monkeypatch, tmp_path):
    monkeypatch.setattr(run_wall, "RANK_TASK_S", 1.0)
    out = tmp_path / "run"
    assert main(["simulate", CONFIG, "--out", str(out), "--outputs", "report"]) == 2
    assert not out.exists()  # refused before the folder is made
    assert main(["simulate", CONFIG, "--out", str(out), "--outputs", "report", "--max-wall-minutes", "0"]) == 0
    assert (out / "report.json").exists()
    assert main(["simulate", CONFIG, "--out", str(tmp_path / "bad"), "--max-wall-minutes", "-1"]) == 2


def test_the_default_limit_takes_a_run_of_the_default_size():
    cfg = load_config(CONFIG)
    run_wall.check_run_wall(check_wall(cfg, build_schedule(cfg), None), run_wall.DEFAULT_MAX_WALL_MINUTES)
    big = load_config(CONFIG, ["sim.steps=100000"])  # 232 million rank tasks: about 35 minutes
    with pytest.raises(ConfigError):
        check_wall(big, build_schedule(big), run_wall.DEFAULT_MAX_WALL_MINUTES)
