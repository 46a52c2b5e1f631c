"""ZeRO-3 / FSDP: the units whose parameters are gathered, and the gather time prefetch leaves exposed.

Owns what the lowering (schedule/lower.py), the simulator's stage plans (sim/stage_plans.py) and the estimator share
about `optimizer.zero: 3` (docs/sharding.md); the units' sizes and memory are fsdp_state.py's:
- a unit is one transformer block, as torchtitan and NeMo AutoModel wrap each block with `fully_shard`; a chunk's
  embedding is gathered with its first block and its final norm and head with its last (a chunk with no block
  is one unit, -1);
- a unit's parameters of each class (memory.PARAM_CLASSES) are gathered over that class's replicas (the groups
  ZeRO-1/2 shard over: memory.param_shards); a class held whole (one replica) is not gathered;
- at most two units are gathered at once (the one computing and the prefetched next one), and in the backward two
  units' full gradients (the one computing and the one being reduce-scattered): fsdp_state.gathered_window_bytes;
- reshard_after_forward (FSDP2's fully_shard argument; `optimizer.reshard_after_forward`): true frees a unit's
  gathered parameters after its forward, false keeps them until its backward has run (resolve_reshard).
Pure data: must not import numpy, simpy, torch or the schedule layer (the lowering imports it).
"""

from __future__ import annotations

from piper_sim.errors import ConfigError
from piper_sim.workload.model import ModelSpec
from piper_sim.workload.ops import parse_op

NO_BLOCK = -1  # the unit of a chunk that holds no transformer block (only the embedding or the head)


def resolve_reshard(value: object, *, zero: int, pp: int) -> bool:
    """optimizer.reshard_after_forward, checked: true (FSDP2's fully_shard default), false, or "default" (torchtitan's
    fsdp_reshard_after_forward policy: true without pipeline parallelism, false with it); left out (None): true.
    Only with optimizer.zero 3."""
    if value is None:
        return True
    if zero != 3:
        raise ConfigError(
            "optimizer.reshard_after_forward",
            value,
            "left out unless optimizer.zero is 3 (it is FSDP's: only ZeRO-3 gathers parameters)",
        )
    if not isinstance(value, bool) and value != "default":
        raise ConfigError(
            "optimizer.reshard_after_forward",
            value,
            "true, false or default (torchtitan's: true without pipeline parallelism, false with it)",
        )
    return pp == 1 if value == "default" else bool(value)


def hsdp_replicate(dp_shard: object, *, data_parallel: int, dp: int) -> int:
    """parallel.dp_shard, checked: the ranks a ZeRO-3 shard of the dense layers spans (torchtitan's
    data_parallel_shard_degree; 0, the default: every data-parallel replica, no HSDP), and the replicas of each shard
    it leaves (torchtitan's data_parallel_replicate_degree), which must divide parallel.dp (the outermost index of a
    stage: every class of parameters is split into the same replicate blocks)."""
    if isinstance(dp_shard, bool) or not isinstance(dp_shard, int) or dp_shard < 0:
        raise ConfigError("parallel.dp_shard", dp_shard, "a non-negative integer (0: every data-parallel replica)")
    if dp_shard in (0, data_parallel):
        return 1
    allowed = sorted({data_parallel // r for r in range(1, dp + 1) if dp % r == 0})
    if data_parallel % dp_shard or dp % (data_parallel // dp_shard):
        raise ConfigError(
            "parallel.dp_shard",
            dp_shard,
            f"one of {', '.join(map(str, allowed))} (the "
            f"{data_parallel} data-parallel replicas over a number of replicate blocks that divides "
            f"parallel.dp, {dp}), or 0",
        )
    return data_parallel // dp_shard


def check_hsdp(replicate: int, zero: int) -> None:
    """HSDP shards only ZeRO-3's parameters: parallel.dp_shard below the replicas needs optimizer.zero 3."""
    if replicate > 1 and zero != 3:
        raise ConfigError(
            "optimizer.zero",
            zero,
            "3 with parallel.dp_shard (HSDP shards ZeRO-3's parameters within "
            "the shard group), or leave parallel.dp_shard out",
        )


def unit_of_op(op: str, layers: tuple[int, ...]) -> int:
    """The unit an op of a chunk of these layers uses: its layer; the embedding the first block's, the head the
    last block's."""
    layer = parse_op(op).layer
    if layer >= 0:
        return layer
    if not layers:
        return NO_BLOCK
    return layers[0] if op == "embed" else layers[-1]


def chunk_units(layers: tuple[int, ...]) -> tuple[int, ...]:
    """A chunk's units in forward order."""
    return layers if layers else (NO_BLOCK,)


def exposed_gather_s(gathers_s: list[float], computes_s: list[float]) -> float:
    """The gather time a pass leaves on its compute stream, its units' gathers and compute in the order it runs
    them: the first unit's gather whole, then each next unit's gather, prefetched while the unit before it computes
    (after that unit's own gather: one gather stream), as far as it outlasts that compute."""
    exposed = gathers_s[0] if gathers_s else 0.0
    for gather, compute in zip(gathers_s[1:], computes_s, strict=False):
        exposed += max(0.0, gather - compute)
    return exposed


def exposed_backward_s(gathers_s: list[float], reduces_s: list[float], computes_s: list[float]) -> float:
    """The communication a backward pass leaves on its compute stream, its units in the order it runs them: as
    exposed_gather_s, with each unit's gradient reduce-scatter (issued when its backward ends) moving over the same
    groups' links as the gather prefetched beside the next unit's compute (one link's bytes: their times add), and
    the second-to-last unit's reduce-scatter beside the last unit's compute (the last one's ends the pass: the step
    waits for it, priced with the gradients)."""
    moving = [g + (reduces_s[k - 2] if k >= 2 else 0.0) for k, g in enumerate(gathers_s)]
    tail = reduces_s[-2] - computes_s[-1] if len(reduces_s) >= 2 and computes_s else 0.0
    return exposed_gather_s(moving, computes_s) + max(0.0, tail)


def delayed_by_reduce_s(gather_s: float, reduce_s: float) -> float:
    """How much later a gather ends when a reduce-scatter over the same groups' links starts with it (a backward's
    last one, issued as that backward ended, beside the next pass's first gather): the two share each link fairly
    (max-min, as the simulator's flow network does), both at half rate until the shorter ends, so the gather ends
    min(gather_s, reduce_s) later."""
    return min(gather_s, reduce_s)


def unit_classes(model: ModelSpec, unit: int, *, last: bool, tp: int) -> tuple[str, ...]:
    """The classes of parameters (memory.PARAM_CLASSES) a unit holds (last: it holds the head): "dense" always;
    "replicated" with tp > 1 (its norms, or the final norm); "expert" a MoE block's (tests hold it to the classes
    memory.rank_params gives a positive count)."""
    replicated = ("replicated",) if tp > 1 and (unit >= 0 or last) else ()
    expert = ("expert",) if unit >= 0 and model.is_moe_layer(unit) else ()
    return ("dense", *replicated, *expert)
