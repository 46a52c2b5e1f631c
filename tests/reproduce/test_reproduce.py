"""`piper-sim reproduce`: experiments as resumable points, and a report made only of this run's figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from piper_sim.errors import ConfigError
from piper_sim.reproduce.cli import NAMES
from piper_sim.reproduce.run import EXPERIMENTS, markdown_table, reproduce
from piper_sim.reproduce.throughput_experiments import baseline_config
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
    assert "DESIGN.md" not in text and "arXiv 2605.05049" in text
    verdict_row = next(line for line in text.splitlines() if line.startswith("| memory-map | stage0_peak_share"))
    assert verdict_row.split("|")[-2].strip() in ("agrees", "partly", "disagrees")
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


def test_the_xmoe_baseline_is_the_configuration_validate_published_scores():
    from piper_sim.paths import data_dir
    from piper_sim.validation.published import load_published, measured_step_s

    for model, size in (("x-moe-small", "small"), ("x-moe-medium", "medium"), ("x-moe-large", "large")):
        run = load_published(data_dir("validation") / "published" / f"xmoe2025-{size}-frontier-256gcd.yaml")
        config, measured = baseline_config(model, 256)
        assert config == run.config and measured == pytest.approx(measured_step_s(run))
        assert config["cost"]["profile"] == "mi250x-xmoe" and config["recompute"] == "none"
        assert config["collectives"]["all_to_all"] == "rccl"
    super_, measured = baseline_config("x-moe-super", 1024)  # no published run: the Large's rule on 1024 GCDs
    assert measured is None and super_["model"]["preset"] == "x-moe-super"
    par = super_["parallel"]
    assert (par["tp"], par["ep"], par["dp"]) == (2, 64, 512)
    assert par["dp"] * par["micro_batch_size"] * par["num_microbatches"] == 1024  # the Large's global batch


def test_a_claim_agrees_only_when_the_prediction_lies_inside_its_range():
    from piper_sim.reproduce.claims import Claim, load_claims, verdict

    claim = Claim(text="", where="", figure="x", low=1.2, high=9.0)
    assert verdict(claim, (1.5, 8.0)) == "agrees"
    assert verdict(claim, (1.5, 30.0)) == "partly"
    assert verdict(claim, (10.0, 30.0)) == "disagrees"
    assert verdict(claim, (float("nan"), float("nan"))) == "disagrees"
    widened = Claim(text="", where="", figure="x", low=0.73, high=0.73, tolerance=0.07)
    assert verdict(widened, (0.70, 0.70)) == "agrees" and verdict(widened, (0.44, 0.44)) == "disagrees"
    source, claims = load_claims()
    assert source["arxiv"].startswith("2605.05049")
    assert set(claims) <= set(EXPERIMENTS)  # every claim belongs to an experiment
    assert (claims["halo"].low, claims["halo"].high) == (1.2, 9.0)
    assert (claims["vs-xmoe"].low, claims["vs-xmoe"].high) == (2.0, 3.5)


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
