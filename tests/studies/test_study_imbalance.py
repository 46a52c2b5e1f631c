"""The imbalance study: one row per (skew, policy); skew slows the step; greedy moves experts."""

from __future__ import annotations

import pandas as pd

from piper_sim.cli import main


def test_imbalance_study_writes_rows_and_plots(tmp_path):
    out = tmp_path / "imb"
    assert (
        main(
            [
                "study",
                "imbalance",
                "small-moe",
                "--skews",
                "0,2",
                "--policies",
                "none,greedy",
                "--steps",
                "3",
                "--drift-steps",
                "4",
                "--set",
                "model.num_experts=16",
                "--set",
                "parallel.num_microbatches=4",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    df = pd.read_csv(out / "imbalance.csv")
    assert len(df) == 4 and set(df["policy"]) == {"none", "greedy"}
    none = df[df["policy"] == "none"].set_index("skew")
    assert none.loc[2.0, "step_time_s"] > none.loc[0.0, "step_time_s"]
    assert none.loc[2.0, "lif"] > none.loc[0.0, "lif"]
    greedy = df[df["policy"] == "greedy"].set_index("skew")
    assert greedy.loc[2.0, "experts_moved"] > 0 and greedy.loc[2.0, "lif"] < none.loc[2.0, "lif"]
    drift = pd.read_csv(out / "drift.csv")
    assert len(drift) == 8
    assert (out / "imbalance.png").exists() and (out / "drift.png").exists()
