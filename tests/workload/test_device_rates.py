"""The device rates behind the compute terms of an error budget: GEMMs at the share of the sweep's rate a GEMM keeps
back-to-back in training (gemm_sustained_factor) and elementwise traffic at measured HBM bandwidth
(memory_efficiency), each from cited micro-level measurements (traces/profiles/sources/)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import yaml

from piper_sim.errors import ConfigError
from piper_sim.paths import data_dir
from piper_sim.workload.cost import TaskCoster
from piper_sim.workload.flops import Gemm, OpWork
from piper_sim.workload.presets import load_model
from piper_sim.workload.profile_load import load_profile
from piper_sim.workload.roofline import gemm_time_s, work_terms_s

BASE = {
    "name": "t",
    "device": "t",
    "peak_bf16_TFLOPS": 100,
    "hbm_GiB": 64,
    "hbm_bandwidth_GBps": 1000,
    "gemm_efficiency": {"rows": [1, 1024], "efficiency": [0.8, 0.8]},
    "attention_efficiency": {"seq_len": [1, 4096], "efficiency": [0.5, 0.5]},
}


def test_a_compute_bound_gemm_takes_its_flops_over_the_sustained_rate():
    p = load_profile({**BASE, "gemm_sustained_factor": 0.5})
    gemm = Gemm(4096, 4096, 4096)
    assert gemm_time_s(p, gemm, 2) == pytest.approx(gemm.flops / (100e12 * 0.8 * 0.5), rel=1e-12)
    assert gemm_time_s(p, gemm, 2) == pytest.approx(2 * gemm_time_s(load_profile(BASE), gemm, 2), rel=1e-12)


def test_a_memory_bound_gemm_keeps_its_traffic_time():
    """A GEMV is bound by its weight matrix's traffic, which the power-limited clock does not slow."""
    p = load_profile({**BASE, "gemm_sustained_factor": 0.5, "memory_efficiency": 0.5})
    gemv = Gemm(1, 8192, 8192)
    traffic = 2 * (8192 + 8192 * 8192 + 8192)
    assert gemm_time_s(p, gemv, 2) == pytest.approx(traffic / (1000e9 * 0.5), rel=1e-12)


def test_the_factor_defaults_to_one_and_must_be_a_fraction():
    assert load_profile(BASE).gemm_sustained_factor == 1.0
    for bad in (0, 1.5, -0.2, "fast"):
        with pytest.raises(ConfigError, match="gemm_sustained_factor"):
            load_profile({**BASE, "gemm_sustained_factor": bad})


def test_a100_prices_an_8192_cube_at_the_sustained_random_data_rate():
    """He's A100 8192^3 GEMM on torch.randn, back to back: 257 TFLOPS; the profile's rows curve at 8192 rows (0.920)
    times the factor 0.926 over 312 TFLOPS gives 265.8 (the curve is measured at width 12288, the sweep's 8192^3
    point at 277.6; 277.6 x 0.926 = 257)."""
    p = load_profile("a100")
    gemm = Gemm(8192, 8192, 8192)
    tflops = gemm.flops / gemm_time_s(p, gemm, 2) / 1e12
    assert tflops == pytest.approx(312 * 0.920 * 0.926, rel=1e-3)
    assert tflops < 277.6  # below the single-launch sweep's own figure at that shape


def test_a100_elementwise_traffic_runs_at_babelstream_triad_bandwidth():
    """Traffic of a kernel kind the profile has no measured share for (copies) runs at memory_efficiency."""
    p = load_profile("a100")
    assert "copy" not in p.memory_kernel_efficiency
    work = OpWork(traffic=(("copy", 1.7248e9),), num_kernels=0)
    assert work_terms_s(p, work, 2)["memory_bound"] == pytest.approx(1.7248e9 / (2039e9 * 0.846), rel=1e-12)
    assert work_terms_s(p, work, 2)["memory_bound"] < 1.7248e9 / (2039e9 * 0.8)  # faster than the old assumption


def test_a_dense_layer_slows_by_the_factor_in_gemms_only():
    """On a whole op the GEMM term grows by exactly 1 / factor where GEMMs are compute-bound, the memory-bound term
    stays: the direction and size the mechanism claims."""
    model = _gpt_small()
    a100 = load_profile("a100")
    single_launch = replace(a100, gemm_sustained_factor=1.0)
    sustained = TaskCoster(model, a100, 4096).cost_terms("forward", ("dense:0",))
    burst = TaskCoster(model, single_launch, 4096).cost_terms("forward", ("dense:0",))
    assert sustained["gemm"] == pytest.approx(burst["gemm"] / 0.926, rel=1e-9)
    assert sustained["memory_bound"] == burst["memory_bound"]


def _gpt_small():
    return load_model(
        {
            "name": "gpt-s",
            "num_layers": 2,
            "d_model": 4096,
            "num_heads": 32,
            "vocab_size": 51200,
            "seq_len": 2048,
            "expert_ffn_dim": 16384,
            "num_experts": 1,
            "top_k": 1,
            "expert_matrices": 2,
            "num_dense_layers": 2,
            "dense_ffn_dim": 16384,
            "dense_matrices": 2,
        }
    )


@pytest.mark.parametrize("name", ["a100", "h100", "mi250x", "mi250x-xmoe", "h200", "b200", "gb200", "mi300x"])
@pytest.mark.parametrize("key", ["memory_efficiency", "gemm_sustained_factor"])
def test_each_rate_of_a_shipped_profile_is_cited_and_an_assumed_one_is_the_default(name, key):
    """The value the profile loads with is the one its sources file lists; measured or derived with a source, or,
    where no measurement was found, 'assumed' and then only the schema default (no chosen number)."""
    from piper_sim.workload.profile_load import PROFILE_SCHEMA

    sources = _sources(name)
    if key not in sources:  # a profile that extends another takes its rates and their sources
        sources = _sources(sources["extends"])
    entry = sources[key]
    assert getattr(load_profile(name), key) == pytest.approx(entry["value"], abs=5e-4)
    if entry["status"] == "assumed":
        assert entry["value"] == PROFILE_SCHEMA[key]
    else:
        assert entry["status"] in ("measured", "derived") and entry.get("source"), (name, key)


def _sources(name: str) -> dict:
    return yaml.safe_load((data_dir("traces/profiles") / "sources" / f"{name}.yaml").read_text())
