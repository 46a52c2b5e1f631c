"""Work of each model op: GEMM shapes, attention core, memory-bound traffic by kernel kind. Forward pass only.

Owns the FLOP and byte formulas. Must not import simpy or torch. A GEMM (rows x k) @ (k x n)
costs 2 * rows * k * n FLOPs (multiply-add = 2). Attention core (QK^T and PV) is counted causally:
2 matmuls x 2 FLOPs x tokens x (seq/2) x heads x head_dim = 2 * tokens * seq * heads * head_dim,
the useful work of a causal kernel. Backward GEMM FLOPs are twice the forward's (input and weight gradients); a
backward's memory-bound traffic is each kernel kind's own (backward_traffic).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Generic, TypeVar

import numpy as np

from piper_sim.workload.model import ModelSpec
from piper_sim.workload.ops import parse_op
from piper_sim.workload.parallel import NO_SPLIT, TensorSplit

# The kinds of memory-bound kernel whose HBM traffic op_work reports: layer norms and RMS norms (each block's input
# norm, the final norm); activations (GeLU, SwiGLU); dropout (the block outputs' byte masks, the unfused attention
# core's dropout); residual adds (each block's fused bias-dropout-add, the shared experts' output added to the routed
# ones); rotary position embedding of q and k; softmax (the router's scores, the unfused attention core's score
# matrix); the loss over the logits; permutations of MoE tokens (router gather, combine, dispatch packing); copies
# (embedding lookup, the attention's q, k, v and output layouts, an expert's rows). A profile may price a kind at its
# own measured share of HBM bandwidth (DeviceProfile.memory_kernel_efficiency); the rest take memory_efficiency.
MEMORY_KINDS = ("norm", "activation", "dropout", "residual", "rotary", "softmax", "loss", "permute", "copy")
Traffic = tuple[tuple[str, float], ...]  # (kind, bytes) of an op's memory-bound kernels, kinds from MEMORY_KINDS


def traffic_bytes(traffic: Traffic) -> float:
    """All bytes of a traffic, whatever their kinds."""
    return sum(nbytes for _, nbytes in traffic)


def kind_bytes(traffic: Traffic, kind: str) -> float:
    """The bytes of one kind in a traffic."""
    return sum(nbytes for k, nbytes in traffic if k == kind)


# One number, or an array of them taken element by element (a GEMM's rows, an experts op's row counts by rank): the
# same arithmetic gives a number for a number and an array for an array.
Elementwise = TypeVar("Elementwise", float, np.ndarray)


@dataclass(frozen=True, slots=True)
class Gemm(Generic[Elementwise]):
    rows: Elementwise
    k: int
    n: int
    count: int = 1  # identical GEMMs (e.g. several experts with the same row count)

    @property
    def flops(self) -> Elementwise:
        return 2.0 * self.rows * self.k * self.n * self.count


@dataclass(frozen=True, kw_only=True, slots=True)
class UnfusedPass:
    """One pass (forward or backward) of an attention core run without flash attention: its batched GEMMs that write
    the score matrix, those that read it, and the traffic of the kernels between them (softmax, mask, dropout). A
    GEMM's own writes and reads of the matrix are its traffic (priced with the GEMM), not score_bytes."""

    writes_scores: tuple[Gemm[float], ...] = ()
    reads_scores: tuple[Gemm[float], ...] = ()
    score_traffic: Traffic = ()  # the softmax's and dropout's traffic over the score matrix

    @property
    def score_bytes(self) -> float:
        return traffic_bytes(self.score_traffic)


@dataclass(frozen=True, kw_only=True, slots=True)
class OpWork:
    gemms: tuple[Gemm[float], ...] = ()
    attention_flops: float = 0.0
    attention_seq_len: int = 0
    traffic: Traffic = ()  # HBM traffic of the memory-bound kernels by kind (MEMORY_KINDS)
    num_kernels: int = 0
    repeated_gemms: int = 0  # the first GEMMs every rank of the tensor-parallel group runs whole (replicated)
    # an attention core run without flash attention, its forward and its backward (unfused_attention); they time the
    # core in place of attention_flops (which stays the model's count)
    unfused_forward: UnfusedPass | None = None
    unfused_backward: UnfusedPass | None = None
    # the backward's memory-bound traffic by kind (backward_traffic); None where the work is only ever run forward
    backward_traffic: Traffic | None = None

    @property
    def flops(self) -> float:
        return sum(g.flops for g in self.gemms) + self.attention_flops

    @property
    def elementwise_bytes(self) -> float:
        """All bytes of the memory-bound kernels."""
        return traffic_bytes(self.traffic)

    def model_flops(self, tp: int) -> float:
        """The rank's share of the model's FLOPs: work repeated on every rank of its tensor-parallel group
        counts once per group."""
        repeated = sum(g.flops for g in self.gemms[: self.repeated_gemms])
        return self.flops - repeated * (1 - 1 / tp)


def op_work(
    model: ModelSpec,
    op: str,
    tokens: int,
    expert_rows: tuple[int, ...] = (),
    split: TensorSplit = NO_SPLIT,
    flash: bool = True,
) -> OpWork:
    """Work of one op on `tokens` tokens (micro-batch x seq) of one rank: its forward (_forward_work) and its
    backward's memory-bound traffic (backward_traffic, activations by the op's FFN matrix count)."""
    work = _forward_work(model, op, tokens, expert_rows, split, flash)
    if work.backward_traffic is not None:
        return work
    matrices = model.dense_matrix_count if parse_op(op)[0] == "dense" else model.expert_matrices
    return replace(work, backward_traffic=backward_traffic(model, work.traffic, matrices))


def _forward_work(
    model: ModelSpec, op: str, tokens: int, expert_rows: tuple, split: TensorSplit, flash: bool
) -> OpWork:
    """Forward work of one op on `tokens` tokens (micro-batch x seq) of one rank.

    expert_rows: for "experts:L", the rows each local expert receives. split: the plan's tensor parallelism
    (docs/tensor-parallel.md): attention heads, dense FFN width and the vocabulary are divided by tp; a rank
    routes tokens x dispatch_share of them; experts' and shared experts' widths are divided by etp; under
    sequence parallelism the norms run on the rank's 1/tp of the tokens. flash: whether the attention core is
    one fused kernel (FlashAttention) or, as before it, two batched GEMMs around a softmax over the whole score
    matrix (unfused_attention).
    """
    name, _ = parse_op(op)
    d, b, tp = model.d_model, model.dtype_bytes, split.tp
    act = tokens * d * b  # bytes of one activation tensor
    routed = int(tokens * split.dispatch_share)  # tokens a rank routes
    if name == "embed":
        return OpWork(traffic=(("copy", 2 * act),), num_kernels=1)
    if name == "attn":
        return _attention(model, tokens, split, flash)
    if name == "attn_core":  # the core alone: its FLOPs (and without flash attention, the score matrix's work)
        full = _attention(model, tokens, split, flash)
        return OpWork(
            attention_flops=full.attention_flops,
            attention_seq_len=full.attention_seq_len,
            num_kernels=1,
            unfused_forward=full.unfused_forward,
            unfused_backward=full.unfused_backward,
        )
    if name == "dense":  # the pre-FFN norm, the FFN, the residual add
        width, m = model.dense_ffn_dim or model.expert_ffn_dim, model.dense_matrix_count
        ffn = _ffn(tokens, d, width // tp, m, b, copies=1)
        return replace(
            ffn,
            traffic=norm_traffic(model, tokens, split) + ffn.traffic + residual_traffic(model, tokens, split),
            num_kernels=ffn.num_kernels + 2,
        )
    if name == "router":  # the pre-MoE norm (on the tokens the rank holds), the gate, the permutation
        return OpWork(
            gemms=(Gemm(routed, d, model.num_experts),),
            traffic=norm_traffic(model, tokens, split)
            + (("permute", model.top_k * routed * d * b), ("softmax", 8 * routed * model.num_experts)),
            num_kernels=6,
            repeated_gemms=int(tp > 1 and split.dispatch_share == 1),
        )
    if name == "shared":
        return _ffn(
            routed, d, model.shared_ffn_dim // split.etp, model.expert_matrices, b, copies=model.num_shared_experts
        )
    if name == "experts":
        return _experts(model, expert_rows, split.etp)
    if name == "moe_out":  # un-permute, the shared experts' output added, the residual add
        shared = 3 * tokens * split.sequence_share * d * b if model.num_shared_experts else 0.0
        return OpWork(
            traffic=(("permute", model.top_k * routed * d * b), ("residual", shared))
            + residual_traffic(model, tokens, split),
            num_kernels=4,
        )
    if name in ("attn_norm", "moe_norm"):  # a norm alone, re-run by selective recomputation (workload/recompute.py)
        return OpWork(traffic=norm_traffic(model, tokens, split), num_kernels=1)  # as the attn and router ops run it
    if name == "moe_act":  # the experts' activation alone, over the rows (balanced: routed x top_k), one grouped kernel
        rows = sum(expert_rows) if expert_rows else routed * model.top_k
        return OpWork(traffic=(("activation", expert_activation_bytes(model, rows, split.etp)),), num_kernels=1)
    if name == "head":
        vocab = -(-model.vocab_size // tp)  # a vocabulary-parallel head: the rank's shard of the logits
        return OpWork(
            gemms=(Gemm(tokens, d, vocab),),
            traffic=norm_traffic(model, tokens, split) + (("loss", 3 * tokens * vocab * 4),),
            num_kernels=5,
        )
    raise ValueError(f"no work formula for op {op!r}")


def _attention(model: ModelSpec, tokens: int, split: TensorSplit = NO_SPLIT, flash: bool = True) -> OpWork:
    """One layer's attention on a rank: its heads (num_heads / tp), the norm's traffic on the tokens it holds
    (all of them, or 1/tp under sp); MLA's down projections are replicated over the group (run whole)."""
    d, hd, b, tp = model.d_model, model.attn_head_dim, model.dtype_bytes, split.tp
    h, kv = model.num_heads // tp, max(model.kv_heads // tp, 1)
    core: float
    if model.mla is not None:
        m = model.mla
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        down = [Gemm(tokens, d, m.kv_lora_rank + m.qk_rope_head_dim)]  # replicated over the group
        down += [Gemm(tokens, d, m.q_lora_rank)] if m.q_lora_rank else []
        gemms = down + [
            Gemm(tokens, m.kv_lora_rank, h * (m.qk_nope_head_dim + m.v_head_dim)),
            Gemm(tokens, h * m.v_head_dim, d),
        ]
        gemms += [Gemm(tokens, m.q_lora_rank, h * qk)] if m.q_lora_rank else [Gemm(tokens, d, h * qk)]
        core = tokens * model.seq_len * h * (qk + m.v_head_dim)
        repeated = len(down) if tp > 1 else 0
    else:
        gemms = [Gemm(tokens, d, (h + 2 * kv) * hd), Gemm(tokens, h * hd, d)]
        core = 2.0 * tokens * model.seq_len * h * hd
        repeated = 0
    traffic = (
        norm_traffic(model, tokens, split)
        + rotary_traffic(model, tokens, h, kv)
        + (("copy", 4 / tp * tokens * d * b),)  # q, k, v, output
        + residual_traffic(model, tokens, split)
    )
    forward, backward = (None, None) if flash else unfused_attention(model, tokens, h)
    return OpWork(
        gemms=tuple(gemms),
        attention_flops=core,
        attention_seq_len=model.seq_len,
        traffic=traffic,
        num_kernels=8 + 2 * model.rotary,
        repeated_gemms=repeated,
        unfused_forward=forward,
        unfused_backward=backward,
    )


# Score-matrix traffic per score of the kernels between the batched GEMMs, in elements of the model's dtype, and the
# 1-byte dropout mask. Megatron-LM's fused causal softmax (scaled_upper_triang_masked_softmax.h): its forward reads
# the causal half of the scores and writes the whole row (zeros above the diagonal); its backward reads the gradient
# and the saved output over the causal half and writes the whole row. Attention dropout (torch's fused dropout):
# reads the probabilities, writes them and a byte mask; its backward reads the gradient and the mask, writes one.
SOFTMAX_FORWARD_ELEMENTS, SOFTMAX_BACKWARD_ELEMENTS = 0.5 + 1.0, 0.5 + 0.5 + 1.0
DROPOUT_ELEMENTS, DROPOUT_MASK_BYTES = 2.0, 1.0


def unfused_attention(model: ModelSpec, tokens: int, heads: int) -> tuple[UnfusedPass, UnfusedPass]:
    """The attention core without flash attention (Megatron-LM before it; Korthikanti et al. 2022 section 4.1),
    forward and backward: per sequence and head, batched GEMMs over the whole s x s matrix (the causal mask is
    applied to it, not skipped) and the softmax (and dropout) kernels between them. Forward: Q K^T writes the
    scores, softmax(scores) V reads them. Backward: dO V^T writes the probabilities' gradient; P^T dO, dS K and
    dS^T Q read the matrix."""
    s = model.seq_len
    m = model.mla
    qk = m.qk_nope_head_dim + m.qk_rope_head_dim if m is not None else model.attn_head_dim
    v = m.v_head_dim if m is not None else model.attn_head_dim
    batch = max(tokens // s, 1) * heads
    scores, b = batch * s * s, model.dtype_bytes
    dropout = (DROPOUT_ELEMENTS * b + DROPOUT_MASK_BYTES) if model.dropout else 0.0
    forward = UnfusedPass(
        writes_scores=(Gemm(s, qk, s, count=batch),),
        reads_scores=(Gemm(s, s, v, count=batch),),
        score_traffic=(("softmax", SOFTMAX_FORWARD_ELEMENTS * b * scores), ("dropout", dropout * scores)),
    )
    backward = UnfusedPass(
        writes_scores=(Gemm(s, v, s, count=batch),),
        reads_scores=(Gemm(s, s, v, count=batch), Gemm(s, s, qk, count=2 * batch)),
        score_traffic=(("softmax", SOFTMAX_BACKWARD_ELEMENTS * b * scores), ("dropout", dropout * scores)),
    )
    return forward, backward


# The backward kernels' HBM traffic of each memory-bound kind, per element of the tensor its forward runs over, in
# elements of the model's dtype (fp32 where named); the kernels and their sources (repository, commit, file,
# function) are in traces/kernels/backward-traffic.yaml. Norm: Transformer Engine's (and apex.contrib's FastLayerNorm)
# backward reads x and dy and writes dx in one kernel (forward: x read, y written). Activation of m FFN matrices:
# Megatron-core's bias_gelu_back / swiglu_back read the m - 1 saved inputs and dy and write the m - 1 input
# gradients (forward: the inputs read, one output written). Residual: the add's own backward passes dy on to both
# branches (no kernel); autograd's accumulation of the two gradients where the branches forked reads two, writes
# one. Dropout: the backward of the fused bias-dropout-add multiplies dy by the 1-byte mask (forward: the mask
# written). Rotary: the backward is the forward's rotation of dy. Softmax (the router's, fp32): torch's softmax
# backward reads y and dy, writes dx. Loss: Megatron's vocab-parallel cross entropy multiplies the saved fp32
# softmax by the loss gradient in place, and autograd casts that fp32 gradient to the logits' dtype (forward: 3 fp32
# passes over the logits). Permutations and copies: the backward moves the same rows the other way.
NORM_ELEMENTS = (2.0, 3.0)  # (forward, backward)
RESIDUAL_ELEMENTS = (3.0, 3.0)
ROTARY_ELEMENTS = (2.0, 2.0)
SOFTMAX_ELEMENTS = (2.0, 3.0)
LOSS_FP32_PASSES = (3.0, 2.0 + 1.0)  # the backward's cast also writes one element of the model's dtype


def activation_elements(matrices: int) -> tuple[float, float]:
    """(forward, backward) elements per FFN element of an activation over `matrices` FFN matrices."""
    return float(matrices), 2.0 * (matrices - 1) + 1.0


def backward_traffic(model: ModelSpec, traffic: Traffic, matrices: int) -> Traffic:
    """The memory-bound traffic of the backward of these forward kernels, kind by kind (the element counts above);
    matrices: the FFN matrix count of the op's activation."""
    b = model.dtype_bytes
    dropout = (DROPOUT_MASK_BYTES + 2 * b) / DROPOUT_MASK_BYTES  # the mask and dy read, dx written
    loss = (LOSS_FP32_PASSES[1] * 4 + b) / (LOSS_FP32_PASSES[0] * 4)
    ratio = {
        "norm": NORM_ELEMENTS[1] / NORM_ELEMENTS[0],
        "activation": activation_elements(matrices)[1] / activation_elements(matrices)[0],
        "residual": RESIDUAL_ELEMENTS[1] / RESIDUAL_ELEMENTS[0],
        "dropout": dropout,
        "rotary": ROTARY_ELEMENTS[1] / ROTARY_ELEMENTS[0],
        "softmax": SOFTMAX_ELEMENTS[1] / SOFTMAX_ELEMENTS[0],
        "loss": loss,
        "permute": 1.0,
        "copy": 1.0,
    }
    return tuple((kind, nbytes * ratio[kind]) for kind, nbytes in traffic)


def norm_traffic(model: ModelSpec, tokens: int, split: TensorSplit) -> Traffic:
    """One LayerNorm or RMSNorm over the tokens the rank holds (1/tp of them under sequence parallelism): it reads
    its input and writes its output (Transformer Engine's norm kernels, Megatron's fused layer norm; the per-token
    statistics it also writes are d_model times smaller)."""
    return (("norm", 2 * tokens * split.sequence_share * model.d_model * model.dtype_bytes),)


def residual_traffic(model: ModelSpec, tokens: int, split: TensorSplit) -> Traffic:
    """The residual add closing a block (attention, FFN, MoE), over the tokens the rank holds: Megatron-core's fused
    bias-dropout-add (fusions/fused_bias_dropout.py, its self_attn_bda and mlp_bda) reads the block's output and the
    residual stream and writes their sum in one kernel, with dropout also writing the 1-byte mask."""
    held = tokens * split.sequence_share * model.d_model
    mask = DROPOUT_MASK_BYTES * held if model.dropout else 0.0
    return (("residual", 3 * held * model.dtype_bytes), ("dropout", mask))


def rotary_traffic(model: ModelSpec, tokens: int, heads: int, kv_heads: int) -> Traffic:
    """Rotary position embedding of a rank's q and k heads (none unless model.rotary): Transformer Engine's fused
    RoPE (Megatron-core's apply_rope_fusion) reads each of q and k once and writes it once. MLA rotates only the rope
    parts: qk_rope_head_dim of each q head and the one k_pos_emb head all heads share (Megatron-core's
    multi_latent_attention.py)."""
    if not model.rotary:
        return (("rotary", 0.0),)
    if model.mla is not None:
        width = (heads + 1) * model.mla.qk_rope_head_dim
    else:
        width = (heads + kv_heads) * model.attn_head_dim
    return (("rotary", 2 * tokens * width * model.dtype_bytes),)


def activation_kernel_bytes(matrices: int, rows: float, width: int, dtype_bytes: int) -> float:
    """HBM traffic of an FFN's activation function over rows x width: it reads each up projection's output and writes
    the activation, matrices elements per element: GeLU (2 matrices) reads fc1's output and writes one (Megatron's
    bias_gelu), SwiGLU (3) reads gate and up and writes their product (bias_swiglu)."""
    return matrices * rows * width * dtype_bytes


def _ffn(tokens: int, d: int, width: int, matrices: int, dtype_bytes: int, copies: int) -> OpWork:
    up = Gemm(tokens, d, width, count=copies * (matrices - 1))
    down = Gemm(tokens, width, d, count=copies)
    return OpWork(
        gemms=(up, down),
        traffic=(("activation", copies * activation_kernel_bytes(matrices, tokens, width, dtype_bytes)),),
        num_kernels=copies * (matrices + 2),
    )


def _experts(model: ModelSpec, expert_rows: tuple[int, ...], etp: int = 1) -> OpWork:
    by_rows: dict[int, int] = {}
    for rows in expert_rows:
        if rows > 0:
            by_rows[rows] = by_rows.get(rows, 0) + 1
    gemms = tuple(
        replace(g, count=g.count * count)
        for rows, count in sorted(by_rows.items())
        for g in expert_gemms(model, rows, etp)
    )
    return replace(experts_besides_gemms(model, expert_rows, etp), gemms=gemms)


def expert_gemms(model: ModelSpec, rows: Elementwise, etp: int = 1) -> tuple[Gemm[Elementwise], Gemm[Elementwise]]:
    """The GEMMs of one routed expert on `rows` rows (or on each of an array of row counts): its up projections
    (gate and up for 3-matrix experts), then its down projection; widths divided by etp."""
    d, f = model.d_model, model.expert_ffn_dim // etp
    return Gemm(rows, d, f, count=model.expert_matrices - 1), Gemm(rows, f, d)


def experts_besides_gemms(model: ModelSpec, expert_rows: tuple[int, ...], etp: int = 1) -> OpWork:
    """The experts op's work other than its GEMMs: the activation's traffic over the rows, a few kernels per
    expert."""
    d, m, b = model.d_model, model.expert_matrices, model.dtype_bytes
    rows = sum(expert_rows)
    traffic: Traffic = (("activation", expert_activation_bytes(model, rows, etp)), ("copy", rows * 2 * d * b))
    return OpWork(
        traffic=traffic, num_kernels=len(expert_rows) * (m + 2), backward_traffic=backward_traffic(model, traffic, m)
    )


def expert_activation_bytes(model: ModelSpec, rows: float, etp: int = 1) -> float:
    """HBM traffic of the routed experts' activation function over this many rows (its width split over etp)."""
    return activation_kernel_bytes(model.expert_matrices, rows, model.expert_ffn_dim // etp, model.dtype_bytes)


EXCHANGE_OPS = ("dispatch", "combine")


def exchange_work(model: ModelSpec, op: str, tokens: int) -> OpWork:
    """Host work around one MoE all-to-all of a microbatch of `tokens` tokens, as the torch backend runs it.
    "dispatch" (the forward dispatch) writes the tokens x top_k rows with the expert ids as one extra float32
    column and reads them back out: two reads and two writes of the rows. "combine" (the forward combine
    and every backward exchange) passes its rows as they are."""
    name, _ = op.partition(":")[::2]
    if name not in EXCHANGE_OPS:
        raise ValueError(f"unknown exchange {op!r}; allowed: {EXCHANGE_OPS}")
    if name == "combine":
        return OpWork(num_kernels=1)
    return OpWork(traffic=(("permute", 4 * tokens * model.top_k * (model.d_model + 1) * 4),), num_kernels=5)


def forward_flops_per_token(model: ModelSpec) -> float:
    """Model FLOPs of one token's forward pass (active experts only), for MFU."""
    tokens = model.seq_len
    total = op_work(model, "embed", tokens).flops + op_work(model, "head", tokens).flops
    for layer in range(model.num_layers):
        total += op_work(model, f"attn:{layer}", tokens).flops
        if model.is_moe_layer(layer):
            total += op_work(model, f"router:{layer}", tokens).flops
            total += op_work(model, f"shared:{layer}", tokens).flops
            total += op_work(model, f"experts:{layer}", tokens, (tokens * model.top_k,)).flops
        else:
            total += op_work(model, f"dense:{layer}", tokens).flops
    return total / tokens
