"""DeepSpeed's ZeRO stage 1 and 2 gradient reduction: what its optimizer issues where Megatron-core's distributed
optimizer reduce-scatters each class of gradients (`optimizer.gradient_reduce: deepspeed`; docs/sharding.md).

Owns the names `optimizer.gradient_reduce` takes (GRADIENT_REDUCES, checked by check_gradient_reduce), DeepSpeed's
reduce bucket (REDUCE_BUCKET_ELEMENTS) and the cut of a rank's gradients into the all-reduce calls its buckets make
(reduce_buckets). The lowering (schedule/lower_reductions.py) emits one all-reduce task per call, the call's index
among its class's in the task's `layer`; the simulator (sim/collective_tasks.py) and the estimator
(planning/estimate.py) price each call's bytes from reduce_buckets, so both tiers move the same calls. Pure: imports
no numpy, simpy or torch.

What DeepSpeed's `DeepSpeedZeroOptimizer` does (deepspeed/runtime/zero/stage_1_and_2.py of the DeepSpeed X-MoE ships,
version 0.15.5: github.com/Supercomputing-System-AI-Lab/X-MoE commit b0283d5c; every fact with its function in
traces/collectives/deepspeed-zero.yaml):
- a rank's gradients fill buckets of `reduce_bucket_size` elements (5e8 by default) in the order of the optimizer's
  parameter groups, the experts' groups after the others (deepspeed/moe/utils.py
  split_params_into_different_moe_groups_for_optimizer appends them); a bucket is reduced when the next parameter
  would overflow it (reduce_independent_p_g_buckets_and_remove_grads) and the last one at the end (the epilogue);
- a bucket is reduced by `average_tensor`: its slices grouped by process group (experts over their expert-data-
  parallel group, the rest over the data-parallel group) and, with `use_multi_rank_bucket_allreduce` (true by
  default since DeepSpeed PR #4695), each group's slices all-reduced as one flat buffer (allreduce_and_scatter ->
  allreduce_bucket -> dist.all_reduce), one call per group the bucket holds, on the compute stream without
  `overlap_comm` (false by default below stage 3): twice the bytes of a reduce-scatter;
- stage 1 reduces at the gradient-accumulation boundary, after the last micro-batch's backward
  (engine.py DeepSpeedEngine.allreduce_gradients -> reduce_gradients; no gradient hooks without partition_gradients
  or overlap_comm); stage 2 from its gradient hooks in every micro-batch's backward;
- after the optimizer step each parameter group's updated shard is all-gathered over its group
  (runtime/utils.py all_gather_dp_groups -> all_gather_into_tensor_dp_groups), as the reduce-scatter default does.
The cut here is at element boundaries; DeepSpeed closes a bucket at the parameter that would overflow it, so its
buckets hold up to one parameter fewer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from piper_sim.errors import ConfigError, one_of

DEFAULT_GRADIENT_REDUCE = "reduce-scatter"
DEEPSPEED = "deepspeed"
GRADIENT_REDUCES = (DEFAULT_GRADIENT_REDUCE, DEEPSPEED)
DEEPSPEED_ZERO_STAGES = (1, 2)
# DeepSpeedZeroConfig.reduce_bucket_size's default (deepspeed/runtime/zero/config.py, X-MoE commit b0283d5c);
# X-MoE's ds_config sets only the stage (traces/collectives/deepspeed-zero.yaml)
REDUCE_BUCKET_ELEMENTS = 500_000_000
# the classes' order in the buckets: Megatron's parameter groups (dense and, under TP, the whole-held norms and
# router), then the expert groups DeepSpeed appends
BUCKET_ORDER = ("dense", "replicated", "expert")


def check_gradient_reduce(value: object, zero: int) -> str:
    """optimizer.gradient_reduce, checked against optimizer.zero: reduce-scatter (left out) or deepspeed, the latter
    with ZeRO stage 1 or 2 only (DeepSpeed's stage 1 and 2 optimizer)."""
    if value is None:
        return DEFAULT_GRADIENT_REDUCE
    if not isinstance(value, str) or value not in GRADIENT_REDUCES:
        raise ConfigError("optimizer.gradient_reduce", value, one_of(GRADIENT_REDUCES, str(value)))
    if value == DEEPSPEED and zero not in DEEPSPEED_ZERO_STAGES:
        raise ConfigError(
            "optimizer.gradient_reduce",
            value,
            f"reduce-scatter with optimizer.zero {zero} (deepspeed is DeepSpeed's ZeRO stage 1 and 2 optimizer: "
            "optimizer.zero 1 or 2)",
        )
    return value


def reduce_buckets(
    params: Mapping[str, float], bucket_elements: float = REDUCE_BUCKET_ELEMENTS
) -> dict[str, tuple[float, ...]]:
    """The elements of each class of a rank's gradients (params: class -> elements, memory.rank_params) in each
    all-reduce call DeepSpeed's buckets make: the classes laid end to end in BUCKET_ORDER and cut every
    bucket_elements; a bucket that holds two classes makes one call for each. A class of no elements makes none."""
    out: dict[str, tuple[float, ...]] = {}
    start = 0.0
    for kind in BUCKET_ORDER:
        end = start + params.get(kind, 0.0)
        pieces = []
        offset = start
        while offset < end:
            cut = min(end, (math.floor(offset / bucket_elements) + 1) * bucket_elements)
            pieces.append(cut - offset)
            offset = cut
        out[kind] = tuple(pieces)
        start = end
    return out
