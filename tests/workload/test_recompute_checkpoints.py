"""Full recomputation checkpointed in groups of layers (recompute_checkpoint_layers, Megatron-LM's uniform method):
each group keeps its input and one group's activations are alive again at a time."""

from __future__ import annotations

import pytest

from piper_sim.config import load_config
from piper_sim.errors import ConfigError
from piper_sim.planning.estimate import estimate_with_memory
from piper_sim.simulator import simulate
from piper_sim.workload.memory import (
    activation_bytes,
    checkpoint_groups,
    layer_activation_bytes,
    recompute_transient_bytes,
)
from piper_sim.workload.presets import load_model

DENSE = {
    "model": {"preset": "small-moe", "num_dense_layers": 4, "num_layers": 4, "dense_ffn_dim": 512},
    "topology": "uniform",
    "parallel": {"pp": 1, "num_microbatches": 2},
    "recompute": "full",
}


def test_groups_cover_the_layers_in_order():
    assert checkpoint_groups(5, 2) == [range(0, 2), range(2, 4), range(4, 5)]
    assert checkpoint_groups(5, None) == [range(0, 5)]
    assert checkpoint_groups(3, 8) == [range(0, 3)]


def test_one_layer_groups_keep_each_layers_input_and_one_layers_activations():
    model = load_model("small-moe")
    layers, b = (0, 1, 2, 3), 2
    one_input = b * model.seq_len * model.d_model * model.dtype_bytes
    per_layer = [layer_activation_bytes(model, layer, b, keep_scores=False) for layer in layers]
    kept = {
        g: activation_bytes(model, layers, b, last=False, recompute="full", recomputed=4, checkpoint_layers=g)
        for g in (None, 1, 2)
    }
    assert kept[None] == pytest.approx(one_input) and kept[1] == pytest.approx(4 * one_input)
    assert kept[2] == pytest.approx(2 * one_input)
    transient = {
        g: recompute_transient_bytes(model, layers, b, recompute="full", recomputed=4, checkpoint_layers=g)
        for g in (None, 1, 2)
    }
    assert transient[None] == pytest.approx(sum(per_layer))
    assert transient[1] == pytest.approx(max(per_layer))
    assert transient[2] == pytest.approx(max(per_layer[0] + per_layer[1], per_layer[2] + per_layer[3]))


def test_the_simulator_and_the_estimate_hold_the_same_smaller_peak():
    chunk = simulate(load_config(DENSE)).report.peak_memory_bytes
    layer = simulate(load_config({**DENSE, "recompute_checkpoint_layers": 1})).report.peak_memory_bytes
    assert layer[0] < chunk[0]
    _, peaks, _, _ = estimate_with_memory(load_config({**DENSE, "recompute_checkpoint_layers": 1}))
    assert peaks[0] == pytest.approx(layer[0], rel=1e-9)
    # the same work either way: the schedule is the same and so is the step
    assert simulate(load_config({**DENSE, "recompute_checkpoint_layers": 1})).report.step_time_s == pytest.approx(
        simulate(load_config(DENSE)).report.step_time_s, rel=1e-12
    )


def test_the_key_is_checked_and_real_runs_refuse_it(tmp_path):
    for bad in (0, -1, "one", True):
        with pytest.raises(ConfigError) as err:
            load_config({**DENSE, "recompute_checkpoint_layers": bad})
        assert err.value.key == "recompute_checkpoint_layers"
    with pytest.raises(ConfigError):
        load_config({**DENSE, "recompute": "selective", "recompute_checkpoint_layers": 1})
    from piper_sim.measure import measure

    with pytest.raises(ConfigError) as err:
        measure(load_config({**DENSE, "recompute_checkpoint_layers": 1}), tmp_path)
    assert err.value.key == "recompute_checkpoint_layers"
