"""The torch backend's tensor accounting with activation recomputation and ZeRO: what is kept drops."""

from __future__ import annotations

from pathlib import Path

import pytest

from piper_sim.config import load_config
from piper_sim.schedule.build import build_schedule
from piper_sim.torch_backend.training_run import launch
from piper_sim.workload.memory import rank_params

CORPUS_BYTES = 200_000
BASE = {
    "model": "tiny-moe",
    "parallel": {"pp": 2, "ep": 1, "num_microbatches": 4, "micro_batch_size": 2},
    "sim": {"steps": 1, "seed": 3},
}


def peaks(raw: dict, out: Path) -> list[float]:
    """peak_tensor_bytes of each rank of one step of the config."""
    cfg = load_config(raw)
    _, _, _, memory, _ = launch(cfg, build_schedule(cfg), out, timeout_s=240, corpus_bytes=CORPUS_BYTES)
    return [m["peak_tensor_bytes"] for m in memory]


@pytest.mark.slow
def test_full_recomputation_keeps_less(tmp_path):
    """1F1B on pp 2: stage 0 holds two microbatches' activations at its peak; with full recomputation it holds
    one microbatch's checkpoint (its input tokens) beside the one being recomputed, so its peak drops by
    about one microbatch's activations, and the run's peak (the largest over ranks) drops."""
    none = peaks(BASE, tmp_path / "none")
    full = peaks({**BASE, "recompute": "full"}, tmp_path / "full")
    one_layer = peaks({**BASE, "recompute": "full", "recompute_layers": 1}, tmp_path / "one")
    print(f"peak tensor bytes per rank: none {none}, full {full}, full 1 layer {one_layer}")
    assert full[0] < one_layer[0] < none[0]
    assert max(full) < max(none)
    assert full[1] <= none[1]


@pytest.mark.slow
def test_zero_shards_the_optimizer_state(tmp_path):
    """ep 2 (dense parameters over two replicas, experts alone): ZeRO keeps the parameters and their full
    gradients (4 + 4 bytes each in fp32) and a shard's reduced gradient and Adam moments (12 / 2): 14 bytes
    per dense parameter instead of 16; the activations are the same, so the peaks differ by 2 bytes each."""
    raw = {**BASE, "parallel": {**BASE["parallel"], "pp": 1, "ep": 2}}
    cfg = load_config(raw)
    dense = rank_params(cfg.model, tuple(range(cfg.model.num_layers)), first=True, last=True, ep=2)["dense"]
    none = peaks(raw, tmp_path / "none")
    for zero in (1, 2):
        sharded = peaks({**raw, "optimizer": {"zero": zero}}, tmp_path / f"zero{zero}")
        print(f"zero {zero}: peak tensor bytes {sharded} against {none}")
        for before, after in zip(none, sharded, strict=True):
            assert before - after == pytest.approx(2 * dense, abs=16)
