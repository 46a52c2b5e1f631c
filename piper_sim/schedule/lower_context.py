"""What the lowering passes share: the lowering's context and each virtual stage's segments.

Owns `LoweringContext` (the model, the stages' layers, the group axes of the all-to-alls and the gradient
reductions, the tensor split, recomputation and ZeRO settings of one lowering), the segments it memoizes per virtual
stage (forward, backward, recomputed) and the classes of gradients a step reduces (reduction_axes). Pure data:
imports no simpy, torch or numpy.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from piper_sim.schedule.ir import Layout, VirtualStages
from piper_sim.schedule.lower_segments import Segment, chunk_segments, selective_segments
from piper_sim.workload.deepspeed_zero import DEFAULT_GRADIENT_REDUCE
from piper_sim.workload.mesh import Mesh
from piper_sim.workload.model import ModelSpec
from piper_sim.workload.parallel import NO_SPLIT, TensorSplit
from piper_sim.workload.recompute import DEFAULT_SELECTIVE_MODULES, Recompute
from piper_sim.workload.task_kinds import Role, TaskKind

K = TaskKind
_FLIP = {Role.DISPATCH: Role.COMBINE, Role.COMBINE: Role.DISPATCH}


@dataclass(frozen=True, kw_only=True)
class LoweringContext:
    """What the lowering of one schedule reads: the model and its stages' layers, the group axes of the
    all-to-alls and the gradient reductions, the tensor split, recomputation and ZeRO; memoizes each virtual
    stage's segments."""

    model: ModelSpec
    pp: int
    vpp: int
    stage_layers: tuple[tuple[int, ...], ...]
    expert_group: str  # group axis of MoE all-to-alls
    reduce_dense_axis: str  # "" when there is nothing to reduce
    reduce_expert_axis: str
    reduce_replicated_axis: str = ""  # tp > 1: parameters every rank of the stage holds whole (norms, router)
    split: TensorSplit = NO_SPLIT
    migration: bool = False
    recompute: str = "none"  # none | selective | full
    recomputed: int | None = None  # full: layers of each chunk recomputed (None: all)
    recompute_modules: tuple[str, ...] = DEFAULT_SELECTIVE_MODULES  # selective: what it re-runs (workload/recompute.py)
    zero: int = 0  # sharded optimizer state: gradients reduce-scattered, parameters all-gathered
    reshard_after_forward: bool = True  # ZeRO-3: FSDP2's (schedule/lower_fsdp.py: gathering_passes)
    gradient_reduce: str = DEFAULT_GRADIENT_REDUCE  # ZeRO-1/2: deepspeed, bucket all-reduces (lower_reductions.py)
    mesh: Mesh | None = None  # ZeRO-3 under HSDP: its shard and replicate groups (schedule/lower_fsdp.py: shard_axes)
    gathering: frozenset[str] | None = None  # ZeRO-3: the stage's coarse passes that gather (None: every one)
    layout: Layout = Layout.INTERLEAVED
    overlap_all_to_all: bool = False  # pairs of a forward and an independent backward interleaved (lower_overlap.py)
    _memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # per virtual stage

    @property
    def stages(self) -> VirtualStages:
        hit = self._memo.get("stages")
        if hit is None:  # asked for every coarse task: built once
            hit = self._memo["stages"] = VirtualStages(self.layout, self.pp, self.vpp)
        return hit

    def segments(self, virtual_stage: int) -> list[Segment]:
        """A chunk's forward segments (the same for every microbatch; do not modify the list)."""
        key = (K.FORWARD, virtual_stage)
        if key not in self._memo:
            self._memo[key] = chunk_segments(
                self.model,
                self.stage_layers[virtual_stage],
                first=self.stages.is_first(virtual_stage),
                last=self.stages.is_last(virtual_stage),
                split=self.split,
            )
        return self._memo[key]

    def backward_segments(self, virtual_stage: int) -> list[Segment]:
        """The forward's segments in reverse, each all-to-all's role the other's (dispatch's gradient is a combine)."""
        key = (K.BACKWARD, virtual_stage)
        if key not in self._memo:
            self._memo[key] = [
                replace(s, role=_FLIP[s.role]) if s.role else s for s in reversed(self.segments(virtual_stage))
            ]
        return self._memo[key]

    def recompute_segments(self, virtual_stage: int) -> list[Segment]:
        key = (K.RECOMPUTE, virtual_stage)
        if key not in self._memo:
            self._memo[key] = _recompute_segments(self, virtual_stage)
        return self._memo[key]


def reduction_axes(ctx: LoweringContext) -> list[tuple[str, str]]:
    """(class, group axis) of each class of gradients reduced over a group: dense, expert, replicated."""
    return [
        (kind, axis)
        for kind, axis in (
            ("dense", ctx.reduce_dense_axis),
            ("expert", ctx.reduce_expert_axis),
            ("replicated", ctx.reduce_replicated_axis),
        )
        if axis
    ]


def _recompute_segments(ctx: LoweringContext, v: int) -> list[Segment]:
    """What a chunk re-runs before its backward: full, the forward of its first recomputed layers (their
    all-to-alls included); selective, its layers' recompute modules (selective_segments)."""
    layers = ctx.stage_layers[v]
    if ctx.recompute == Recompute.SELECTIVE:
        return selective_segments(ctx.model, layers, ctx.recompute_modules)
    if ctx.recompute == Recompute.FULL:
        redo = layers if ctx.recomputed is None else layers[: ctx.recomputed]
        return (
            chunk_segments(ctx.model, redo, first=ctx.stages.is_first(v), last=False, split=ctx.split) if redo else []
        )
    return []
