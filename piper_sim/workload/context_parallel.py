"""Context parallelism (CP): the facts of a plan that splits each micro-batch's sequence over cp ranks.

Owns the checks of parallel.cp against the rest of a config, the model a CP rank's activations are priced on, the
bytes of the K/V ring, its receive buffers and the load-balanced chunk order (docs/context-parallel.md). Pure data:
must not import piper_sim.schedule, simpy, torch or numpy.

As Megatron-core runs it (docs/source/api-guide/context_parallel.rst; Transformer Engine's
AttnFuncWithCPAndKVP2P, transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py, cp_comm_type
p2p):
- every module but the attention core works on the rank's own tokens, seq_len / cp of each sequence; with a
  causal mask the sequence is cut into 2 x cp chunks and rank i holds chunks i and 2 cp - 1 - i, so every rank has
  the same share of the causal work (megatron/training/utils.py get_batch_on_this_cp_rank);
- the attention core needs the keys and values of the whole sequence: in the forward they go around the CP ring
  (an all-gather turned into cp - 1 point-to-point steps, each overlapped with the core's step on the chunk already
  there); in the backward the keys and values go around again and their gradients go back (a reduce-scatter, cp - 1
  steps); each rank keeps only its own chunk's K and V between the passes;
- Transformer Engine's forward keeps each step's receive buffer until the layer's attention returns (p2p_comm_buffers,
  one per step: the whole sequence's K and V), its backward two K/V and two dK/dV buffers;
- the CP ranks are data-parallel ranks of the dense layers (their gradients reduced over DP x CP) and the MoE layers
  route each rank's own tokens (the experts carved out of tp x cp x dp: megatron/core/parallel_state.py).
"""

from __future__ import annotations

from dataclasses import replace

from piper_sim.errors import ConfigError
from piper_sim.workload.model import ModelSpec
from piper_sim.workload.parallel import ParallelSpec

BACKWARD_RING_BUFFERS = 4  # TE's backward: p2p_comm_buffers, two of (K/V, dK/dV)


def check_context_parallel(parallel: ParallelSpec, flash_attention: bool) -> None:
    """A CP plan's requirements beyond the mesh's (ParallelSpec checks those): the fused attention kernel."""
    if parallel.cp > 1 and not flash_attention:
        raise ConfigError(
            "parallel.cp",
            parallel.cp,
            "1 with cost.flash_attention false: ring attention runs the "
            "fused (flash) attention kernel on each K/V chunk (Megatron-core's context parallelism "
            "needs Transformer Engine's fused attention)",
        )


def rank_view(model: ModelSpec, cp: int) -> ModelSpec:
    """The model as one CP rank's activations see it: sequences of seq_len / cp tokens (its two chunks). The
    attention core's work is not this view's (its keys span the whole sequence: flops.op_work prices it on the
    rank's tokens against model.seq_len)."""
    return model if cp == 1 else replace(model, seq_len=model.seq_len // cp)


def kv_elements_per_token(model: ModelSpec, tp: int) -> float:
    """Elements of K and V per token on a rank of its tensor-parallel group: the key/value heads' (GQA: kv_heads;
    MLA: every head's up-projected key and value, as Transformer Engine exchanges them)."""
    if model.mla is not None:
        m = model.mla
        return model.num_heads / tp * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim)
    return 2 * max(model.kv_heads // tp, 1) * model.attn_head_dim


def kv_chunk_bytes(model: ModelSpec, parallel: ParallelSpec) -> float:
    """K and V of one micro-batch's tokens on one CP rank (its sequence chunks): what each ring step sends."""
    return kv_bytes(model, parallel.tokens_per_microbatch(model.seq_len), parallel.tp)


def kv_bytes(model: ModelSpec, tokens: float, tp: int) -> float:
    """K and V of `tokens` tokens on a rank of a tensor-parallel group of tp."""
    return tokens * kv_elements_per_token(model, tp) * model.dtype_bytes


def ring_bytes_per_layer(model: ModelSpec, parallel: ParallelSpec) -> dict[str, float]:
    """Bytes one rank sends around the CP ring for one layer of one micro-batch: the forward's K/V (cp - 1 steps),
    the backward's K/V again and its dK/dV (cp - 1 steps each)."""
    step = kv_chunk_bytes(model, parallel) * (parallel.cp - 1)
    return {"forward": step, "backward": 2 * step}


def ring_buffer_bytes(model: ModelSpec, parallel: ParallelSpec) -> float:
    """The ring's receive buffers while one layer's attention runs (module docstring): the forward's cp chunks of
    K/V, or the backward's four, whichever is larger; 0 without context parallelism."""
    if parallel.cp == 1:
        return 0.0
    return max(parallel.cp, BACKWARD_RING_BUFFERS) * kv_chunk_bytes(model, parallel)


def chunk_order(cp: int) -> list[tuple[int, int]]:
    """The two of the sequence's 2 x cp chunks each CP rank holds, in rank order: (i, 2 cp - 1 - i)."""
    return [(i, 2 * cp - 1 - i) for i in range(cp)]
