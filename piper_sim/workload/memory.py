"""Memory model per rank: training state of the parameters it holds, activations per microbatch.

Owns the byte formulas of Piper's resource model (DESIGN.md section 6; Dash and Wang 2026):
16 bytes of training state per parameter (fp16 weight and grad, fp32 master, Adam m and v);
activations per layer and micro-batch of b sequences of length s: 12 b s d for attention, plus
4 b H s^2 for the score matrix when attention is not fused (flash attention keeps none), plus
2 b s k (3 d_ffn + d) for routed experts (k copies of each token through the expert FFN);
dense FFNs 2 b s (m d_ffn + d); the last stage also keeps fp32 logits, 4 b s V. The formula's
constants are for 2-byte (fp16/bf16) activations; other dtypes scale them by dtype_bytes / 2.
Must not import simpy or torch.
"""

from __future__ import annotations

from piper_sim.workload.model import ModelSpec

STATE_BYTES_PER_PARAM = 16


def rank_params(model: ModelSpec, layers: tuple[int, ...], *, first: bool, last: bool, ep: int) -> dict[str, float]:
    """Parameters one rank holds for these layers: replicated ("dense") and sharded experts ("expert")."""
    dense = expert = 0.0
    emb = model.vocab_size * model.d_model
    if first:
        dense += emb
    if last:
        dense += model.d_model + (0 if model.tie_embeddings and first else emb)
    for layer in layers:
        dense += model.attention_params()
        if model.is_moe_layer(layer):
            moe = model.moe_layer_ffn_params()
            routed = model.num_experts * model.expert_params()
            dense += moe - routed
            expert += routed / ep
        else:
            dense += model.dense_ffn_params()
    return {"dense": dense, "expert": expert}


def activation_bytes(model: ModelSpec, layers: tuple[int, ...], micro_batch_size: int, *, last: bool,
                     flash_attention: bool = True) -> float:
    """Activations one micro-batch leaves on a rank between its forward and backward for these layers."""
    b, s, d, k = micro_batch_size, model.seq_len, model.d_model, model.top_k
    total = 0.0
    for layer in layers:
        total += 12 * b * s * d
        if not flash_attention:
            total += 4 * b * model.num_heads * s * s
        if model.is_moe_layer(layer):
            total += 2 * b * s * k * (3 * model.expert_ffn_dim + d)
            if model.num_shared_experts:
                total += 2 * b * s * model.num_shared_experts * (3 * model.shared_ffn_dim + d)
        else:
            width = model.dense_ffn_dim or model.expert_ffn_dim
            total += 2 * b * s * (model.dense_matrix_count * width + d)
    total *= model.dtype_bytes / 2
    if last:
        total += model.dtype_bytes * b * s * d + 4 * b * s * model.vocab_size
    return total
