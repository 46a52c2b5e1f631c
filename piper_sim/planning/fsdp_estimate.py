"""The estimator's ZeRO-3 / FSDP terms: which passes gather and over which groups (docs/sharding.md).

Owns gather_shares (the share of a chunk's forwards and backwards that find its units sharded, from the schedule
generator's own program and schedule/lower_fsdp.py's gathering_passes, so the estimator and the lowering agree: the
replay's pass categories, planning/pipeline_replay.py),
after_backward_shares (those of them that start right after a backward, beside its last reduce-scatter) and
shard_groups (the GPUs a class of parameters is gathered and reduce-scattered over, and those its shard is all-reduced
over under HSDP; unit_reduce_s prices a unit's reduction with them). Pure: no simpy, torch.
"""

from __future__ import annotations

import functools

import numpy as np

from piper_sim.collectives.algorithms import ALL_REDUCE
from piper_sim.collectives.sharded import REDUCE_SCATTER
from piper_sim.planning.pipeline_replay import num_categories, pass_categories


def gather_shares(
    schedule: str, pp: int, vpp: int, microbatches: int, stage: int, chunk: int, reshard_after_forward: bool
) -> tuple[float, float]:
    """(forwards, backwards) of chunk `chunk` at stage `stage` that gather its units, each as a share of the
    micro-batches: (1, 1) when every pass reshards; without resharding after the forward the forwards that follow a
    backward (or start the step) and the backwards that follow a backward."""
    if reshard_after_forward:
        return 1.0, 1.0
    return _pass_shares(schedule, pp, vpp, microbatches, False)[stage, chunk][:2]


def after_backward_shares(
    schedule: str, pp: int, vpp: int, microbatches: int, stage: int, chunk: int, reshard_after_forward: bool
) -> tuple[float, float]:
    """(forwards, backwards) of chunk `chunk` at stage `stage` that gather its units right after a backward pass of
    the stage's program, each as a share of the micro-batches: their first gather starts beside that backward's last
    reduce-scatter (issued as it ended, over the same groups' links). Every gathering pass but the step's first
    forward, in the steady order of any schedule that alternates or drains backwards."""
    return _pass_shares(schedule, pp, vpp, microbatches, reshard_after_forward)[stage, chunk][2:]


@functools.lru_cache(maxsize=4096)
def _pass_shares(
    schedule: str, pp: int, vpp: int, microbatches: int, reshard_after_forward: bool
) -> dict[tuple[int, int], tuple[float, float, float, float]]:
    """For every (stage, chunk) of one schedule at once: the shares of its forwards and backwards that gather
    (gather_shares) and of those that gather right after a backward (after_backward_shares), counted over the
    replay's categories of its passes (pipeline_replay.pass_categories)."""
    category = pass_categories(schedule, pp, vpp, microbatches, reshard_after_forward)
    counts = np.bincount(category[category >= 0], minlength=num_categories(pp, vpp)) / microbatches
    table = counts.reshape(pp, vpp, 3, 4)  # [stage, chunk, kind, 2 x gathers + follows a backward]
    return {
        (stage, chunk): (*table[stage, chunk, :2, 2:].sum(axis=1).tolist(), *table[stage, chunk, :2, 3].tolist())
        for stage in range(pp)
        for chunk in range(vpp)
    }


def unit_reduce_s(estimator, size_bytes: float, gpus: list[str], replicate: int) -> float:
    """One unit's gradients of one class reduced over its replica group `gpus` (CollectivePricer._replica_groups): a
    reduce-scatter within the shard group and, under HSDP, an all-reduce of the shard across the replicas."""
    shard, across = shard_groups({"c": gpus}, replicate)
    total = estimator._sharded_s(REDUCE_SCATTER, size_bytes, shard["c"]) if len(shard["c"]) > 1 else 0.0
    if len(across["c"]) > 1:
        total += estimator._sharded_s(ALL_REDUCE, size_bytes / len(shard["c"]), across["c"])
    return total


def shard_groups(groups: dict[str, list[str]], replicate: int) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """A stage rank's replica groups by class (CollectivePricer._replica_groups: every replica, in rank order) split for
    HSDP into (the shard group, the replicate group): with `replicate` replicas of each shard (the outermost
    data-parallel index, as torchtitan's dp_replicate), the first len / replicate members shard it and every
    (len / replicate)-th member holds the same shard. replicate 1: the whole group shards it and none replicates."""
    shard, across = {}, {}
    for kind, gpus in groups.items():
        size = len(gpus) // replicate if gpus else 0
        shard[kind] = gpus[:size] if replicate > 1 else gpus
        across[kind] = gpus[::size] if replicate > 1 and size else []
    return shard, across
