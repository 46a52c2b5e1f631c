"""Selective recomputation's modules (recompute_modules, Megatron-core's names; workload/recompute.py): what each
discards from a layer's activations, the kernels it re-runs and what they cost, the config's checks and the torch
backend's refusal, and the published run that recomputed the norms and the MoE activation."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from piper_sim.config import load_config
from piper_sim.errors import ConfigError
from piper_sim.planning.estimate import config_estimator, estimate_config, estimate_with_memory
from piper_sim.schedule.build import build_schedule
from piper_sim.simulator import simulate
from piper_sim.workload.memory import activation_bytes, layer_activation_bytes, routed_row_bytes
from piper_sim.workload.parallel import TensorSplit
from piper_sim.workload.presets import load_model

PUBLISHED = Path(__file__).resolve().parents[2] / "validation" / "published"
SMALL = {
    "model": "small-moe",
    "topology": "uniform",
    "parallel": {"pp": 1, "num_microbatches": 3},
    "recompute": "selective",
}
SPLIT = TensorSplit(tp=2, sp=True, etp=1)  # the Qwen3 run's: norms on half the tokens, each rank routes half


def _delta(model, layer: int, modules: tuple[str, ...], split: TensorSplit = SPLIT, b: int = 2) -> float:
    return layer_activation_bytes(model, layer, b, keep_scores=False, split=split) - layer_activation_bytes(
        model, layer, b, keep_scores=False, split=split, discarded=modules
    )


def test_layernorm_discards_the_norm_outputs_megatron_keeps_as_modules_of_their_own():
    b = 2
    moe = load_model("small-moe")  # every layer MoE, standard attention: the pre-MoE norm's output only
    norm_output = 0.5 * b * moe.seq_len * moe.d_model * moe.dtype_bytes  # sp: the rank's half of the tokens
    assert _delta(moe, 0, ("layernorm",), b=b) == pytest.approx(norm_output)
    mla = load_model("deepseek-v3")  # MLA: the input norm is a module too; layers 0-2 are dense
    assert not mla.is_moe_layer(0) and mla.is_moe_layer(3)
    one = 0.5 * b * mla.seq_len * mla.d_model * mla.dtype_bytes
    assert _delta(mla, 0, ("layernorm",), b=b) == pytest.approx(one)  # the input norm's; the dense MLP fuses its own
    assert _delta(mla, 3, ("layernorm",), b=b) == pytest.approx(2 * one)
    dense = load_model({"preset": "small-moe", "num_dense_layers": 1, "dense_ffn_dim": 512})
    assert _delta(dense, 0, ("layernorm",), b=b) == 0.0  # TE fuses both norms into the next linears


@pytest.mark.parametrize("preset, etp", [("small-moe", 1), ("small-moe", 2), ("x-moe-large", 1)])
def test_moe_act_discards_one_expert_width_per_routed_row(preset, etp):
    model = load_model(preset)  # SwiGLU (3 matrices) and GELU (2) both keep fc2's input, one width
    split = TensorSplit(tp=2, sp=True, etp=etp)
    b = 1
    rows = b * model.seq_len * split.dispatch_share * model.top_k
    width = model.expert_ffn_dim / etp * model.dtype_bytes
    assert routed_row_bytes(model, etp) - routed_row_bytes(model, etp, ("moe_act",)) == pytest.approx(width)
    assert _delta(model, 0, ("moe_act",), split, b) == pytest.approx(rows * width)
    both = _delta(model, 0, ("layernorm", "moe_act"), split, b)
    assert both == pytest.approx(rows * width + 0.5 * b * model.seq_len * model.d_model * model.dtype_bytes)


def test_the_default_module_is_the_attention_core_and_without_it_the_scores_are_kept():
    model, layers, b = load_model("small-moe"), (0, 1, 2), 2
    for flash in (True, False):
        assert activation_bytes(
            model, layers, b, last=False, flash_attention=flash, recompute="selective"
        ) == activation_bytes(
            model, layers, b, last=False, flash_attention=flash, recompute="selective", modules=("core_attn",)
        )
    none = activation_bytes(model, layers, b, last=False, flash_attention=False)
    norms = activation_bytes(
        model, layers, b, last=False, flash_attention=False, recompute="selective", modules=("layernorm",)
    )
    core_too = activation_bytes(
        model, layers, b, last=False, flash_attention=False, recompute="selective", modules=("core_attn", "layernorm")
    )
    scores = 4 * b * model.num_heads * model.seq_len**2
    assert none - norms == pytest.approx(3 * b * model.seq_len * model.d_model * model.dtype_bytes)
    assert norms - core_too == pytest.approx(3 * scores)


def test_the_schedule_reruns_each_modules_kernels_before_the_backward():
    cfg = load_config({**SMALL, "recompute_modules": ["layernorm", "moe_act"]})
    program = build_schedule(cfg).stage_programs[0]
    redo = [t for t in program if t.kind.startswith("recompute") and t.microbatch == 0]
    layers = range(cfg.model.num_layers)
    assert [t.ops for t in redo if t.kind == "recompute"] == [tuple(f"moe_norm:{i}" for i in layers)]
    assert [t.ops for t in redo if t.kind == "recompute_expert"] == [(f"moe_act:{i}",) for i in layers]
    default = build_schedule(load_config(SMALL)).stage_programs[0]
    assert [t.ops for t in default if t.kind == "recompute" and t.microbatch == 0] == [
        tuple(f"attn_core:{i}" for i in layers)
    ]


def test_the_time_added_is_the_norm_and_activation_kernels_at_the_profiles_memory_rates():
    cfg = load_config({**SMALL, "recompute_modules": ["layernorm", "moe_act"], "cost": {"profile": "h100"}})
    estimator, point = config_estimator(cfg)
    m, profile = cfg.model, estimator.profile
    tokens = point.micro_batch_size * m.seq_len
    coster = estimator.coster(tokens, point.parallel.split)
    seconds, moe = estimator._recompute(coster, point.ep, tuple(range(m.num_layers)), True, "selective")
    rate = profile.hbm_bytes_per_s
    share = profile.memory_kernel_efficiency
    norm_s = 2 * tokens * m.d_model * m.dtype_bytes / (rate * share.get("norm", profile.memory_efficiency))
    act_s = tokens * m.top_k * 3 * m.expert_ffn_dim * m.dtype_bytes / (rate * share["activation"])
    per_layer = norm_s + act_s + 2 * profile.kernel_launch_s
    assert (seconds, moe) == (pytest.approx(m.num_layers * per_layer, rel=1e-12), 0)
    # the simulator runs the same tasks: one step adds them once per micro-batch (one stage, no overlap)
    base = simulate(load_config({**SMALL, "recompute": "none", "cost": {"profile": "h100"}})).report.step_time_s
    step = simulate(cfg).report.step_time_s
    assert step - base == pytest.approx(point.num_microbatches * seconds, rel=1e-6)


def test_the_simulator_and_the_estimate_hold_the_same_smaller_peak():
    cfg = load_config(
        {
            **SMALL,
            "parallel": {"pp": 2, "ep": 2, "num_microbatches": 4},
            "recompute_modules": ["core_attn", "layernorm", "moe_act"],
        }
    )
    default = load_config({**SMALL, "parallel": {"pp": 2, "ep": 2, "num_microbatches": 4}})
    peaks, default_peaks = simulate(cfg).report.peak_memory_bytes, simulate(default).report.peak_memory_bytes
    assert all(p < d for p, d in zip(peaks, default_peaks, strict=True))
    assert estimate_with_memory(cfg)[1] == pytest.approx(peaks, rel=1e-9)


@pytest.mark.parametrize(
    "raw",
    [
        {"recompute": "full", "recompute_modules": ["moe_act"]},
        {"recompute": "none", "recompute_modules": ["core_attn"]},
        {"recompute_modules": ["mlp"]},
        {"recompute_modules": []},
        {"recompute_modules": "moe_act"},
        {"recompute_modules": ["moe_act", "moe_act"]},
        {"recompute_modules": [1]},
        {"recompute_modules": ["layernorm"], "cost": {"precision": "fp8", "profile": "h100"}},
    ],
)
def test_the_key_is_checked(raw):
    with pytest.raises(ConfigError) as err:
        load_config({**SMALL, **raw})
    assert err.value.key == "recompute_modules"


def test_real_runs_refuse_modules_the_torch_backend_does_not_recompute(tmp_path):
    from piper_sim.measure import measure

    with pytest.raises(ConfigError) as err:
        measure(load_config({**SMALL, "recompute_modules": ["core_attn", "moe_act"]}), tmp_path)
    assert err.value.key == "recompute_modules"


def test_the_published_qwen3_run_that_recomputed_norms_and_activations_fits():
    run = yaml.safe_load((PUBLISHED / "mcore-qwen3-235b-h100-256gpu-tp2-ep32.yaml").read_text())
    cfg = load_config(run["config"])
    assert cfg.recompute_modules == ("layernorm", "moe_act")
    assert estimate_config(cfg)[1]
    without = load_config({k: v for k, v in run["config"].items() if k != "recompute_modules"} | {"recompute": "none"})
    assert not estimate_config(without)[1]  # the memory those modules free is what lets it fit


def test_skewed_routing_prices_and_frees_the_activation_over_the_rows_each_rank_got():
    """Balanced pricing would add the same time and free the same bytes under both routings; the busiest rank's
    experts get more rows under zipf, so re-running their activation takes longer and frees more."""
    base = {**SMALL, "parallel": {"pp": 1, "ep": 2, "num_microbatches": 2}, "cost": {"profile": "h100"}}
    added, freed = {}, {}
    for name, routing in (("uniform", {"kind": "uniform"}), ("zipf", {"kind": "zipf", "exponent": 1.5})):
        none = simulate(load_config({**base, "routing": routing, "recompute": "none"})).report
        act = simulate(load_config({**base, "routing": routing, "recompute_modules": ["moe_act"]})).report
        added[name] = act.step_time_s - none.step_time_s
        freed[name] = none.peak_memory_bytes[0] - act.peak_memory_bytes[0]
    assert added["zipf"] > added["uniform"] * 1.01 and freed["zipf"] > freed["uniform"] * 1.1
