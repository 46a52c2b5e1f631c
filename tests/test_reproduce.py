"""`piper-sim reproduce`: experiments as resumable points, and a report made only of this run's figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from piper_sim.errors import ConfigError
from piper_sim.reproduce.cli import NAMES
from piper_sim.reproduce.run import EXPERIMENTS, markdown_table, reproduce
from piper_sim.reproduce.training import baseline_config
from piper_sim.reproduce.work import run_point


def test_the_cli_names_every_experiment_in_order():
    assert NAMES == tuple(EXPERIMENTS)


def test_every_experiment_has_quick_points_that_are_a_subset_of_its_full_ones():
    for name, experiment in EXPERIMENTS.items():
        quick, full = experiment.points(True), experiment.points(False)
        assert quick and len(quick) <= len(full), name
        assert {p["kind"] for p in quick} <= {"a2a", "a2a_study", "memory_map", "simulate", "estimate", "plan"}, name


def test_a_rerun_recomputes_nothing_and_the_report_is_rewritten(tmp_path):
    path = reproduce(["memory-map"], tmp_path, quick=True, workers=0, progress=False)
    text = path.read_text()
    assert "## memory-map" in text and "x-moe-super" in text and "figures/memory-map.png" in text
    points = sorted((tmp_path / "points").glob("*.json"))
    assert len(points) == len(EXPERIMENTS["memory-map"].points(True))
    stamps = [p.stat().st_mtime_ns for p in points]
    path.unlink()
    reproduce(["memory-map"], tmp_path, quick=True, workers=0, progress=False)
    assert [p.stat().st_mtime_ns for p in sorted((tmp_path / "points").glob("*.json"))] == stamps
    assert path.read_text().split("Wall time")[1].split("\n", 1)[1] == text.split("Wall time")[1].split("\n", 1)[1]


def test_an_unknown_experiment_is_refused_by_name(tmp_path):
    with pytest.raises(ConfigError) as err:
        reproduce(["halo", "nope"], tmp_path, quick=True, workers=0, progress=False)
    assert err.value.key == "EXPERIMENT" and err.value.value == "nope"


def test_the_xmoe_baseline_is_one_rule():
    small = baseline_config("x-moe-small", 256)["parallel"]
    assert (small["pp"], small["ep"], small["dp"]) == (1, 64, 4)  # E 64 over 256 GCDs
    super_ = baseline_config("x-moe-super", 1024)["parallel"]
    assert (super_["ep"], super_["dp"]) == (64, 16)  # E 256: EP capped at 64
    for parallel in (small, super_):
        assert parallel["micro_batch_size"] * parallel["num_microbatches"] * parallel["ep"] * parallel["dp"] == 1024


def test_inside_a_node_halo_is_the_flat_all_to_all():
    point = {"kind": "a2a", "gpus": 8, "size_per_gpu_bytes": 2**20, "topology": "frontier"}
    halo, flat = (run_point({**point, "algorithm": a}) for a in ("halo", "flat"))
    assert halo["time_s"] == pytest.approx(flat["time_s"], rel=1e-9) and halo["hosts"] == 1


def test_markdown_tables_keep_every_row():
    import pandas as pd

    text = markdown_table(pd.DataFrame({"a": [1.23456789, float("nan")], "b": ["x|y", "z"]}))
    assert text.splitlines() == ["| a | b |", "|---|---|", "| 1.235 | x/y |", "|  | z |"]


def test_reproduce_is_on_the_command_line(tmp_path: Path):
    from piper_sim.cli import main

    assert main(["reproduce", "memory-map", "--quick", "--workers", "0", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "report.md").exists() and (tmp_path / "figures" / "memory-map.png").exists()
