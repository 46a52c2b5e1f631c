"""fp8 as a precision of the cost model (cost.precision: fp8, workload/precision.py): the linears' GEMMs at the fp8
peak times the profile's ratio, exactly the quantize traffic around them, bf16 everywhere else, the fp8 weight copies
and fp8 activations in memory, MFU over both peaks, and the refusals."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml

from piper_sim.analysis.run_report import mfu_over_peak
from piper_sim.config import load_config
from piper_sim.errors import ConfigError
from piper_sim.paths import data_dir
from piper_sim.planning.estimate_report import estimate_report
from piper_sim.schedule.ir import Layout, VirtualStages
from piper_sim.workload.cost import TaskCoster
from piper_sim.workload.memory import layer_activation_bytes, rank_params, routed_row_bytes
from piper_sim.workload.parallel import ParallelSpec
from piper_sim.workload.presets import load_model
from piper_sim.workload.profile_load import PROFILE_SCHEMA, load_profile
from piper_sim.workload.stage_memory import stage_memory_terms

PEAK, FP8_PEAK, RATIO, HBM, EFF = 100e12, 200e12, 0.9, 1000e9, 0.8
PROFILE = {
    "name": "t",
    "device": "t",
    "peak_bf16_TFLOPS": 100,
    "hbm_GiB": 64,
    "hbm_bandwidth_GBps": 1000,
    "gemm_efficiency": {"rows": [1, 1024], "efficiency": [0.8, 0.8]},
    "attention_efficiency": {"seq_len": [1, 4096], "efficiency": [0.5, 0.5]},
    "peak_fp8_TFLOPS": 200,
    "fp8_gemm_efficiency_ratio": RATIO,
}
D, F, TOKENS = 4096, 16384, 4096


def _dense(fp8_recipe: str = "", **extra):
    return (
        load_model(
            {
                "name": "gpt",
                "num_layers": 2,
                "d_model": D,
                "num_heads": 32,
                "vocab_size": 51200,
                "seq_len": 2048,
                "expert_ffn_dim": F,
                "num_experts": 1,
                "top_k": 1,
                "expert_matrices": 2,
                "num_dense_layers": 2,
                "dense_ffn_dim": F,
                "dense_matrices": 2,
                **extra,
            }
        )
        if not fp8_recipe
        else replace(_dense(**extra), fp8_recipe=fp8_recipe)
    )


def _moe(fp8_recipe: str = ""):
    model = load_model(
        {
            "name": "moe",
            "num_layers": 2,
            "d_model": 2048,
            "num_heads": 16,
            "vocab_size": 32000,
            "seq_len": 2048,
            "expert_ffn_dim": 1024,
            "num_experts": 8,
            "top_k": 2,
            "expert_matrices": 3,
        }
    )
    return replace(model, fp8_recipe=fp8_recipe)


def _terms(model, kind="forward", ops=("dense:0",), profile=None, expert_rows=()):
    coster = TaskCoster(model, profile or load_profile(PROFILE), TOKENS)
    return coster.cost_terms(kind, ops, expert_rows), coster.cost(kind, ops, expert_rows)[0]


def test_a_gemm_bound_layer_runs_its_gemms_at_the_fp8_rate_and_adds_exactly_its_cast_traffic():
    """A dense FFN (fc1 4096 -> 16384, fc2 back) on 4096 tokens: GEMM time over (fp8 peak x ratio) / bf16 peak;
    the forward quantizes fc1's and fc2's inputs, the backward their output gradients, at 2 + 1 + 1 bytes each
    (read bf16, write the rowwise and the transposed fp8)."""
    for kind, elements in (
        ("forward", TOKENS * (D + F)),
        ("backward", TOKENS * (F + D)),
        ("backward_input", TOKENS * (F + D)),
        ("backward_weight", 0),
    ):
        bf16, _ = _terms(_dense(), kind)
        fp8, seconds = _terms(_dense("delayed"), kind)
        assert fp8["gemm"] == pytest.approx(bf16["gemm"] * PEAK / (FP8_PEAK * RATIO), rel=1e-12)
        assert fp8["memory_bound"] - bf16["memory_bound"] == pytest.approx(elements * 4 / (HBM * EFF), rel=1e-12)
        assert (fp8["launch"], fp8["attention"]) == (bf16["launch"], bf16["attention"])
        assert sum(fp8.values()) == pytest.approx(seconds, rel=1e-12)


def test_current_scaling_reads_each_tensor_once_more_and_blackwell_keeps_no_transposed_copy():
    profile = load_profile(PROFILE)
    delayed, _ = _terms(_dense("delayed"))
    current, _ = _terms(_dense("current"))
    one_layout, _ = _terms(_dense("delayed"), profile=replace(profile, fp8_transposed_copies=False))
    bf16, _ = _terms(_dense())
    elements = TOKENS * (D + F)
    assert current["memory_bound"] - delayed["memory_bound"] == pytest.approx(elements * 2 / (HBM * EFF), rel=1e-12)
    assert one_layout["memory_bound"] - bf16["memory_bound"] == pytest.approx(elements * 3 / (HBM * EFF), rel=1e-12)


@pytest.mark.parametrize("op", ["embed", "attn_core:0", "router:0", "moe_out:0", "head"])
def test_the_ops_outside_the_linears_stay_bf16(op):
    for kind in ("forward", "backward"):
        assert _terms(_moe("delayed"), kind, (op,)) == _terms(_moe(), kind, (op,))


def test_attention_projections_and_experts_run_in_fp8_with_their_cast_per_routed_row():
    """Experts: fc1 (gate and up: one input) and fc2 per routed row; the vectorized per-rank path and cost() agree."""
    rows = (300, 0, 724, 1000)
    bf16, _ = _terms(_moe(), "forward", ("experts:0",), expert_rows=rows)
    fp8, seconds = _terms(_moe("delayed"), "forward", ("experts:0",), expert_rows=rows)
    cast = sum(rows) * (2048 + 1024) * 4 / (HBM * EFF)
    assert fp8["memory_bound"] - bf16["memory_bound"] == pytest.approx(cast, rel=1e-12)
    assert fp8["gemm"] < bf16["gemm"] and sum(fp8.values()) == pytest.approx(seconds, rel=1e-12)
    coster = TaskCoster(_moe("delayed"), load_profile(PROFILE), TOKENS)
    vector, _ = coster.experts_cost("backward_expert", "experts:0", np.array([rows]), np.array([4]))
    assert vector[0] == pytest.approx(coster.cost("backward_expert", ("experts:0",), rows)[0], rel=1e-12)
    attn_bf16, _ = _terms(_moe(), "forward", ("attn:0",))
    attn_fp8, _ = _terms(_moe("delayed"), "forward", ("attn:0",))
    assert attn_fp8["gemm"] < attn_bf16["gemm"] and attn_fp8["attention"] == attn_bf16["attention"]


def test_h100_prices_a_wide_fp8_gemm_at_the_measured_fp8_best():
    """The profile's widest GEMMs of 2048 rows run at 1979 x 0.8822 x 0.803 TFLOPS: Bekman's fp8 MAMF, 1402.6."""
    from piper_sim.workload.flops import Gemm
    from piper_sim.workload.roofline import gemm_time_s

    gemm = Gemm(2048, 8192, 8192)
    assert gemm.flops / gemm_time_s(load_profile("h100"), gemm, 2, fp8=True) / 1e12 == pytest.approx(1402.6, rel=2e-3)


def _stage_terms(model, transposed=True):
    parallel = ParallelSpec(pp=1, ep=1, num_microbatches=1, micro_batch_size=1)
    layers = ((0, 1),)
    params = rank_params(model, layers[0], first=True, last=True, ep=1)
    return stage_memory_terms(
        model,
        layers,
        [0],
        parallel,
        params,
        flash_attention=True,
        recompute="none",
        recompute_layers=None,
        zero=0,
        stages=VirtualStages(Layout.INTERLEAVED, 1, 1),
        fp8_transposed_copies=transposed,
    )


def test_memory_grows_by_the_fp8_weight_copies_of_the_linears_only():
    """Two dense layers: attention 4 d^2 and FFN 2 d F per layer are fp8 linears; embedding, head, norms are not.
    Hopper keeps 2 bytes per such parameter (rowwise and transposed), Blackwell 1; training state is unchanged."""
    linears = 2 * (4 * D * D + 2 * D * F)
    bf16 = _stage_terms(_dense())
    hopper, blackwell = _stage_terms(_dense("delayed")), _stage_terms(_dense("delayed"), transposed=False)
    assert hopper["fp8_params"] == linears and bf16["fp8_params"] == 0
    assert hopper["state"] - bf16["state"] == 2 * linears
    assert blackwell["state"] - bf16["state"] == linears


def test_activations_keep_the_linears_inputs_in_fp8():
    """A dense layer: the QKV input and the fc1 input (norm outputs) and the fc2 input at 1 byte instead of 2 (T d,
    T d, T F fewer bytes), the attention output's fp8 copy besides its bf16 one (T d more); a routed row keeps its fc1
    and fc2 inputs in fp8 (d + F fewer)."""
    t = 2048
    delta = layer_activation_bytes(_dense("delayed"), 0, 1, keep_scores=False) - layer_activation_bytes(
        _dense(), 0, 1, keep_scores=False
    )
    assert delta == -t * D - t * D - t * F + t * D
    assert routed_row_bytes(_moe()) - routed_row_bytes(_moe("delayed")) == 2048 + 1024


def test_mfu_is_over_the_bf16_peak_and_mfu_fp8_peak_over_the_fp8_peak():
    assert mfu_over_peak(1e15, 2.0, 4, None) is None
    assert mfu_over_peak(1e15, 2.0, 4, 1e14) == pytest.approx(1.25)
    config = {
        "model": "x-moe-small",
        "topology": "dgx-h100-superpod",
        "cost": {"profile": "h100"},
        "parallel": {"pp": 2, "ep": 4, "num_microbatches": 8, "micro_batch_size": 1},
    }
    bf16 = estimate_report(load_config(config))
    fp8 = estimate_report(load_config(config, ["cost.precision=fp8"]))
    assert bf16.mfu_fp8_peak is None and fp8.step_time_s < bf16.step_time_s
    assert fp8.mfu_fp8_peak == pytest.approx(fp8.mfu * 989 / 1979, rel=1e-12)
    assert fp8.mfu == pytest.approx(fp8.model_flops_per_step / (fp8.step_time_s * 8 * 989e12), rel=1e-12)
    assert max(fp8.peak_memory_bytes) > max(bf16.peak_memory_bytes)


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("cost.precision=fp16", "cost.precision"),
        ("cost.precision=true", "cost.precision"),
        ("cost.fp8_recipe=current", "cost.fp8_recipe"),
        ("model.fp8_recipe=delayed", "model.fp8_recipe"),
    ],
)
def test_a_bad_precision_is_one_clear_error(override, key):
    with pytest.raises(ConfigError) as err:
        load_config("tiny-moe", [override])
    assert err.value.key == key


def test_fp8_is_refused_on_a_profile_without_an_fp8_peak():
    for name in ("a100", "mi250x"):
        assert load_profile(name).peak_fp8_flops_per_s is None
        with pytest.raises(ConfigError) as err:
            TaskCoster(_dense("delayed"), load_profile(name), TOKENS)
        assert (err.value.key, err.value.value) == ("cost.precision", "fp8")
    with pytest.raises(ConfigError, match="fp8_gemm_efficiency_ratio"):
        load_profile({k: v for k, v in PROFILE.items() if k != "peak_fp8_TFLOPS"})
    with pytest.raises(ConfigError, match="peak_fp8_TFLOPS"):
        load_profile({**PROFILE, "peak_fp8_TFLOPS": 0})


def test_a_real_run_refuses_fp8(tmp_path: Path):
    from piper_sim.measure import measure

    with pytest.raises(ConfigError) as err:
        measure(load_config("tiny-moe", ["cost.precision=fp8"]), tmp_path)
    assert (err.value.key, err.value.value) == ("cost.precision", "fp8")


def test_the_resolved_config_says_fp8_in_its_cost_section_and_reads_back():
    cfg = load_config("tiny-moe", ["cost.precision=fp8", "cost.fp8_recipe=current"])
    resolved = cfg.resolved()
    assert "fp8_recipe" not in resolved["model"] and resolved["cost"]["precision"] == "fp8"
    assert load_config(resolved).model == cfg.model and cfg.model.fp8_recipe == "current"


@pytest.mark.parametrize("name", ["h100", "h200", "b200", "gb200", "mi300x"])
@pytest.mark.parametrize("key", ["peak_fp8_TFLOPS", "fp8_gemm_efficiency_ratio", "fp8_transposed_copies"])
def test_each_fp8_rate_of_a_shipped_profile_is_cited_and_an_assumed_one_is_the_default(name, key):
    entry = yaml.safe_load((data_dir("traces/profiles") / "sources" / f"{name}.yaml").read_text())[key]
    loaded = {
        "peak_fp8_TFLOPS": load_profile(name).peak_fp8_flops_per_s / 1e12,
        "fp8_gemm_efficiency_ratio": load_profile(name).fp8_gemm_efficiency_ratio,
        "fp8_transposed_copies": load_profile(name).fp8_transposed_copies,
    }[key]
    assert loaded == pytest.approx(entry["value"], abs=5e-4)
    if entry["status"] == "assumed":
        assert entry["value"] == PROFILE_SCHEMA[key]
    else:
        assert entry["status"] in ("measured", "derived") and entry.get("source"), (name, key)


def test_the_planner_prices_every_plan_in_the_precision_fixed():
    from piper_sim.planning.plan_fixes import parse_fixes, split_settings
    from piper_sim.planning.planner import PlanRequest, screen

    fixed, settings = split_settings(parse_fixes(["cost.precision=fp8"]))
    assert (fixed, settings) == ({}, {"precision": "fp8"})
    base = {
        "model": "x-moe-small",
        "num_gpus": 8,
        "global_batch": 64,
        "topology": "dgx-h100-superpod",
        "fixed": {"pp": (1,), "ep": (8,), "micro_batch_size": (4,), "schedule": ("1f1b",), "zero": (1,)},
    }
    fp8_model, fp8_table, *_ = screen(PlanRequest(**base, **settings))
    bf16_model, bf16_table, *_ = screen(PlanRequest(**base))
    assert (fp8_model.fp8_recipe, bf16_model.fp8_recipe) == ("delayed", "")
    assert (fp8_table["est_step_time_s"] < bf16_table["est_step_time_s"]).all()
    assert (fp8_table["peak_memory_bytes"] != bf16_table["peak_memory_bytes"]).all()  # weight copies, fp8 inputs
    with pytest.raises(ConfigError, match="one of bf16, fp8"):
        parse_fixes(["cost.precision=fp16"])
