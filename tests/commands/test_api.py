"""The Python API of the README: load_config and simulate from the package, the result's report and trace."""

from __future__ import annotations

import pandas as pd


def test_the_python_api_simulates_a_config():
    import piper_sim.simulator  # noqa: F401  (the backend module imported first, as the CLI does)
    from piper_sim import load_config, simulate

    cfg = load_config("tiny-moe", ["sim.steps=1", "schedule=gpipe"])
    result = simulate(cfg)
    assert result.report.num_steps == 1 and result.report.step_time_s > 0
    assert isinstance(result.trace, pd.DataFrame) and {"rank", "task_id", "start_s", "end_s"} <= set(result.trace)
    assert result.config.schedule == "gpipe"
    assert simulate(cfg).report.step_time_s == result.report.step_time_s  # the same config, the same answer
