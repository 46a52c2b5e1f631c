"""Progress lines (piper_sim.progress): the one switch, silence off a terminal and for short work, the
simulator's line of tasks done (and its trace unchanged by it), the run's line of rank steps done."""

from __future__ import annotations

import sys
import time

import pandas as pd
import pytest

from piper_sim import progress
from piper_sim.config import load_config
from piper_sim.errors import ConfigError
from piper_sim.simulator import simulate

SIM = ["parallel.num_microbatches=4"]


@pytest.fixture
def shown(monkeypatch):
    """Progress lines forced on, drawn at once and sampled often."""
    monkeypatch.setenv(progress.ENV, "1")
    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    monkeypatch.setattr(progress, "INTERVAL_S", 0.01)


@pytest.mark.parametrize(
    ("value", "tty", "expected"),
    [
        ("0", True, False),
        ("1", False, True),
        ("auto", True, True),
        ("", False, False),
        (None, False, False),
        (None, True, True),
    ],
)
def test_the_switch_and_the_terminal_decide(value, tty, expected, monkeypatch):
    if value is None:
        monkeypatch.delenv(progress.ENV, raising=False)
    else:
        monkeypatch.setenv(progress.ENV, value)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: tty, raising=False)
    assert progress.enabled() is expected


def test_a_bad_switch_value_names_the_variable_and_the_values_allowed(monkeypatch):
    monkeypatch.setenv(progress.ENV, "yes")
    with pytest.raises(ConfigError, match=r"PIPER_SIM_PROGRESS.*'yes'.*0 .*1 .*auto"):
        progress.enabled()


def test_watch_samples_the_reading_and_closes_on_the_last_count(shown, capsys):
    count = [0]
    with progress.watch(progress.bar(40, "counting", "things"), lambda: count[0]):
        for _ in range(40):
            count[0] += 1
            time.sleep(0.002)
    err = capsys.readouterr().err
    assert "counting: 40/40 things" in err.replace("\r", "\n").splitlines()[-1]


def test_short_work_and_a_switched_off_line_print_nothing(monkeypatch, capsys):
    monkeypatch.setenv(progress.ENV, "1")  # forced on, but the work ends before DELAY_S
    with progress.watch(progress.bar(3, "quick"), lambda: 3):
        pass
    monkeypatch.setenv(progress.ENV, "0")
    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    with progress.watch(progress.bar(3, "off"), lambda: 3):
        time.sleep(0.05)
    with progress.bar(2, "off") as line:
        line.update(2)
    assert capsys.readouterr().err == ""


def test_simulate_counts_simulated_time_and_leaves_the_trace_alone(shown, capsys, monkeypatch):
    from piper_sim import simulator as simulate_module
    from piper_sim.run_wall import duration_text

    cfg = load_config("examples/tiny-moe.yaml", SIM + ["sim.steps=2"])
    quiet = simulate(cfg)
    assert capsys.readouterr().err == ""  # the library call shows no line unless asked
    samples = []
    read = simulate_module.Reading.__call__
    monkeypatch.setattr(simulate_module.Reading, "__call__", lambda self: samples.append(read(self)) or samples[-1])
    expected = 0.5 * float(quiet.trace["end_s"].max())  # an estimate that was short: the total follows the run
    loud = simulate(cfg, progress=True, expected_s=expected)
    end = float(loud.trace["end_s"].max())
    last = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    wall = duration_text(loud.stats["wall_estimate_s"])  # the line shows the run's expected wall time
    assert last.startswith(f"simulating (about {wall} expected): {end:.4g}/{end:.4g} s simulated"), last
    # simulated time, rising to the run's end (how many samples land before the end depends on the thread's turns)
    assert samples == sorted(samples) and samples[-1] == end and samples[0] >= 0
    pd.testing.assert_frame_equal(loud.trace, quiet.trace)


def test_a_reading_is_the_runs_simulated_time_then_its_end():
    from types import SimpleNamespace

    from piper_sim.simulator import Reading

    reading = Reading()
    assert reading() == 0.0  # no run under way
    reading.sim = SimpleNamespace(env=SimpleNamespace(now=0.25))
    assert reading() == 0.25
    reading.end_s = 0.75  # members' clocks ahead of the event loop: the run's end once it has one
    assert reading() == 0.75


def test_a_restart_says_so_on_the_line_and_counts_from_zero(shown, capsys):
    from types import SimpleNamespace

    from piper_sim.sim.host import Asymmetry
    from piper_sim.simulator import RESTARTS, Reading, _run_lanes

    class Run:
        def __init__(self, lanes: int, diverges: bool) -> None:
            self.lanes, self.diverges = [()] * lanes, diverges
            self.env, self.mesh = SimpleNamespace(now=0.0), SimpleNamespace(num_ranks=16)

        def run(self):
            self.env.now = 3.0  # simulated time reached when the lanes diverge
            if self.diverges:
                raise Asymmetry("members apart")
            return "records"

    line = progress.bar(10.0, "simulating", bar_format="{desc}: {n:.4g}/{total:.4g} s simulated")
    reading, said = Reading(), []
    reading.sim = Run(2, diverges=True)

    def restarted(text: str) -> None:
        said.append((text, reading()))
        progress.restart(line, text)

    runs = iter([Run(4, diverges=True), Run(16, diverges=False)])
    assert _run_lanes(reading, lambda *a, **k: next(runs), restarted) == ("records", True, False, ())
    line.close()
    assert said == [(RESTARTS[0], 0.0), (RESTARTS[1], 0.0)]
    shown_lines = capsys.readouterr().err.replace("\r", "\n").splitlines()
    assert f"{RESTARTS[0]}: 0/10 s simulated" in shown_lines and f"{RESTARTS[1]}: 0/10 s simulated" in shown_lines


def test_a_divergence_on_a_collective_splits_lanes_by_its_groups_before_one_lane_per_rank():
    from types import SimpleNamespace

    from piper_sim.sim.host import Asymmetry
    from piper_sim.simulator import RESTARTS, SPLIT_RESTART, Reading, _run_lanes

    class Run:
        def __init__(self, lanes: int, axis: str | None) -> None:
            self.lanes, self.axis = [()] * lanes, axis
            self.env, self.mesh = SimpleNamespace(now=0.0), SimpleNamespace(num_ranks=16)

        def run(self):
            if self.axis:
                raise Asymmetry("members apart", self.axis)
            return "records"

    asked = []

    def simulation(lanes):
        asked.append(lanes)
        return {(): Run(2, "ep"), ("dp",): Run(4, "ep"), ("dp", "ep"): Run(8, None)}.get(lanes.axes, Run(2, "ep"))

    said: list[str] = []
    reading = Reading()
    reading.sim = Run(2, "dp")  # the stage lanes diverge on a dp collective; by latency gives the same lanes
    assert _run_lanes(reading, simulation, said.append) == ("records", False, False, ("dp", "ep"))
    assert [lanes.axes for lanes in asked] == [(), ("dp",), ("dp", "ep")]
    assert said == [RESTARTS[0], SPLIT_RESTART.format(axis="dp"), SPLIT_RESTART.format(axis="ep")]
    assert str(Asymmetry("members apart", "dp")) == "members apart"


def test_the_cli_prints_no_line_when_stderr_is_not_a_terminal(tmp_path, monkeypatch, capsys):
    from piper_sim.cli import main

    monkeypatch.delenv(progress.ENV, raising=False)
    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    assert main(["simulate", "tiny-moe", "--out", str(tmp_path / "o"), *sum((["--set", s] for s in SIM), [])]) == 0
    assert " s simulated" not in capsys.readouterr().err


@pytest.mark.slow  # starts 4 torch ranks (about 30 s on 2 cores)
def test_run_counts_the_steps_each_rank_finished(shown, tmp_path, capsys):
    from piper_sim.schedule.build import build_schedule
    from piper_sim.torch_backend.training_run import STEP_MARKS, launch

    cfg = load_config("examples/tiny-moe.yaml", ["sim.steps=2"])
    launch(cfg, build_schedule(cfg), tmp_path, timeout_s=240, corpus_bytes=100_000, progress=True)
    world = cfg.parallel.num_gpus
    marks = sorted((tmp_path / "ranks").glob(f"rank*{STEP_MARKS}"))
    assert [m.stat().st_size for m in marks] == [2] * world
    last = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    assert last.startswith(f"training: {2 * world}/{2 * world} rank steps"), last


def test_eta_is_the_mean_time_of_the_items_computed_times_those_left():
    from piper_sim.progress import Eta

    now = [100.0]
    eta = Eta(4, clock=lambda: now[0])
    assert eta.text() == ""
    now[0] = 110.0
    eta.finished()
    assert eta.text() == "elapsed 10s, about 30s left"
    now[0] = 100.0 + 3725.0
    eta.finished()
    assert eta.text() == "elapsed 1h02m, about 1h02m left"
    eta.finished(), eta.finished()
    assert eta.text().endswith("about 0s left")
