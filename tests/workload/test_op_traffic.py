"""Each op's memory-bound bytes in closed form, kernel by kernel as Megatron-core runs a layer: input norm,
attention (rotary q and k), fused bias-dropout-add; pre-FFN norm, FFN or MoE block, fused bias-dropout-add; the final
norm and loss. A GeLU activation moves 2 elements per FFN element, SwiGLU 3."""

from __future__ import annotations

from dataclasses import replace

import pytest

from piper_sim.workload.flops import op_work
from piper_sim.workload.parallel import TensorSplit
from piper_sim.workload.presets import load_model

TOKENS = 4096  # micro-batch 2 x sequence 2048


def by_kind(op: str, model, split: TensorSplit, rows: tuple[int, ...] = ()) -> dict[str, float]:
    """An op's traffic summed per kind, the kinds with no bytes left out."""
    out: dict[str, float] = {}
    for kind, nbytes in op_work(model, op, TOKENS, rows, split).traffic:
        if nbytes:
            out[kind] = out.get(kind, 0.0) + nbytes
    return out


def _gpt_gelu():
    """A GPT-3-style dense layer: learned absolute positions (no rotary), GeLU FFN of 4h, dropout 0.1, fp16."""
    return load_model(
        {
            "name": "gpt",
            "num_layers": 2,
            "d_model": 1024,
            "num_heads": 16,
            "vocab_size": 32000,
            "seq_len": 2048,
            "expert_ffn_dim": 4096,
            "num_experts": 1,
            "top_k": 1,
            "expert_matrices": 2,
            "num_dense_layers": 2,
            "dense_ffn_dim": 4096,
            "dense_matrices": 2,
            "dropout": 0.1,
            "rotary": False,
            "dtype": "fp16",
        }
    )


def _swiglu_moe():
    """A SwiGLU MoE layer with GQA (16 heads, 4 kv heads), rotary, one shared expert, no dropout, bf16."""
    return load_model(
        {
            "name": "moe",
            "num_layers": 1,
            "d_model": 1024,
            "num_heads": 16,
            "num_kv_heads": 4,
            "vocab_size": 32000,
            "seq_len": 2048,
            "expert_ffn_dim": 512,
            "num_experts": 8,
            "top_k": 2,
            "expert_matrices": 3,
            "num_shared_experts": 1,
            "shared_expert_ffn_dim": 1024,
        }
    )


def test_a_dense_gelu_layer_under_tp_and_sp():
    """TP 2 with sequence parallelism: norms and residual adds on the rank's half of the tokens, 2-byte elements,
    1-byte dropout masks; the GeLU reads fc1's output and writes its own over the rank's half of the width."""
    model, split = _gpt_gelu(), TensorSplit(tp=2, sp=True)
    held = TOKENS / 2 * 1024  # elements of the residual stream a rank holds
    block_end = {"residual": 3 * held * 2, "dropout": held}  # bias-dropout-add: read x and residual, write sum, mask
    assert by_kind("attn:0", model, split) == pytest.approx(
        {"norm": 2 * held * 2, "copy": 4 / 2 * TOKENS * 1024 * 2, **block_end}
    )
    assert by_kind("dense:0", model, split) == pytest.approx(
        {"norm": 2 * held * 2, "activation": 2 * TOKENS * 2048 * 2, **block_end}
    )
    assert by_kind("head", model, split) == pytest.approx({"norm": 2 * held * 2, "loss": 3 * TOKENS * 16000 * 4})


def test_a_swiglu_moe_layer_with_a_shared_expert():
    """TP 2, SP, experts split like the dense layers (ETP 2): the rank routes all tokens (the router's gate and
    permutation run on them) but its norms and residual adds run on the half it holds; SwiGLU reads gate and up and
    writes their product (3 elements per expert-width element); moe_out adds the shared expert's output to the
    routed one's, then the residual."""
    model, split = _swiglu_moe(), TensorSplit(tp=2, sp=True, etp=2)
    held = TOKENS / 2 * 1024
    assert by_kind("attn:0", model, split) == pytest.approx(
        {
            "norm": 2 * held * 2,
            "rotary": 2 * TOKENS * (8 + 2) * 64 * 2,
            "copy": 4 / 2 * TOKENS * 1024 * 2,
            "residual": 3 * held * 2,
        }
    )
    assert by_kind("router:0", model, split) == pytest.approx(
        {"norm": 2 * held * 2, "permute": 2 * TOKENS * 1024 * 2, "softmax": 8 * TOKENS * 8}
    )
    assert by_kind("shared:0", model, split) == pytest.approx({"activation": 3 * TOKENS * 512 * 2})
    rows = (1000, 3000, 0, 4192)
    assert by_kind("experts:0", model, split, rows) == pytest.approx(
        {"activation": 3 * sum(rows) * 256 * 2, "copy": sum(rows) * 2 * 1024 * 2}
    )
    assert by_kind("moe_out:0", model, split) == pytest.approx(
        {"permute": 2 * TOKENS * 1024 * 2, "residual": (3 + 3) * held * 2}
    )


def test_gelu_moves_two_elements_per_ffn_element_and_swiglu_three():
    gelu = replace(_swiglu_moe(), expert_matrices=2, num_shared_experts=0)
    swiglu = _swiglu_moe()
    rows = (2048,)
    assert by_kind("experts:0", gelu, TensorSplit(), rows)["activation"] == 2 * 2048 * 512 * 2
    assert by_kind("experts:0", swiglu, TensorSplit(), rows)["activation"] == 3 * 2048 * 512 * 2


@pytest.mark.parametrize("tp", [1, 4])
def test_rotary_reads_and_writes_q_and_k_once(tp):
    """GQA: the rank's q heads and kv heads (at least one); none without rotary."""
    model = _swiglu_moe()
    q, kv = 16 // tp, max(4 // tp, 1)
    assert by_kind("attn:0", model, TensorSplit(tp=tp))["rotary"] == 2 * TOKENS * (q + kv) * 64 * 2
    plain = replace(model, rotary=False)
    assert "rotary" not in by_kind("attn:0", plain, TensorSplit(tp=tp))


def test_mla_rotates_only_the_rope_parts():
    """DeepSeek-V3 (128 heads, qk_rope_head_dim 64) on TP 4: each of the rank's 32 q heads' rope part and the one
    k_pos_emb head the heads share."""
    model = load_model("deepseek-v3")
    tokens = model.seq_len
    traffic = op_work(model, "attn:0", tokens, split=TensorSplit(tp=4)).traffic
    assert dict(traffic)["rotary"] == 2 * tokens * (32 + 1) * 64 * 2


@pytest.mark.parametrize(
    "preset, rotary",
    [
        ("mixtral-8x7b", True),
        ("qwen3-235b-a22b", True),
        ("deepseek-v3", True),
        ("x-moe-small", True),
        ("switch-base", False),
        ("glam", False),
    ],
)
def test_presets_say_whether_they_rotate(preset, rotary):
    assert load_model(preset).rotary is rotary
