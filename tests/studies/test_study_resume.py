"""Interrupted studies resume: every finished point is in the result store the moment it finishes, and a rerun
into the same folder recomputes none of them (it says `stored`) and writes every row."""

from __future__ import annotations

import pandas as pd
import pytest

from piper_sim.cli import main
from piper_sim.config import read_config_file
from piper_sim.paths import config_path
from piper_sim.rundir import UNFINISHED
from piper_sim.studies.all_to_all import StudySpec, write_study
from piper_sim.studies.imbalance import run_points, study_points


class Interrupt:
    """A study log that interrupts the study at the n-th line starting a point (as Ctrl-C would)."""

    def __init__(self, at: int | None, starts: str) -> None:
        self.at, self.starts, self.lines = at, starts, []

    def __call__(self, line: str) -> None:
        self.lines.append(line)
        if self.at is not None and self.starts in line and "stored" not in line:
            self.at -= 1
            if self.at == 0:
                raise KeyboardInterrupt

    def count(self, text: str) -> int:
        return sum(text in line for line in self.lines)


def test_an_interrupted_imbalance_study_recomputes_nothing_finished(tmp_path):
    raw = read_config_file(config_path("tiny-moe"))
    points = study_points(
        raw, kind="zipf", skews=[0.0, 1.0, 2.0], policies=["none", "greedy"], steps=2, drift_steps=3, drift_rate=0.5
    )
    assert len(points) == 8
    first = Interrupt(4, "] ")
    with pytest.raises(KeyboardInterrupt):
        run_points(points, tmp_path, first)
    assert len(pd.read_csv(tmp_path / "imbalance.csv")) == 3  # the rows finished so far are on disk
    again = Interrupt(None, "] ")
    run_points(points, tmp_path, again)
    assert again.count("(stored)") == 3 and again.count("] ") == 8
    table = pd.read_csv(tmp_path / "imbalance.csv")
    assert len(table) == 6 and len(pd.read_csv(tmp_path / "drift.csv")) == 2 * 3
    third = Interrupt(None, "] ")
    run_points(points, tmp_path, third)
    assert third.count("(stored)") == 8
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "imbalance.csv"), table)


def test_an_interrupted_all_to_all_study_recomputes_nothing_finished(tmp_path):
    spec = StudySpec(topology="uniform", nodes=(1, 2), sizes=("1MiB", "4MiB"), algorithms=("flat", "halo"))
    first = Interrupt(3, "GB/s/GPU")  # the third row's progress line comes after it was stored
    with pytest.raises(KeyboardInterrupt):
        write_study(spec, tmp_path, first)
    again = Interrupt(None, "GB/s/GPU")
    write_study(spec, tmp_path, again)
    assert again.count(": stored") == 3 and again.count("GB/s/GPU") == 8 - 3
    rows = pd.read_csv(tmp_path / "study.csv")
    assert len(rows) == 8 and rows[["nodes", "algorithm", "size"]].drop_duplicates().shape[0] == 8


def test_the_cli_resumes_into_its_own_folder_and_marks_it_finished(tmp_path, capsys):
    argv = [
        "study",
        "imbalance",
        "tiny-moe",
        "--skews",
        "0",
        "--policies",
        "none",
        "--steps",
        "2",
        "--drift-steps",
        "0",
        "--out",
        str(tmp_path / "s"),
    ]
    assert main(argv) == 0 and not (tmp_path / "s" / UNFINISHED).exists()
    capsys.readouterr()
    assert main(argv) == 0
    assert "(stored)" in capsys.readouterr().err
    assert main(["study", "imbalance", "tiny-moe", "--steps", "0", "--out", str(tmp_path / "t")]) == 2
    assert "--steps" in capsys.readouterr().err and not (tmp_path / "t").exists()  # checked before any work
