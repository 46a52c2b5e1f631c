"""The H100 attention curve is the kernel the run's stack calls: cuDNN's fused attention for Transformer Engine (the
h100 profile), FlashAttention-2 for stacks calling it themselves (h100-fa2). The cuDNN curve is derived from cited
figures (traces/profiles/sources/h100.yaml, attention_efficiency.derivation); these tests recompute it."""

import pytest
import yaml

from piper_sim.paths import data_dir
from piper_sim.workload.cost import TaskCoster
from piper_sim.workload.presets import load_model
from piper_sim.workload.profile_load import load_profile

PEAK_TFLOPS = 989


def _sources(name: str) -> dict:
    return yaml.safe_load((data_dir("traces/profiles") / "sources" / f"{name}.yaml").read_text())


def _cudnn_fwd_bwd_tflops(fig: dict) -> list[float]:
    """cuDNN's causal forward+backward speed: FA2's measured pair split into its forward and backward, each
    divided by cuDNN's speed-up over FA2 in that pass (the derivation the sources file states)."""
    out = []
    for i in range(len(fig["seq_len"])):
        fa2_total_s = 3.5 / fig["fa2_fwd_bwd_causal"]["values"][i]
        fa2_forward_s = 1 / fig["fa2_forward_causal"]["values"][i]
        fa2_backward_s = fa2_total_s - fa2_forward_s
        forward_speedup = fig["cudnn_forward_causal"]["values"][i] / fig["fa2_forward_causal"]["values"][i]
        backward_speedup = fig["cudnn_backward"]["values"][i] / fig["fa2_backward"]["values"][i]
        out.append(3.5 / (fa2_forward_s / forward_speedup + fa2_backward_s / backward_speedup))
    return out


def test_the_h100_curve_is_recomputed_from_the_cited_figures():
    entry = _sources("h100")["attention_efficiency"]
    fig = entry["figures_TFLOPs"]
    expected = [3 / 3.5 * tf / PEAK_TFLOPS for tf in _cudnn_fwd_bwd_tflops(fig)]
    profile = load_profile("h100").attention_efficiency
    assert list(profile.x) == fig["seq_len"] == [pt["seq_len"] for pt in entry["points"]]
    for eff, want, point in zip(profile.efficiency, expected, entry["points"], strict=True):
        assert eff == pytest.approx(want, abs=5e-4)
        assert point["value"] == eff and point["status"] == "derived"
    assert "FusedAttention preference on Hopper" in entry["kernel"]


def test_the_fa2_profile_is_the_measured_fa2_pair_and_everything_else_is_the_h100s():
    fa2, h100 = load_profile("h100-fa2"), load_profile("h100")
    measured = _sources("h100")["attention_efficiency"]["figures_TFLOPs"]["fa2_fwd_bwd_causal"]["values"]
    for eff, tflops in zip(fa2.attention_efficiency.efficiency, measured, strict=True):
        assert eff == pytest.approx(3 / 3.5 * tflops / PEAK_TFLOPS, abs=5e-4)
    assert fa2.gemm_efficiency == h100.gemm_efficiency and fa2.hbm_bytes_per_s == h100.hbm_bytes_per_s
    assert fa2.peak_flops_per_s == h100.peak_flops_per_s and fa2.memory_efficiency == h100.memory_efficiency


def test_the_attention_core_costs_what_its_kernel_runs():
    """Same layer, two stacks: only the attention core's time differs, by the curves' ratio at the sequence."""
    model = load_model(
        {
            "name": "dense-t",
            "num_layers": 1,
            "d_model": 4096,
            "num_heads": 32,
            "num_kv_heads": 8,
            "vocab_size": 32000,
            "seq_len": 4096,
            "expert_ffn_dim": 14336,
            "num_experts": 1,
            "top_k": 1,
            "num_dense_layers": 1,
            "dense_ffn_dim": 14336,
        }
    )
    te, fa2 = (TaskCoster(model, load_profile(name), 4096) for name in ("h100", "h100-fa2"))
    for phase in ("forward", "backward"):
        core_te = te.cost_terms(phase, ("attn_core:0",))["attention"]
        core_fa2 = fa2.cost_terms(phase, ("attn_core:0",))["attention"]
        assert core_fa2 / core_te == pytest.approx(0.411 / 0.255, rel=1e-9)
        assert te.cost_terms(phase, ("dense:0",)) == fa2.cost_terms(phase, ("dense:0",))
