"""optimizer.master_weights: a 16-bit model trained without an fp32 master copy (its weights, gradients and Adam
moments all in bf16, as NeMo AutoModel's recipes train) keeps 8 bytes a parameter where mixed precision keeps 16
(workload/memory.py; validation/published/automodel-*.yaml)."""

from __future__ import annotations

from pathlib import Path

import pytest

from piper_sim.config import load_config
from piper_sim.errors import ConfigError
from piper_sim.planning.estimate import estimate_with_memory
from piper_sim.validation.published import find_published
from piper_sim.workload.memory import state_bytes_per_param

MOE = "examples/small-moe.yaml"
GiB = 2**30


def test_without_master_weights_a_parameter_keeps_weight_gradient_and_two_moments_in_bf16():
    assert state_bytes_per_param(0, 1, 2, master_weights=False) == 8
    assert state_bytes_per_param(3, 8, 2, master_weights=False) == pytest.approx(8 / 8)
    assert state_bytes_per_param(1, 4, 2, master_weights=False) == pytest.approx(2 + 2 + 4 / 4)
    assert state_bytes_per_param(0, 1, 4, master_weights=False) == state_bytes_per_param(0, 1, 4) == 16


def test_the_config_key_halves_the_training_state_and_refuses_a_non_boolean():
    with_master = estimate_with_memory(load_config(MOE))[1]
    without = estimate_with_memory(load_config(MOE, ["optimizer.master_weights=false"]))[1]
    assert all(b < a for a, b in zip(with_master, without, strict=True))
    with pytest.raises(ConfigError) as err:
        load_config(MOE, ["optimizer.master_weights=bf16"])
    assert err.value.key == "optimizer.master_weights"


def test_automodels_qwen3_run_fits_with_its_bf16_training_state():
    """8 H100s, EP 8: each rank holds 16 of the 128 experts whole (3.62B parameters) and an eighth of the rest; at
    16 bytes a parameter that state alone is 56.9 GiB and the peak over HBM less the reserve, at 8 it is 28.4 GiB."""
    run = find_published(["automodel-qwen3-30b-a3b-h100-8gpu"], Path("validation/published"))[0]
    cfg = load_config(run.config)
    assert cfg.model.master_weights is False
    _, peaks, hbm, reserve = estimate_with_memory(cfg)
    assert max(peaks) <= hbm - reserve
    mixed = load_config({**run.config, "optimizer": {**run.config["optimizer"], "master_weights": True}})
    _, mixed_peaks, _, _ = estimate_with_memory(mixed)
    assert (max(mixed_peaks) - max(peaks)) / GiB == pytest.approx(56.87 - 28.44, abs=0.05)
