"""Memory model per rank: training state of the parameters it holds, activations per microbatch.

Owns the byte formulas of Piper's resource model (Dash and Wang 2026, arXiv 2605.05049), with the
activation terms spelled out as the tensors a layer keeps for its backward pass (as fused-kernel
implementations keep them, and as the torch backend does; docs/metrics.md):
- training state: 16 bytes per parameter (fp16 weight and grad, fp32 master, Adam m and v; fp32 models: fp32
  weight and grad, Adam m and v); with optimizer state sharded over N replicas (ZeRO, Rajbhandari et al.
  2020, section 5.1): stage 1 keeps 2 + 2 + 12 / N bytes per parameter (fp32: 4 + 4 + 8 / N), stage 2
  2 + 14 / N: the lowered schedule reduce-scatters each chunk's gradients after each micro-batch's backward,
  so only one chunk's full gradients are alive at a time (its backward's transient); stage 3 (FSDP) 16 / N,
  plus the units gathered at a time (workload/fsdp.py);
- attention: Piper's 12 b s d bytes at 2-byte activations, i.e. 6 tensors of T = b s tokens x d (norm
  input and output, q, k, v, attention output), plus 4 b H s^2 for the score matrix when attention is
  not fused (flash attention keeps none);
- the norm before the FFN/MoE: its input and output, 2 T d;
- routed experts: each of the T k routed rows keeps its input (d) and the FFN's inner activations
  (3 d_ffn for SwiGLU: both up-projections and their product; 2 d_ffn for GELU), and the combine keeps
  each routed row's expert output (d) to weight it; the router's probabilities (T x E, fp32);
- shared experts and dense FFNs: their inner activations (their input is the norm output);
- the last stage: its final norm (2 T d) and the fp32 logits, 4 T V bytes.
With dropout, each block's output keeps a 1-byte mask, and a kept score matrix one more byte per score (Korthikanti
et al. 2022, section 4.1: their 34 s b h + 5 a s^2 b per layer counts these masks).
Activation recomputation (Korthikanti et al. 2022): "selective" re-runs the attention core before the
backward, so the score matrix is not kept (as with flash attention); with `recompute_modules` (Megatron-core's
names, workload/recompute.py) it re-runs those modules: "core_attn" (the default) that core, "layernorm" the
norms that are modules of their own (their outputs not kept: the pre-MoE norm's in MoE layers, the input norm's
under MLA) and "moe_act" the experts' activation (fc2's input not kept, one expert width per routed row).
"full" keeps only the chunk's input (T d) for its recomputed layers and re-runs their forward before the chunk's
backward (the lowered schedule's recompute tasks), so while that backward runs the recomputed layers' activations
are alive again, all of them at once (recompute_transient_bytes). With `recompute_checkpoint_layers` N the recomputed
layers are checkpointed in groups of N, as Megatron-LM's uniform method does (--recompute-num-layers N; 1 is
its default and Korthikanti's per-layer checkpoint): a group's input is kept, and one group's activations are
alive again at a time (the same recompute work, re-run group by group inside the backward).
Activation elements are dtype_bytes each.
A plan fits when each stage's peak is within HBM less a framework reserve (reserve_bytes): the config's
`cost.framework_reserve_GiB`, else the profile's (its stack's runtime context and the communication library's
buffers, from published measurements cited in its sources file: `framework_reserve`, the context, the first
communicator and each further one the plan opens, or the fixed `framework_reserve_GiB`), else
FRAMEWORK_RESERVE_FRACTION of HBM, an assumption (docs/planning.md). HBM is the device's capacity as its driver
reports it (GiB: DRAM capacities are binary).
Must not import simpy or torch.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from piper_sim.workload.model import ModelSpec
from piper_sim.workload.parallel import NO_SPLIT, TensorSplit
from piper_sim.workload.precision import (
    fp8_activation_delta_bytes,
    fp8_routed_row_saving_bytes,
    fp8_weight_bytes_per_param,
    non_fp8_params,
)
from piper_sim.workload.recompute import DEFAULT_SELECTIVE_MODULES, Recompute, selective_modules

if TYPE_CHECKING:  # the profile module loads numpy; the schedule layer imports this module
    from piper_sim.workload.profile import DeviceProfile

STATE_BYTES_PER_PARAM = 16
FRAMEWORK_RESERVE_FRACTION = 0.10


def state_bytes_per_param(zero: int, shards: int, dtype_bytes: int = 2, master_weights: bool = True) -> float:
    """Training-state bytes per parameter held at the step's peak, with the state sharded over `shards` replicas
    (ZeRO, Rajbhandari et al. 2020, section 5.1). Mixed-precision Adam (16-bit models): weight 2, gradient 2,
    fp32 master + m + v 12 -> stage 1: 2 + 2 + 12 / N, stage 2: 2 + 14 / N, stage 3: 16 / N; fp32 models, and
    16-bit models without master weights (Adam's m and v in the weights' dtype): m + v twice the dtype. Stage 2's
    full gradients of one chunk while its backward runs, and stage 3's gathered units (workload/fsdp.py), are the
    stage plan's transient."""
    optimizer = 12 if dtype_bytes < 4 and master_weights else 2 * dtype_bytes
    if zero == 0 or shards <= 1:
        return float(2 * dtype_bytes + optimizer)
    if zero == 3:
        return (2 * dtype_bytes + optimizer) / shards
    if zero == 2:
        return dtype_bytes + (dtype_bytes + optimizer) / shards
    return 2 * dtype_bytes + optimizer / shards


def state_bytes(
    params: dict[str, float], *, zero: int, shards: dict[str, int], dtype_bytes: int = 2, master_weights: bool = True
) -> float:
    """Training state of a rank's parameters, each class ("dense", "replicated", "expert"; rank_params)
    sharded over its replicas as shards[class] says (ZeRO; 1 when the optimizer state is not sharded)."""
    return sum(
        params[kind] * state_bytes_per_param(zero, shards[kind], dtype_bytes, master_weights) for kind in PARAM_CLASSES
    )


PARAM_CLASSES = ("dense", "replicated", "expert")


def param_shards(*, zero: int, data_parallel: int, dp: int, stage_size: int, replicate: int = 1) -> dict[str, int]:
    """Replicas over which each class of parameters is sharded under ZeRO (all 1 without it): a tensor-parallel
    shard of the dense layers over the data-parallel replicas, the parameters every rank holds whole over the
    stage, an expert shard over dp; under HSDP (replicate > 1) each over its 1/replicate shard group."""
    if not zero:
        return dict.fromkeys(PARAM_CLASSES, 1)
    return {"dense": data_parallel // replicate, "replicated": stage_size // replicate, "expert": dp // replicate}


def fp8_weight_params(
    model: ModelSpec, params: dict[str, float], layers: tuple[int, ...], *, first: bool, last: bool, tp: int
) -> float:
    """Of a rank's parameters (rank_params of these layers), those of its fp8 linears (workload/precision.py); 0 in
    bf16."""
    if not model.fp8_recipe:
        return 0.0
    return sum(params.values()) - non_fp8_params(model, layers, first=first, last=last, tp=tp)


def fp8_weight_copy_bytes(fp8_params: float, transposed_copies: bool) -> float:
    """The fp8 copies of those weights TE keeps over a step (besides the weights and the training state)."""
    return fp8_params * fp8_weight_bytes_per_param(transposed_copies)


def reserve_bytes(profile: DeviceProfile, given_bytes: float | None = None, *, communicators: int) -> float:
    """The framework reserve of one device whose process opens `communicators` communicators (the plan's,
    schedule/communicators.py): given_bytes (a config's or a plan request's), else the profile's by communicator
    (`framework_reserve`: the runtime context, the first communicator, each further one), else its fixed
    `framework_reserve_GiB` (its stack's context and communication buffers; both cited in its sources file), else
    FRAMEWORK_RESERVE_FRACTION of its HBM (an assumption)."""
    if given_bytes is not None:
        return given_bytes
    if profile.framework_reserve is not None:
        return profile.framework_reserve.bytes_for(communicators)
    if profile.framework_reserve_bytes is not None:
        return profile.framework_reserve_bytes
    return FRAMEWORK_RESERVE_FRACTION * profile.hbm_bytes


def headroom_bytes(peaks: list[float], hbm_bytes: float, reserve: float) -> list[float]:
    """Per stage: what is left of HBM after the reserve and the stage's peak (negative: does not fit)."""
    return [hbm_bytes - reserve - peak for peak in peaks]


def rank_params(
    model: ModelSpec, layers: tuple[int, ...], *, first: bool, last: bool, ep: int, split: TensorSplit = NO_SPLIT
) -> dict[str, float]:
    """Parameters one rank holds for these layers, by class: "dense" (attention, dense FFNs, the vocabulary:
    split over tp; replicated over the data-parallel replicas), "replicated" (tp > 1: what every rank of the
    stage holds whole, as Megatron does: norms, the router, MLA's down projections, and shared experts when
    etp is 1; with tp 1 they count as dense) and "expert" (the rank's routed experts, split over etp).
    Memoized (the planner asks for the same chunks of thousands of plans); each call gets its own dict."""
    return dict(_rank_params(model, tuple(layers), first, last, ep, split))


@functools.lru_cache(maxsize=65536)
def _rank_params(
    model: ModelSpec, layers: tuple[int, ...], first: bool, last: bool, ep: int, split: TensorSplit
) -> dict[str, float]:
    tp, etp = split.tp, split.etp
    dense = whole = expert = 0.0
    emb = model.vocab_size * model.d_model
    if first:
        dense += emb / tp
    if last:
        whole += model.d_model
        dense += 0 if model.tie_embeddings and first else emb / tp
    for layer in layers:
        replicated = model.attention_replicated_params()
        whole += replicated
        dense += (model.attention_params() - replicated) / tp
        if model.is_moe_layer(layer):
            shared = model.num_shared_experts * model.expert_matrices * model.d_model * model.shared_ffn_dim
            whole += model.d_model * model.num_experts
            if etp == 1 and tp > 1:
                whole += shared
            else:
                dense += shared / etp
            expert += model.num_experts * model.expert_params() / (ep * etp)
        else:
            dense += model.dense_ffn_params() / tp
    if tp == 1:  # nothing is split: the stage's replicas of all of it are the data-parallel ones
        dense, whole = dense + whole, 0.0
    return {"dense": dense, "replicated": whole, "expert": expert}


def rank_param_tensors(model: ModelSpec, layers: tuple[int, ...], *, first: bool, last: bool, ep: int) -> int:
    """Parameter tensors one rank holds (the optimizer pays a cost per tensor): per layer two norms, the
    attention projections (q, k, v, o; MLA: its down/up projections and their norms), the router, the
    rank's routed experts and the shared experts (one tensor per matrix) or the dense FFN's matrices;
    the embedding on the first stage, the final norm and the head (unless tied to it) on the last."""
    m = model.mla
    attention = 4 if m is None else (6 if m.q_lora_rank else 4) + (2 if m.q_lora_rank else 1)
    count = (1 if first else 0) + ((2 if not (model.tie_embeddings and first) else 1) if last else 0)
    for layer in layers:
        count += 2 + attention
        if model.is_moe_layer(layer):
            count += 1 + (model.num_experts // ep + model.num_shared_experts) * model.expert_matrices
        else:
            count += model.dense_matrix_count
    return count


def ffn_inner(width: int, matrices: int) -> int:
    """Activations per row an FFN keeps besides its input: SwiGLU (3 matrices) a, b and silu(a) * b;
    GELU (2 matrices) a and gelu(a)."""
    return (3 if matrices == 3 else 2) * width


def routed_row_bytes(model: ModelSpec, etp: int = 1, modules: tuple[str, ...] = ()) -> float:
    """Activations an expert keeps per routed row it computes: the row and the FFN's inner activations (its
    1/etp of them); under fp8 the inputs of fc1 and fc2 in fp8 (precision.fp8_routed_row_saving_bytes). With
    "moe_act" among the recomputed modules the activation's output (fc2's input) is not kept: one width less."""
    inner = ffn_inner(model.expert_ffn_dim, model.expert_matrices) - ("moe_act" in modules) * model.expert_ffn_dim
    kept = (model.d_model + inner / etp) * model.dtype_bytes
    return kept - fp8_routed_row_saving_bytes(model, etp)


def activation_bytes(
    model: ModelSpec,
    layers: tuple[int, ...],
    micro_batch_size: int,
    *,
    last: bool,
    flash_attention: bool = True,
    recompute: str = "none",
    recomputed: int = 0,
    checkpoint_layers: int | None = None,
    split: TensorSplit = NO_SPLIT,
    modules: tuple[str, ...] = DEFAULT_SELECTIVE_MODULES,
) -> float:
    """Activations one micro-batch leaves on a rank between its forward and backward for these layers.

    recompute "full": the first `recomputed` layers keep only the input of each group of `checkpoint_layers`
    layers (None: one group, the chunk's input); "selective" recomputes `modules` (workload/recompute.py):
    "core_attn" keeps no scores, "layernorm" and "moe_act" discard their outputs (layer_activation_bytes).
    Routed rows are counted as if balanced (tokens x top_k per rank); the simulator's engine adds the
    difference for the rows a rank's experts actually get (`routed_row_bytes` each). split: tensor
    parallelism (layer_activation_bytes).
    """
    redone = selective_modules(recompute, modules)
    keeps_scores = not flash_attention and recompute != Recompute.FULL and "core_attn" not in redone
    tokens = micro_batch_size * model.seq_len
    held = tokens * split.sequence_share  # the tokens a rank's residual stream holds
    total = 0.0
    if recompute == Recompute.FULL and recomputed and layers:  # one checkpoint (a group's input) per group
        total = (
            len(checkpoint_groups(min(recomputed, len(layers)), checkpoint_layers))
            * held
            * model.d_model
            * model.dtype_bytes
        )
    kept = layers[recomputed:] if recompute == Recompute.FULL else layers  # the rest are re-run from the chunk's input
    for layer in kept:
        total += layer_activation_bytes(
            model, layer, micro_batch_size, split=split, discarded=redone, keep_scores=keeps_scores
        )
    if last:
        total += 2 * held * model.d_model * model.dtype_bytes + 4 * tokens * model.vocab_size / split.tp
    return total


def layer_activation_bytes(
    model: ModelSpec,
    layer: int,
    micro_batch_size: int,
    *,
    keep_scores: bool,
    split: TensorSplit = NO_SPLIT,
    discarded: tuple[str, ...] = (),
) -> float:
    """What one layer keeps for its backward pass, per micro-batch (the terms of the module docstring).

    Tensor parallelism (Korthikanti et al. 2022, section 4.2): q, k, v, the attention output, the scores and
    the dense FFN's inner activations are split over tp; the norms' inputs and outputs are whole on every rank
    unless sequence parallelism splits them too. A rank keeps the routed rows of the tokens it routes
    (dispatch_share), each expert's inner activations split over etp. discarded: the recomputed modules whose
    outputs are not kept (workload/recompute.py): "layernorm" the pre-MoE norm's output in a MoE layer and the
    input norm's under MLA; "moe_act" the experts' activation output of each routed row (routed_row_bytes).
    """
    b, s, d, k, tp = micro_batch_size, model.seq_len, model.d_model, model.top_k, split.tp
    tokens = b * s
    seq = split.sequence_share
    elements = (2 * seq + 4 / tp) * tokens * d + 2 * seq * tokens * d  # attention; the pre-FFN norm
    if "layernorm" in discarded:  # the outputs of the norms that are modules of their own
        elements -= (model.is_moe_layer(layer) + (model.mla is not None)) * seq * tokens * d
    other_bytes = 4 * b * model.num_heads * s * s / tp if keep_scores else 0.0
    if model.dropout:  # 1-byte masks: the two blocks' outputs and, with the score matrix kept, its probabilities
        other_bytes += 2 * seq * tokens * d + (b * model.num_heads * s * s / tp if keep_scores else 0.0)
    if model.is_moe_layer(layer):
        routed = tokens * split.dispatch_share
        other_bytes += routed * k * routed_row_bytes(model, split.etp, discarded) + 4 * routed * model.num_experts
        elements += routed * k * d  # combine
        elements += (
            routed * model.num_shared_experts * ffn_inner(model.shared_ffn_dim, model.expert_matrices) / split.etp
        )
    else:
        elements += tokens * ffn_inner(model.dense_ffn_dim or model.expert_ffn_dim, model.dense_matrix_count) / tp
    fp8_delta = fp8_activation_delta_bytes(model, layer, micro_batch_size, split)
    return elements * model.dtype_bytes + other_bytes + fp8_delta


def recompute_transient_bytes(
    model: ModelSpec,
    layers: tuple[int, ...],
    micro_batch_size: int,
    *,
    recompute: str,
    recomputed: int,
    flash_attention: bool = True,
    checkpoint_layers: int | None = None,
    split: TensorSplit = NO_SPLIT,
) -> float:
    """Full recomputation: the activations of the largest group of recomputed layers (checkpoint_layers each; None:
    all of the chunk's at once), alive again while that group's backward runs."""
    if recompute != Recompute.FULL:
        return 0.0
    recomputed_layers = layers[:recomputed]
    return max(
        (
            sum(
                layer_activation_bytes(
                    model, recomputed_layers[i], micro_batch_size, keep_scores=not flash_attention, split=split
                )
                for i in group
            )
            for group in checkpoint_groups(len(recomputed_layers), checkpoint_layers)
        ),
        default=0.0,
    )


def checkpoint_groups(num_layers: int, checkpoint_layers: int | None) -> list[range]:
    """The groups of consecutive layers full recomputation checkpoints as one (each keeps its input and is re-run
    at once before its backward): Megatron-LM's uniform method of --recompute-num-layers layers (Korthikanti et
    al. 2022: one layer, its input kept); None: one group of all of them (the torch backend's whole chunk)."""
    size = num_layers if checkpoint_layers is None else max(1, checkpoint_layers)
    return [range(i, min(i + size, num_layers)) for i in range(0, num_layers, max(size, 1))]
