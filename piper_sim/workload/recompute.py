"""Selective recomputation's modules, as Megatron-core names them (`recompute_modules` with `recompute: selective`).

Megatron-core's TransformerConfig.recompute_modules (default ["core_attn"]) says what selective recomputation
re-runs; piper-sim models three of its modules:
- "core_attn": the attention core (softmax(q k^T) v) is checkpointed: its inputs q, k, v are kept, the score matrix
  is not (Korthikanti et al. 2022), and the core runs again before the layer's backward (op attn_core:L).
- "layernorm": output-discarding checkpoints (tensor_parallel.CheckpointWithoutOutput) of the norms that are modules
  of their own: the layer's input norm and its pre-MLP norm. With Transformer Engine's layer spec the input norm is
  fused into the QKV projection (TELayerNormColumnParallelLinear, input_layernorm IdentityOp) except under MLA, and
  the pre-MLP norm into the dense MLP's first linear except in MoE layers, so what is discarded is the pre-MLP norm's
  output in MoE layers (op moe_norm:L) and, in MLA models, the input norm's output (op attn_norm:L). The norm's input
  (the residual stream) stays; its output's storage is freed once the next linear has consumed it and refilled by
  running the norm again when the backward reaches it.
- "moe_act": an output-discarding checkpoint of the routed experts' activation function (grouped GEMM experts): the
  output of act(a) * b (SwiGLU) or act(a), fc2's input, is freed after fc2's forward and recomputed from fc1's
  output before fc2's backward (op moe_act:L over the rank's routed rows).
Megatron-core's other modules (mlp, moe, shared_experts, mla_up_proj, ...) are not modelled (refused by name).
Also owns the recomputation modes (Recompute). Pure data; must not import simpy or torch.
"""

from __future__ import annotations

from enum import StrEnum


class Recompute(StrEnum):
    """Activation recomputation (config `recompute`): none, selective (recompute_modules re-run before the backward)
    or full (the layers' forward re-run; workload/memory.py)."""

    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


RECOMPUTE_MODES = tuple(mode.value for mode in Recompute)  # the config's values, as plain strings
RECOMPUTE_MODULES = ("core_attn", "layernorm", "moe_act")
DEFAULT_SELECTIVE_MODULES = ("core_attn",)  # Megatron-core's default, and piper-sim's selective recomputation


def selective_modules(recompute: str, modules: tuple[str, ...] | None) -> tuple[str, ...]:
    """The modules a plan recomputes: modules as given under selective recomputation (the default ones when None),
    none otherwise."""
    if recompute != Recompute.SELECTIVE:
        return ()
    return DEFAULT_SELECTIVE_MODULES if modules is None else tuple(modules)
