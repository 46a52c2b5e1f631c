"""fp8 training as Transformer Engine (TE) runs it under Megatron-core (cost.precision: fp8; docs/precision.md).

Owns which ops' GEMMs run in fp8, the bytes of the quantize (cast) kernels around them, the bytes of the fp8 weight
copies and of the fp8 activations kept for the backward. The rest of the model stays in its dtype (bf16): the
attention core, norms, softmax, the router, embeddings and the LM head. Pure arithmetic: must not import simpy, numpy
or torch.

- fp8 GEMMs: the TE linear layers Megatron-core builds (TELayerNormColumnParallelLinear, TERowParallelLinear,
  TEGroupedLinear): attention's QKV and output projections (MLA's projections), dense FFNs, shared and routed experts'
  fc1 and fc2; each runs its forward, dgrad and wgrad GEMMs in fp8 (HYBRID: e4m3 forward, e5m2 gradients).
- Quantizing a tensor reads it in the model's dtype and writes its fp8 rowwise copy and, on devices whose fp8 GEMMs
  need a physically transposed operand for the backward (Hopper, Ada; not Blackwell), its columnwise copy; current
  scaling reads it once more for its amax (TE docs: FP8 Current Scaling, "Performance analysis"; FP8 Delayed
  Scaling keeps one read, its amax taken inside the cast). The forward quantizes each linear's input, the backward
  its output gradient (dgrad and wgrad share it); the weights once per step (TE caches them over a step's
  micro-batches: Megatron-core's set_is_first_microbatch), both usages while training.
- Memory: the cached fp8 weights (rowwise, and columnwise where kept apart) besides the bf16 weights and the fp32
  master weights of the optimizer (training state unchanged); a linear keeps its input for the wgrad as its fp8
  columnwise copy (TE docs: Performance Considerations, "Memory usage" and "Activations saved for backward"), in
  place of the bf16 input where nothing else keeps that, besides it where another op does (the attention output,
  which the attention core's backward keeps; the MoE block's input, which the router keeps).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from piper_sim.workload.model import ModelSpec
from piper_sim.workload.ops import parse_op
from piper_sim.workload.parallel import NO_SPLIT, TensorSplit
from piper_sim.workload.task_kinds import BACKWARD_KINDS, TaskKind

PRECISIONS = ("bf16", "fp8")  # cost.precision; fp8's recipes: model.FP8_RECIPES (TE's DelayedScaling and
# Float8CurrentScaling: Megatron's --fp8-recipe delayed and tensorwise)
FP8_OPS = ("attn", "dense", "shared", "experts")  # the ops whose GEMMs are TE linears (the rest stay bf16)
FFN_OPS = ("dense", "shared", "experts")  # their GEMMs come in (fc1, fc2) pairs; fc1's gate and up share one input


class GemmShape(Protocol):
    """What cast_elements reads of a GEMM (workload.flops.Gemm)."""

    @property
    def rows(self) -> float: ...
    @property
    def k(self) -> int: ...
    @property
    def n(self) -> int: ...
    @property
    def count(self) -> int: ...


def is_fp8_op(model: ModelSpec, op: str) -> bool:
    """Whether this op's GEMMs run in fp8 for this model (its fp8_recipe set: cost.precision fp8)."""
    return bool(model.fp8_recipe) and parse_op(op)[0] in FP8_OPS


def cast_bytes_per_element(model: ModelSpec, transposed_copies: bool) -> float:
    """HBM bytes one element costs to quantize: read in the model's dtype, write the rowwise fp8 (1 byte) and the
    columnwise fp8 where the device keeps it apart (1), read again for the amax under current scaling."""
    b = model.dtype_bytes
    return b + 1 + (1 if transposed_copies else 0) + (b if model.fp8_recipe == "current" else 0)


def fp8_weight_bytes_per_param(transposed_copies: bool) -> float:
    """The cached fp8 copy of a weight: rowwise, and columnwise where the device keeps it apart (Hopper)."""
    return 2.0 if transposed_copies else 1.0


def cast_elements(op: str, gemms: Sequence[GemmShape], kind: TaskKind) -> float:
    """Elements an fp8 op quantizes in one task of this kind, for these GEMMs of its forward: a forward (or
    recompute) its linears' inputs (an FFN's fc1 gate and up read one input), a backward (or its input pass) their
    output gradients; a weight pass none (it reuses the columnwise copies the input pass and forward made)."""
    if kind == TaskKind.BACKWARD_WEIGHT:
        return 0.0
    if kind in BACKWARD_KINDS:
        return float(sum(g.rows * g.n * g.count for g in gemms))
    if parse_op(op)[0] not in FFN_OPS:
        return float(sum(g.rows * g.k * g.count for g in gemms))
    pairs = zip(gemms[::2], gemms[1::2], strict=True)  # (fc1, fc2) of each group of experts (or the one FFN)
    return float(sum((fc1.rows * fc1.k + fc2.rows * fc2.k) * fc2.count for fc1, fc2 in pairs))


def non_fp8_params(model: ModelSpec, layers: Sequence[int], *, first: bool, last: bool, tp: int) -> float:
    """Of what memory.rank_params counts for these layers, the parameters that stay bf16 on a rank: the embedding and
    LM head (their 1/tp), the norms (MLA's too) and the router (held whole)."""
    d, emb = model.d_model, model.vocab_size * model.d_model
    m = model.mla
    norms = 2 * d + ((m.q_lora_rank + m.kv_lora_rank) if m is not None else 0)
    total = (emb / tp if first else 0.0) + ((d + (0 if model.tie_embeddings and first else emb / tp)) if last else 0.0)
    for layer in layers:
        total += norms + (d * model.num_experts if model.is_moe_layer(layer) else 0)
    return total


def fp8_activation_delta_bytes(
    model: ModelSpec, layer: int, micro_batch_size: int, split: TensorSplit = NO_SPLIT
) -> float:
    """How much less (negative) or more one layer keeps for its backward under fp8 than memory.layer_activation_bytes
    counts in the model's dtype, besides the routed rows (memory.routed_row_bytes): the norm outputs that feed fp8
    linears kept as an fp8 copy per linear reading them (MLA's q and kv down projections: two); the attention output
    kept besides in fp8 (the core's backward keeps it too); an FFN's fc2 input in fp8; a MoE block's shared experts
    keep an fp8 copy of the input the router keeps."""
    if not model.fp8_recipe:
        return 0.0
    tokens, d, b = micro_batch_size * model.seq_len, model.d_model, model.dtype_bytes
    saved, held = b - 1, tokens * split.sequence_share
    readers = 2 if model.mla is not None and model.mla.q_lora_rank else 1
    delta = (readers - b) * held * d + tokens * d / split.tp  # the QKV input; the projection's input, besides
    if model.is_moe_layer(layer):
        routed = tokens * split.dispatch_share
        if model.num_shared_experts:
            delta += routed * d - saved * routed * model.num_shared_experts * model.shared_ffn_dim / split.etp
        return delta
    width = model.dense_ffn_dim or model.expert_ffn_dim
    return delta - saved * held * d - saved * tokens * width / split.tp


def fp8_routed_row_saving_bytes(model: ModelSpec, etp: int = 1) -> float:
    """Bytes a routed row keeps less under fp8: its fc1 input and its fc2 input (1/etp of the width) in fp8."""
    if not model.fp8_recipe:
        return 0.0
    return (model.dtype_bytes - 1) * (model.d_model + model.expert_ffn_dim / etp)
