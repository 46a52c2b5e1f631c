"""The pieces of a chunk's passes that the lowering (lower.py) expands into tasks.

Owns `Segment` and what a chunk is cut into: its forward's compute segments split at each MoE layer's
all-to-alls and around the tensor-parallel collectives (chunk_segments), and what selective recomputation re-runs
of its layers (selective_segments). Pure data: imports no simpy, torch or numpy.

Segments of one chunk's forward (layers l0..l1): ops run until a MoE layer's router, then the
dispatch all-to-all, the experts, the combine all-to-all, and the next segment starts with that
layer's moe_out. Backward runs the segments in reverse; an all-to-all's backward moves data the
other way, so its role flips ("dispatch" always means token owners -> expert owners).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from piper_sim.workload.model import ModelSpec
from piper_sim.workload.parallel import NO_SPLIT, TensorSplit
from piper_sim.workload.task_kinds import Role, TaskKind

K = TaskKind


@dataclass(frozen=True, kw_only=True)
class Segment:
    """A piece of a chunk's forward: compute ops, an all-to-all of one MoE layer, or a tensor-parallel
    collective (tp: its kind in the forward and in the backward, "" where that pass has none). ring: compute
    (a layer's attention) beside which the context-parallel ring passes keys and values
    (schedule/lower_context_parallel.py)."""

    ops: tuple[str, ...] = ()
    expert: bool = False
    role: Role = Role.NONE  # DISPATCH / COMBINE for all-to-all pieces
    layer: int = -1
    tp: tuple[TaskKind | Literal[""], TaskKind | Literal[""]] = ("", "")
    ring: bool = False


def around_split(split: TensorSplit, layer: int) -> tuple[Segment, Segment]:
    """The collectives around a region split over the tensor-parallel group (Megatron's f and g: an all-reduce
    in the backward before it and in the forward after it; with sequence parallelism an all-gather before and
    a reduce-scatter after, each the other's backward)."""
    if split.sp:
        return (
            Segment(tp=(K.ALL_GATHER, K.REDUCE_SCATTER), layer=layer),
            Segment(tp=(K.REDUCE_SCATTER, K.ALL_GATHER), layer=layer),
        )
    return Segment(tp=("", K.ALL_REDUCE), layer=layer), Segment(tp=(K.ALL_REDUCE, ""), layer=layer)


def around_moe(split: TensorSplit, layer: int) -> tuple[Segment | None, Segment | None]:
    """Around a MoE block: split like a dense FFN when the experts are (etp == tp); with whole experts (etp 1)
    each rank routes its slice of the tokens, gathered after the block unless the sequence stays split (sp);
    the slice's gradients are gathered in the backward."""
    if split.etp == split.tp:
        return around_split(split, layer)
    if split.sp:
        return None, None
    return Segment(tp=("", K.ALL_GATHER), layer=layer), Segment(tp=(K.ALL_GATHER, ""), layer=layer)


def chunk_segments(
    model: ModelSpec, layers: tuple[int, ...], *, first: bool, last: bool, split: TensorSplit = NO_SPLIT
) -> list[Segment]:
    """The forward of one chunk as compute segments, all-to-alls and tensor-parallel collectives, in order."""
    segments: list[Segment] = []
    ops: list[str] = []

    def flush() -> None:
        if ops:
            segments.append(Segment(ops=tuple(ops)))
            ops.clear()

    def region(before: Segment | None, body: list[str], after: Segment | None, ring: bool = False) -> None:
        if split.tp == 1 and not ring:  # nothing between the ops: they run as one segment
            ops.extend(body)
            return
        flush()
        if before is not None and split.tp > 1:
            segments.append(before)
        if ring:  # the attention alone, its context-parallel ring beside it
            segments.append(Segment(ops=tuple(body), ring=True, layer=int(body[0].partition(":")[2])))
        else:
            ops.extend(body)
        if after is not None and split.tp > 1:
            flush()
            segments.append(after)

    if first:  # a vocabulary-parallel embedding sums its shards' lookups
        region(None, ["embed"], around_split(split, -1)[1])
    for layer in layers:
        before, after = around_split(split, layer)
        region(before, [f"attn:{layer}"], after, ring=split.cp > 1)
        if not model.is_moe_layer(layer):
            before, after = around_split(split, layer)
            region(before, [f"dense:{layer}"], after)
            continue
        moe_before, moe_after = around_moe(split, layer)
        region(moe_before, [f"router:{layer}"] + ([f"shared:{layer}"] if model.num_shared_experts else []), None)
        flush()
        segments.append(Segment(role=Role.DISPATCH, layer=layer))
        segments.append(Segment(ops=(f"experts:{layer}",), expert=True))
        segments.append(Segment(role=Role.COMBINE, layer=layer))
        region(None, [f"moe_out:{layer}"], moe_after)
    if last:  # a vocabulary-parallel head: its input is replicated (gathered under sp)
        region(around_split(split, -1)[0], ["head"], None)
    flush()
    return segments


def selective_segments(model: ModelSpec, layers: tuple[int, ...], modules: tuple[str, ...]) -> list[Segment]:
    """What selective recomputation re-runs of these layers before their backward (workload/recompute.py):
    "core_attn" each layer's attention core, "layernorm" the norms that are modules of their own (the input norm
    under MLA, the pre-MoE norm of a MoE layer), both in one segment; "moe_act" each MoE layer's expert activation,
    an expert segment per layer (priced over the rows each rank's experts got in that layer)."""
    ops: list[str] = []
    for layer in layers:
        ops += [f"attn_core:{layer}"] if "core_attn" in modules else []
        if "layernorm" in modules:
            ops += ([f"attn_norm:{layer}"] if model.mla is not None else []) + (
                [f"moe_norm:{layer}"] if model.is_moe_layer(layer) else []
            )
    acts = [
        Segment(ops=(f"moe_act:{layer}",), expert=True)
        for layer in layers
        if "moe_act" in modules and model.is_moe_layer(layer)
    ]
    return ([Segment(ops=tuple(ops))] if ops else []) + acts
