"""ZeRO-3 / FSDP: the sizes of a chunk's units and the memory of the units gathered at once (docs/sharding.md).

Owns unit_params (what one rank holds of each unit, by class) and gathered_window_bytes (the stage plan's ZeRO-3
transient), shared by the simulator's stage plans (sim/stage_plans.py), the planner's resource model and the estimator.
Units are fsdp.py's. Must not import simpy, torch or the schedule layer.
"""

from __future__ import annotations

from piper_sim.workload.fsdp import NO_BLOCK
from piper_sim.workload.memory import PARAM_CLASSES, rank_params
from piper_sim.workload.model import ModelSpec
from piper_sim.workload.parallel import NO_SPLIT, TensorSplit


def unit_params(
    model: ModelSpec, layers: tuple[int, ...], *, first: bool, last: bool, ep: int, split: TensorSplit = NO_SPLIT
) -> dict[int, dict[str, float]]:
    """Per unit of a chunk of these layers (first/last: it holds the embedding/the head), the parameters one rank
    holds of it by class (memory.rank_params)."""
    if not layers:
        return {NO_BLOCK: rank_params(model, (), first=first, last=last, ep=ep, split=split)}
    return {
        layer: rank_params(
            model, (layer,), first=first and layer == layers[0], last=last and layer == layers[-1], ep=ep, split=split
        )
        for layer in layers
    }


def gathered_params(params: dict[str, float], shards: dict[str, int]) -> float:
    """Of a unit's parameters by class, those that are gathered (their class is sharded over more than one
    replica)."""
    return sum(params[kind] for kind in PARAM_CLASSES if shards[kind] > 1)


def gathered_window_bytes(
    units: list[dict[str, float]], shards: dict[str, int], dtype_bytes: int, *, reshard_after_forward: bool = True
) -> float:
    """Bytes a rank's gathered units take at most, its units (of every chunk, in forward order) given: two
    consecutive units' full parameters (the one computing and the prefetched one) and, in the backward, two
    units' full gradients (the one computing and the one being reduce-scattered), 2 x dtype x the largest pair.
    Without resharding after the forward every unit of the stage stays gathered from its forward to its backward
    (in 1F1B's steady state and under GPipe each chunk has a forward whose backward has not run): dtype x all of
    them, plus the two units' gradients."""
    sizes = [gathered_params(u, shards) for u in units]
    pair = max((a + b for a, b in zip(sizes, sizes[1:], strict=False)), default=sizes[0] if sizes else 0.0)
    if not reshard_after_forward:
        return dtype_bytes * (sum(sizes) + pair)
    return 2 * dtype_bytes * pair
