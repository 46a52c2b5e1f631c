"""Memory-bound kernels priced by kind: op_work reports its traffic by kernel kind (norm, activation, dropout...), a
profile's memory_kernel_efficiency prices each kind it lists at its measured share of HBM bandwidth, and every other
kind (all of them where the profile has no table) at memory_efficiency, the same total as one sum."""

from __future__ import annotations

import pytest
import yaml

from piper_sim.errors import ConfigError
from piper_sim.paths import data_dir
from piper_sim.workload.cost import TaskCoster
from piper_sim.workload.flops import MEMORY_KINDS, kind_bytes, op_work, unfused_attention
from piper_sim.workload.parallel import TensorSplit
from piper_sim.workload.presets import load_model
from piper_sim.workload.profile_load import load_profile
from piper_sim.workload.roofline import memory_bound_s, unfused_core_s

BASE = {
    "name": "t",
    "device": "t",
    "peak_bf16_TFLOPS": 100,
    "hbm_GiB": 64,
    "hbm_bandwidth_GBps": 1000,
    "memory_efficiency": 0.8,
    "kernel_launch_us": 0,
    "gemm_efficiency": {"rows": [1, 1024], "efficiency": [0.8, 0.8]},
    "attention_efficiency": {"seq_len": [1, 4096], "efficiency": [0.5, 0.5]},
}
OPS = ("embed:0", "attn:0", "dense:0", "router:1", "shared:1", "moe_out:1", "head:0")


def _moe(dropout: float = 0.0):
    return load_model(
        {
            "name": "m",
            "num_layers": 2,
            "d_model": 1024,
            "num_heads": 16,
            "vocab_size": 32000,
            "seq_len": 2048,
            "expert_ffn_dim": 512,
            "num_experts": 8,
            "top_k": 2,
            "expert_matrices": 3,
            "num_dense_layers": 1,
            "dense_ffn_dim": 4096,
            "dense_matrices": 3,
            "num_shared_experts": 1,
            "shared_expert_ffn_dim": 512,
            "dropout": dropout,
        }
    )


def test_a_norm_op_is_its_norm_bytes_at_the_norm_share_and_the_rest_at_memory_efficiency():
    """Closed form for the attention op (its norm's in and out, rotary q and k, the q, k, v and output copies, the
    residual add, no dropout) under tensor and sequence parallelism, forward and backward."""
    model, tokens, tp = _moe(), 4096, 2
    split = TensorSplit(tp=tp, sp=True)
    profile = load_profile({**BASE, "memory_kernel_efficiency": {"norm": 0.5}})
    norm_bytes = 2 * (tokens / tp) * 1024 * 2  # in and out over the rank's 1/tp of the tokens, bf16
    copy_bytes = 4 / tp * tokens * 1024 * 2
    rest_bytes = copy_bytes + 2 * tokens * (8 + 8) * 64 * 2 + 3 * (tokens / tp) * 1024 * 2  # + rotary, residual
    expected = norm_bytes / (1000e9 * 0.5) + rest_bytes / (1000e9 * 0.8)
    coster = TaskCoster(model, profile, tokens, split=split)
    assert coster.cost_terms("forward", ("attn:0",))["memory_bound"] == pytest.approx(expected, rel=1e-12)
    backward = 1.5 * norm_bytes / (1000e9 * 0.5) + rest_bytes / (1000e9 * 0.8)  # the norm's x, dy read, dx written
    assert coster.cost_terms("backward", ("attn:0",))["memory_bound"] == pytest.approx(backward, rel=1e-12)
    plain = TaskCoster(model, load_profile(BASE), tokens, split=split).cost_terms("forward", ("attn:0",))
    assert plain["memory_bound"] == pytest.approx((norm_bytes + rest_bytes) / (1000e9 * 0.8), rel=1e-12)


def test_an_activation_share_prices_the_ffn_and_the_experts_activation():
    model, tokens = _moe(), 2048
    rows = (1024, 512, 0, 2560)
    profile = load_profile({**BASE, "memory_kernel_efficiency": {"activation": 0.25}})
    dense = TaskCoster(model, profile, tokens).cost_terms("forward", ("dense:0",))["memory_bound"]
    norm_and_residual = (2 + 3) * tokens * 1024 * 2
    assert dense == pytest.approx(
        3 * tokens * 4096 * 2 / (1000e9 * 0.25) + norm_and_residual / (1000e9 * 0.8), rel=1e-12
    )
    experts = TaskCoster(model, profile, tokens).cost_terms("forward_expert", ("experts:1",), rows)["memory_bound"]
    routed = sum(rows)
    assert experts == pytest.approx(
        routed * 3 * 512 * 2 / (1000e9 * 0.25) + routed * 2 * 1024 * 2 / (1000e9 * 0.8), rel=1e-12
    )


@pytest.mark.parametrize("op", OPS + ("experts:1",))
def test_without_a_table_every_op_keeps_its_total_at_memory_efficiency(op):
    """The fallback is the old total exactly: all bytes in one sum at memory_efficiency; a table listing every kind
    at memory_efficiency gives the same time."""
    model, tokens = _moe(dropout=0.1), 4096
    rows = (1000, 3000, 0, 4192) if op.startswith("experts") else ()
    kind = "forward_expert" if rows else "forward"
    plain = load_profile(BASE)
    work = op_work(model, op, tokens, rows)
    got = TaskCoster(model, plain, tokens).cost_terms(kind, (op,), rows)["memory_bound"]
    assert got == work.elementwise_bytes / (1000e9 * 0.8)
    every = load_profile({**BASE, "memory_kernel_efficiency": dict.fromkeys(MEMORY_KINDS, 0.8)})
    assert TaskCoster(model, every, tokens).cost_terms(kind, (op,), rows)["memory_bound"] == pytest.approx(
        got, rel=1e-12
    )


def test_op_work_reports_each_kernel_kind():
    model, tokens = _moe(dropout=0.1), 4096
    act = tokens * 1024 * 2
    attn = op_work(model, "attn:0", tokens).traffic
    assert kind_bytes(attn, "norm") == 2 * act
    assert kind_bytes(attn, "dropout") == tokens * 1024  # the byte mask of the fused bias-dropout-add
    assert kind_bytes(attn, "residual") == 3 * act
    assert kind_bytes(op_work(model, "dense:0", tokens).traffic, "activation") == 3 * tokens * 4096 * 2
    assert kind_bytes(op_work(model, "head:0", tokens).traffic, "loss") == 3 * tokens * 32000 * 4
    router = op_work(model, "router:1", tokens).traffic
    assert (kind_bytes(router, "norm"), kind_bytes(router, "permute")) == (2 * act, 2 * act)
    for op in OPS:
        assert {k for k, _ in op_work(model, op, tokens).traffic} <= set(MEMORY_KINDS), op


def test_the_unfused_cores_score_traffic_takes_the_softmax_and_dropout_shares():
    model = _moe(dropout=0.1)
    forward, _ = unfused_attention(model, 4096, 16)
    gemm_s = lambda g: 0.0  # noqa: E731 (the GEMMs aside: only the score traffic)
    shares = load_profile({**BASE, "memory_kernel_efficiency": {"softmax": 0.4, "dropout": 0.2}})
    scores = 2 * 16 * 2048 * 2048
    expected = 1.5 * 2 * scores / (1000e9 * 0.4) + (2 * 2 + 1) * scores / (1000e9 * 0.2)
    assert unfused_core_s(shares, forward, 2, gemm_s) == pytest.approx(expected, rel=1e-12)
    assert memory_bound_s(load_profile(BASE), forward.score_traffic) == forward.score_bytes / (1000e9 * 0.8)


@pytest.mark.parametrize("bad", [{"norm": 0}, {"norm": 1.5}, {"norm": "fast"}, {"relu": 0.5}, [0.5], 0.7])
def test_a_bad_table_names_the_key(bad):
    with pytest.raises(ConfigError, match="memory_kernel_efficiency"):
        load_profile({**BASE, "memory_kernel_efficiency": bad})


def test_a100_prices_a_norm_at_llmcompass_layernorm_rate():
    """LLMCompass's GPT-3 layer on an A100: LayerNorm over 201,326,592 fp16 elements in 0.68164 ms. The profile's
    norm share prices those bytes (in and out) in that time."""
    a100 = load_profile("a100")
    nbytes = 2 * 2 * 8 * 2048 * 12288
    assert memory_bound_s(a100, (("norm", nbytes),)) == pytest.approx(0.68164e-3, rel=2e-4)
    assert memory_bound_s(a100, (("copy", nbytes),)) == pytest.approx(nbytes / (2039e9 * 0.846), rel=1e-12)


@pytest.mark.parametrize("name", ["a100", "h100", "mi250x", "mi250x-xmoe"])
def test_each_kind_a_shipped_profile_lists_is_cited(name):
    """Every share a profile loads is the value its sources file lists, measured or derived, with a source; a kind
    the sources file lists is in the profile."""
    sources = _sources(name)
    if "extends" in sources and "memory_kernel_efficiency" not in sources:
        sources = _sources(sources["extends"])
    listed = {k: v for k, v in (sources.get("memory_kernel_efficiency") or {}).items() if k in MEMORY_KINDS}
    shares = load_profile(name).memory_kernel_efficiency
    assert set(shares) == set(listed), name
    for kind, entry in listed.items():
        assert shares[kind] == pytest.approx(entry["value"], abs=5e-5), (name, kind)
        assert entry["status"] in ("measured", "derived") and entry.get("source"), (name, kind)


def _sources(name: str) -> dict:
    return yaml.safe_load((data_dir("traces/profiles") / "sources" / f"{name}.yaml").read_text())
