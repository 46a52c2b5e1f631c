"""The estimator's ZeRO-3 / FSDP terms: which passes gather and over which groups (docs/sharding.md).

Owns gather_shares (the share of a chunk's forwards and backwards that find its units sharded, from the schedule
generator's own program and schedule/lower_fsdp.py's gathering_passes, so the estimator and the lowering agree) and
shard_groups (the GPUs a class of parameters is gathered and reduce-scattered over, and those its shard is all-reduced
over under HSDP; unit_reduce_s prices a unit's reduction with them). Pure: no simpy, torch.
"""

from __future__ import annotations

import functools

from piper_sim.collectives.algorithms import ALL_REDUCE
from piper_sim.collectives.sharded import REDUCE_SCATTER
from piper_sim.planning.resource import coarse_programs
from piper_sim.schedule.lower_fsdp import gathering_passes
from piper_sim.workload.task_kinds import TaskKind


def gather_shares(
    schedule: str, pp: int, vpp: int, microbatches: int, stage: int, chunk: int, reshard_after_forward: bool
) -> tuple[float, float]:
    """(forwards, backwards) of chunk `chunk` at stage `stage` that gather its units, each as a share of the
    micro-batches: (1, 1) when every pass reshards; without resharding after the forward the forwards that follow a
    backward (or start the step) and the backwards that follow a backward."""
    if reshard_after_forward:
        return 1.0, 1.0
    return _no_reshard_shares(schedule, pp, vpp, microbatches)[stage, chunk]


@functools.lru_cache(maxsize=4096)
def _no_reshard_shares(
    schedule: str, pp: int, vpp: int, microbatches: int
) -> dict[tuple[int, int], tuple[float, float]]:
    """gather_shares without resharding after the forward, for every (stage, chunk) of one schedule at once (its
    program is generated once, shared with the resource model's live counts: resource.coarse_programs)."""
    shares = {}
    for stage, program in enumerate(coarse_programs(schedule, pp, vpp, microbatches)):
        gathering = gathering_passes(program, reshard_after_forward=False)
        counts: dict[tuple[int, str], int] = {}
        for task in program:
            if task.task_id in gathering and task.kind in (TaskKind.FORWARD, TaskKind.BACKWARD):
                counts[task.chunk, task.kind] = counts.get((task.chunk, task.kind), 0) + 1
        for chunk in range(vpp):
            shares[stage, chunk] = (
                counts.get((chunk, TaskKind.FORWARD), 0) / microbatches,
                counts.get((chunk, TaskKind.BACKWARD), 0) / microbatches,
            )
    return shares


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
