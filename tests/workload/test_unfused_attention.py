"""The attention core without flash attention: its batched GEMMs write and read the score matrix themselves, and the
score traffic priced besides them is only the softmax and dropout kernels' (Megatron-LM's fused causal softmax reads
the causal half and writes whole rows; dropout reads, writes and keeps a byte mask); its backward is its own GEMMs
(one writing a score-sized gradient, three reading the matrix) and kernels, not twice the forward; the batched GEMMs
run at the rates measured for them (attention_bmm_memory_efficiency), not through the single-GEMM shape factor."""

from __future__ import annotations

import pytest
import yaml

from piper_sim.errors import ConfigError
from piper_sim.paths import data_dir
from piper_sim.workload.cost import TaskCoster
from piper_sim.workload.flops import Gemm
from piper_sim.workload.presets import load_model
from piper_sim.workload.profile_load import load_profile
from piper_sim.workload.roofline import batched_gemm_time_s, gemm_time_s

# a device whose GEMMs never bind on FLOPs: every batched GEMM takes its traffic at the bandwidth below
BASE = {
    "name": "t",
    "device": "t",
    "peak_bf16_TFLOPS": 1e9,
    "hbm_GiB": 64,
    "hbm_bandwidth_GBps": 1000,
    "memory_efficiency": 1.0,
    "kernel_launch_us": 0,
    "gemm_efficiency": {"rows": [1, 1024], "efficiency": [1.0, 1.0]},
    "attention_efficiency": {"seq_len": [1, 4096], "efficiency": [0.5, 0.5]},
}
S, HD, HEADS = 1024, 64, 4


def _model(dropout: float):
    return load_model(
        {
            "name": "gpt-t",
            "num_layers": 1,
            "d_model": HEADS * HD,
            "num_heads": HEADS,
            "vocab_size": 512,
            "seq_len": S,
            "expert_ffn_dim": 1024,
            "num_experts": 1,
            "top_k": 1,
            "expert_matrices": 2,
            "num_dense_layers": 1,
            "dense_ffn_dim": 1024,
            "dense_matrices": 2,
            "dropout": dropout,
        }
    )


def _core_s(kind: str, dropout: float, profile=None) -> float:
    coster = TaskCoster(_model(dropout), profile or load_profile(BASE), S, flash_attention=False)
    return coster.cost_terms(kind, ("attn_core:0",))["attention"]


GEMM_BYTES = 2 * HEADS * (2 * S * HD + S * S)  # one batched GEMM of the core: both operands read, output written
SCORE_BYTES = HEADS * S * S * 2  # the score matrix in 16-bit


@pytest.mark.parametrize(("dropout", "softmax_and_dropout"), [(0.0, 1.5), (0.1, 1.5 + 2.5)])
def test_the_forward_counts_the_gemms_score_traffic_once(dropout, softmax_and_dropout):
    """Q K^T writes the scores and softmax(scores) V reads them inside their own traffic; besides them the softmax
    reads the causal half and writes the matrix (1.5 matrices), dropout reads and writes it and a byte mask (2.5)."""
    expected = (2 * GEMM_BYTES + softmax_and_dropout * SCORE_BYTES) / 1e12
    assert _core_s("forward", dropout) == pytest.approx(expected, rel=1e-9)
    assert _core_s("recompute", dropout) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(("dropout", "softmax_and_dropout"), [(0.0, 2.0), (0.1, 2.0 + 2.5)])
def test_the_backward_is_its_own_four_gemms_and_kernels(dropout, softmax_and_dropout):
    """dO V^T writes the probabilities' gradient, P^T dO, dS K and dS^T Q read the matrix; the softmax's backward
    reads the gradient and output over the causal half and writes the matrix, dropout's reads the gradient and the
    mask and writes one: not twice the forward."""
    expected = (4 * GEMM_BYTES + softmax_and_dropout * SCORE_BYTES) / 1e12
    assert _core_s("backward", dropout) == pytest.approx(expected, rel=1e-9)
    split = _core_s("backward_input", dropout) + _core_s("backward_weight", dropout)
    assert split == pytest.approx(expected, rel=1e-9)  # a split backward's two passes share it


def test_a100_prices_the_measured_batched_gemms_at_their_measured_times():
    """LLMCompass's A100 GPT-3 layer: 192 heads' Q K^T (2048 x 128 x 2048) 1.881 ms and softmax(scores) V 1.183 ms;
    as one GEMM of their shape through the single-GEMM shape factor both were 2.59 ms."""
    a100 = load_profile("a100")
    shares = a100.attention_bmm_memory_efficiency
    scores, context = Gemm(2048, 128, 2048, count=192), Gemm(2048, 2048, 128, count=192)
    assert batched_gemm_time_s(a100, scores, 2, shares.writes_scores) == pytest.approx(1.8811e-3, rel=1e-3)
    assert batched_gemm_time_s(a100, context, 2, shares.reads_scores) == pytest.approx(1.1832e-3, rel=1e-3)
    assert gemm_time_s(a100, scores, 2) == pytest.approx(2.585e-3, rel=1e-3)


def test_a_profile_without_batched_rates_prices_each_as_a_gemm_of_its_shape():
    measured = load_profile({**BASE, "attention_bmm_memory_efficiency": {"writes_scores": 0.5, "reads_scores": 0.5}})
    plain = load_profile(BASE)
    assert plain.attention_bmm_memory_efficiency is None
    half = (2 * 2 * GEMM_BYTES + 1.5 * SCORE_BYTES) / 1e12  # the GEMMs' traffic at half the bandwidth
    assert _core_s("forward", 0.0, measured) == pytest.approx(half, rel=1e-9)
    assert _core_s("forward", 0.0, plain) < _core_s("forward", 0.0, measured)


@pytest.mark.parametrize("bad", [0, 1.5, -0.1, "fast", True, None])
def test_a_batched_rate_must_be_a_fraction(bad):
    with pytest.raises(ConfigError, match="attention_bmm_memory_efficiency.reads_scores"):
        load_profile({**BASE, "attention_bmm_memory_efficiency": {"writes_scores": 0.5, "reads_scores": bad}})
    with pytest.raises(ConfigError, match="attention_bmm_memory_efficiency.kind"):
        load_profile(
            {**BASE, "attention_bmm_memory_efficiency": {"writes_scores": 0.5, "reads_scores": 0.5, "kind": 1}}
        )


def test_a100_batched_rates_are_the_cited_measurements():
    sources = yaml.safe_load((data_dir("traces/profiles") / "sources" / "a100.yaml").read_text())
    entry = sources["attention_bmm_memory_efficiency"]
    shares = load_profile("a100").attention_bmm_memory_efficiency
    for key in ("writes_scores", "reads_scores"):
        assert getattr(shares, key) == pytest.approx(entry[key]["value"], abs=5e-5)
        assert entry[key]["status"] == "measured" and entry[key]["source"]


def test_flash_attention_is_unchanged_by_the_unfused_core():
    """The fused core keeps its curve and BACKWARD_FACTOR times the forward in every pass."""
    coster = TaskCoster(_model(0.1), load_profile("a100"), S)
    forward = coster.cost_terms("forward", ("attn_core:0",))["attention"]
    assert coster.cost_terms("backward", ("attn_core:0",))["attention"] == pytest.approx(2 * forward, rel=1e-12)


@pytest.mark.parametrize("name", ["h100", "mi250x", "mi250x-xmoe", "h200", "b200", "gb200", "mi300x"])
def test_a_profile_without_a_measurement_says_so_and_carries_none(name):
    sources = yaml.safe_load((data_dir("traces/profiles") / "sources" / f"{name}.yaml").read_text())
    if "attention_bmm_memory_efficiency" not in sources:  # a profile that extends another takes its sources
        sources = yaml.safe_load((data_dir("traces/profiles") / "sources" / f"{sources['extends']}.yaml").read_text())
    entry = sources["attention_bmm_memory_efficiency"]
    assert entry["status"] == "assumed" and entry["value"] is None
    assert load_profile(name).attention_bmm_memory_efficiency is None
