"""Lowering passes: coarse per-chunk forward/backward programs -> executable programs.

Owns the expansion of each coarse task into compute segments split at MoE all-to-alls, the
pipeline send/recv pairs, the gradient reductions and the optimizer step. Pure data: imports no
simpy, torch or numpy.

Segments of one chunk's forward (layers l0..l1): ops run until a MoE layer's router, then the
dispatch all-to-all, the experts, the combine all-to-all, and the next segment starts with that
layer's moe_out. Backward runs the segments in reverse; an all-to-all's backward moves data the
other way, so its role flips ("dispatch" always means token owners -> expert owners).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from piper_sim.schedule.ir import Layout, Schedule, Task, VirtualStages
from piper_sim.schedule.lower_context_parallel import ring_tasks
from piper_sim.schedule.lower_fsdp import gathering_passes, shard_axes, unit_runs, with_gathers
from piper_sim.workload.fsdp import unit_classes
from piper_sim.workload.mesh import Mesh
from piper_sim.workload.model import ModelSpec
from piper_sim.workload.parallel import NO_SPLIT, TensorSplit
from piper_sim.workload.recompute import DEFAULT_SELECTIVE_MODULES, Recompute
from piper_sim.workload.task_kinds import Role, TaskKind

K = TaskKind
BACKWARD_KIND = {
    (K.BACKWARD, False): K.BACKWARD,
    (K.BACKWARD, True): K.BACKWARD_EXPERT,
    (K.BACKWARD_INPUT, False): K.BACKWARD_INPUT,
    (K.BACKWARD_INPUT, True): K.BACKWARD_EXPERT_INPUT,
    (K.RECOMPUTE, False): K.RECOMPUTE,
    (K.RECOMPUTE, True): K.RECOMPUTE_EXPERT,
}


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


@dataclass(frozen=True, kw_only=True)
class LoweringContext:
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
    mesh: Mesh | None = None  # ZeRO-3 under HSDP: its shard and replicate groups (schedule/lower_fsdp.py: shard_axes)
    gathering: frozenset[str] | None = None  # ZeRO-3: the stage's coarse passes that gather (None: every one)
    layout: Layout = Layout.INTERLEAVED
    _memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # per virtual stage

    @property
    def stages(self) -> VirtualStages:
        return VirtualStages(self.layout, self.pp, self.vpp)

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


def lower(
    coarse: Schedule,
    model: ModelSpec,
    stage_layers: tuple[tuple[int, ...], ...],
    *,
    migration: bool = False,
    recompute: str = "none",
    recomputed: int | None = None,
    zero: int = 0,
    sp: bool = False,
    reshard_after_forward: bool = True,
    recompute_modules: tuple[str, ...] = DEFAULT_SELECTIVE_MODULES,
) -> Schedule:
    """Lower a generator's coarse schedule into executable per-stage programs.

    migration: end each program with a `migrate` exchange over the EP group (expert migration
    between steps), when there is more than one EP rank. recompute: before each chunk's backward,
    "full" re-runs the forward of its first `recomputed` layers (all when None; their all-to-alls too),
    "selective" each layer's recompute_modules (workload/recompute.py; the attention core by default) (kinds
    recompute / recompute_expert, after the gradient arrives). zero > 0: gradients are reduce-scattered and the
    updated parameters all-gathered after the optimizer step, in place of one all-reduce: zero 1 reduce-scatters
    once before the optimizer, zero 2 each chunk's gradients as each micro-batch's backward finishes them; zero 3
    gathers each unit's parameters before its forward and its backward and reduce-scatters its gradients after its
    backward, every micro-batch (schedule/lower_fsdp.py), and gathers nothing after the optimizer; with
    reshard_after_forward false only the passes that find their chunk sharded gather (gathering_passes). The
    mesh's tp and etp, and sp, place the
    tensor-parallel collectives (TensorSplit; docs/tensor-parallel.md).
    """
    mesh = coarse.mesh
    ctx = LoweringContext(
        model=model,
        pp=coarse.pp,
        vpp=coarse.vpp,
        stage_layers=stage_layers,
        expert_group="ep",
        reduce_dense_axis="ep_dp" if mesh.data_parallel > 1 else "",
        reduce_expert_axis="dp" if mesh.dp > 1 else "",
        reduce_replicated_axis="stage" if mesh.tp > 1 else "",
        split=TensorSplit(tp=mesh.tp, sp=sp, etp=mesh.etp, cp=mesh.cp),
        migration=migration and mesh.ep > 1,
        recompute=recompute,
        recomputed=recomputed,
        zero=zero,
        layout=coarse.layout,
        recompute_modules=tuple(recompute_modules),
        reshard_after_forward=reshard_after_forward,
        mesh=mesh,
    )
    programs = tuple(_lower_stage(ctx, p, program) for p, program in enumerate(coarse.stage_programs))
    return replace(coarse, stage_programs=programs, lowered=True, stage_layers=stage_layers)


def _lower_stage(ctx: LoweringContext, pp_index: int, coarse: tuple[Task, ...]) -> tuple[Task, ...]:
    if ctx.zero == 3:
        ctx = replace(ctx, gathering=gathering_passes(coarse, reshard_after_forward=ctx.reshard_after_forward))
    out: list[Task] = []
    last_of: dict[str, str] = {}  # coarse id -> id of its last lowered task (local deps)
    for task in coarse:
        v = ctx.stages.of(pp_index, task.chunk)
        if task.kind == K.FORWARD:
            new = _lower_forward(ctx, pp_index, v, task, last_of)
        elif task.kind in (K.BACKWARD, K.BACKWARD_INPUT):
            new = _lower_backward(ctx, pp_index, v, task, last_of)
        elif task.kind == K.BACKWARD_WEIGHT:
            ops = tuple(op for s in ctx.segments(v) for op in s.ops)
            deps = tuple(last_of[d] for d in task.deps)
            new = [
                Task(
                    task_id=task.task_id,
                    kind=K.BACKWARD_WEIGHT,
                    microbatch=task.microbatch,
                    chunk=task.chunk,
                    ops=ops,
                    deps=deps,
                )
            ]
        else:
            raise ValueError(f"cannot lower coarse task kind {task.kind!r}")
        last_of[task.task_id] = _last_blocking(new)
        out.extend(new)
        if ctx.zero == 2 and task.kind in (K.BACKWARD, K.BACKWARD_WEIGHT):  # the chunk's weight gradients are done
            out.extend(_bucket_reduce_scatters(ctx, task, last_of[task.task_id]))
    out.extend(_reduction_tasks(ctx, out))
    return tuple(out)


def _reduction_axes(ctx: LoweringContext) -> list[tuple[str, str]]:
    return [
        (kind, axis)
        for kind, axis in (
            ("dense", ctx.reduce_dense_axis),
            ("expert", ctx.reduce_expert_axis),
            ("replicated", ctx.reduce_replicated_axis),
        )
        if axis
    ]


def _bucket_reduce_scatters(ctx: LoweringContext, task: Task, after: str) -> list[Task]:
    """ZeRO-2 (Rajbhandari et al. 2020, section 5.2): each micro-batch's gradients of a chunk are reduce-scattered
    as its backward finishes them, into the rank's gradient shard; the full gradients do not outlive the chunk's
    backward."""
    c, m = task.chunk, task.microbatch
    tasks: list[Task] = []
    for kind, axis in _reduction_axes(ctx):
        tasks.append(
            Task(
                task_id=f"reducescatter:grad_{kind}:c{c}:m{m}",
                kind=K.REDUCE_SCATTER,
                role=Role(f"grad_{kind}"),
                chunk=c,
                microbatch=m,
                group_axis=axis,
                deps=(after,),
            )
        )
    return tasks


def _lower_forward(ctx: LoweringContext, p: int, v: int, task: Task, last_of: dict[str, str]) -> list[Task]:
    c, m = task.chunk, task.microbatch
    prefix = f"F:c{c}:m{m}"
    tasks: list[Task] = []
    deps: tuple[str, ...] = ()
    prev, after = ctx.stages.previous(v), ctx.stages.next(v)
    if prev is not None:
        prev_stage, prev_chunk = ctx.stages.where(prev)
        if prev_stage != p:
            tasks.append(
                Task(
                    task_id=f"recv:act:c{c}:m{m}",
                    kind=K.RECV,
                    microbatch=m,
                    chunk=c,
                    role=Role.ACT,
                    peer_stage=prev_stage,
                    tag=f"act:v{v}:m{m}",
                )
            )
            deps = (tasks[-1].task_id,)
        else:  # previous virtual stage on this same rank: a local dependency
            deps = (last_of[f"F:c{prev_chunk}:m{m}"],)
    if ctx.zero == 3:
        runs = [
            (u, _expand(segs, f"{prefix}:u{u}", K.FORWARD, task, deps, ctx.expert_group))
            for u, segs in unit_runs(ctx.segments(v), ctx.stage_layers[v])
        ]
        tasks.extend(with_gathers(_chained(runs), _unit_collectives(ctx, v, task, "F")))
    else:
        tasks.extend(_expand(ctx.segments(v), prefix, K.FORWARD, task, deps, ctx.expert_group))
    if after is not None and ctx.stages.where(after)[0] != p:
        tasks.append(
            Task(
                task_id=f"send:act:c{c}:m{m}",
                kind=K.SEND,
                microbatch=m,
                chunk=c,
                role=Role.ACT,
                peer_stage=ctx.stages.where(after)[0],
                tag=f"act:v{after}:m{m}",
                deps=(tasks[-1].task_id,),
            )
        )
    return tasks


def _lower_backward(ctx: LoweringContext, p: int, v: int, task: Task, last_of: dict[str, str]) -> list[Task]:
    c, m = task.chunk, task.microbatch
    prefix = f"B:c{c}:m{m}"
    tasks: list[Task] = []
    deps = tuple(last_of[d] for d in task.deps)
    prev, after = ctx.stages.previous(v), ctx.stages.next(v)
    if after is not None:
        next_stage, next_chunk = ctx.stages.where(after)
        if next_stage != p:
            tasks.append(
                Task(
                    task_id=f"recv:grad:c{c}:m{m}",
                    kind=K.RECV,
                    microbatch=m,
                    chunk=c,
                    role=Role.GRAD,
                    peer_stage=next_stage,
                    tag=f"grad:v{v}:m{m}",
                )
            )
            deps = (*deps, tasks[-1].task_id)
        else:
            deps = (*deps, last_of[f"B:c{next_chunk}:m{m}"])
    redo = ctx.recompute_segments(v) if task.kind != K.BACKWARD_WEIGHT else []
    if ctx.zero == 3:
        tasks.extend(_fsdp_backward(ctx, v, task, deps, redo))
    elif redo:
        tasks.extend(_expand(redo, f"R:c{c}:m{m}", K.RECOMPUTE, task, deps, ctx.expert_group))
        deps = (tasks[-1].task_id,)
    if ctx.zero != 3:
        tasks.extend(_expand(ctx.backward_segments(v), prefix, task.kind, task, deps, ctx.expert_group))
    if prev is not None and ctx.stages.where(prev)[0] != p:
        tasks.append(
            Task(
                task_id=f"send:grad:c{c}:m{m}",
                kind=K.SEND,
                microbatch=m,
                chunk=c,
                role=Role.GRAD,
                peer_stage=ctx.stages.where(prev)[0],
                tag=f"grad:v{prev}:m{m}",
                deps=(_last_blocking(tasks),),
            )
        )
    return tasks


_FLIP = {Role.DISPATCH: Role.COMBINE, Role.COMBINE: Role.DISPATCH}


def _last_blocking(tasks: list[Task]) -> str:
    """The last task of a lowered pass that blocks the program counter (not a send or a nonblocking collective)."""
    return next(t.task_id for t in reversed(tasks) if not t.is_issued)


def _fsdp_backward(ctx: LoweringContext, v: int, task: Task, deps: tuple[str, ...], redo: list[Segment]) -> list[Task]:
    """ZeRO-3: a chunk's backward unit by unit (last first), each unit's recomputation right before its backward
    (as a per-block checkpoint re-runs it inside the block's backward), with the units' gathers prefetched and
    their gradients reduce-scattered (schedule/lower_fsdp.py)."""
    c, m, layers = task.chunk, task.microbatch, ctx.stage_layers[v]
    again = dict(unit_runs(redo, layers))
    runs: list[tuple[int, list[Task]]] = []
    for u, segs in unit_runs(ctx.backward_segments(v), layers, backward=True):
        unit_tasks = _expand(again.pop(u, []), f"R:c{c}:m{m}:u{u}", K.RECOMPUTE, task, deps, ctx.expert_group)
        after = (unit_tasks[-1].task_id,) if unit_tasks else deps
        unit_tasks += _expand(segs, f"B:c{c}:m{m}:u{u}", task.kind, task, after, ctx.expert_group)
        runs.append((u, unit_tasks))
    return with_gathers(
        _chained(runs), _unit_collectives(ctx, v, task, "B"), _unit_collectives(ctx, v, task, "B", reduce=True)
    )


def _chained(runs: list[tuple[int, list[Task]]]) -> list[tuple[int, list[Task]]]:
    """Runs expanded each from the pass's input: each run's first task made to follow the run before it."""
    out: list[tuple[int, list[Task]]] = []
    for u, tasks in runs:
        if out and tasks:
            tasks = [replace(tasks[0], deps=(out[-1][1][-1].task_id,)), *tasks[1:]]
        if tasks:
            out.append((u, tasks))
    return out


def _unit_collectives(ctx: LoweringContext, v: int, task: Task, pass_: str, reduce: bool = False):
    """ZeRO-3: the collectives of one unit of a chunk (schedule.lower_fsdp.Collectives), one per class of parameters it
    holds: its parameters' all-gathers, or (reduce) its gradients' reduce-scatters."""
    c, m, layers = task.chunk, task.microbatch, ctx.stage_layers[v]
    what, kind = ("grad", K.REDUCE_SCATTER) if reduce else ("param", K.ALL_GATHER)
    name = "reducescatter" if reduce else f"allgather:{pass_}"
    if not reduce and ctx.gathering is not None and task.task_id not in ctx.gathering:
        return lambda unit, deps: []  # the chunk's units are still gathered (reshard_after_forward false)

    def collectives(unit: int, deps: tuple[str, ...]) -> list[Task]:
        held = unit_classes(
            ctx.model, unit, last=ctx.stages.is_last(v) and unit == (layers[-1:] or (unit,))[0], tp=ctx.split.tp
        )
        tasks: list[Task] = []
        for cls, _ in _reduction_axes(ctx):
            shard, across = shard_axes(ctx.mesh, cls)
            if cls not in held:
                continue
            if shard:
                tasks.append(
                    Task(
                        task_id=f"{name}:{what}_{cls}:c{c}:m{m}:u{unit}",
                        kind=kind,
                        role=Role(f"{what}_{cls}"),
                        chunk=c,
                        microbatch=m,
                        layer=unit,
                        group_axis=shard,
                        deps=deps,
                        nonblocking=True,
                    )
                )
            if reduce and across:  # HSDP: the reduced shard summed over its replicas
                tasks.append(
                    Task(
                        task_id=f"allreduce:grad_{cls}:c{c}:m{m}:u{unit}",
                        kind=K.ALL_REDUCE,
                        role=Role(f"grad_{cls}"),
                        chunk=c,
                        microbatch=m,
                        layer=unit,
                        group_axis=across,
                        deps=(tasks[-1].task_id,) if shard else deps,
                        nonblocking=True,
                    )
                )
        return tasks

    return collectives


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


def _expand(
    segments: list[Segment], prefix: str, kind: TaskKind, task: Task, deps: tuple[str, ...], expert_group: str
) -> list[Task]:
    tasks: list[Task] = []
    forward = kind in (K.FORWARD, K.RECOMPUTE)
    for index, seg in enumerate(segments):
        if seg.tp != ("", ""):
            tp_kind = seg.tp[0] if forward else seg.tp[1]
            if not tp_kind:
                continue
            new = Task(
                task_id=f"{prefix}:s{index}:tp",
                kind=tp_kind,
                microbatch=task.microbatch,
                chunk=task.chunk,
                role=Role.TP,
                layer=seg.layer,
                group_axis="tp",
                deps=deps,
            )
        elif seg.role:
            new = Task(
                task_id=f"{prefix}:L{seg.layer}:{seg.role}",
                kind=K.ALL_TO_ALL,
                microbatch=task.microbatch,
                chunk=task.chunk,
                role=seg.role,
                layer=seg.layer,
                group_axis=expert_group,
                deps=deps,
            )
        else:
            seg_kind = (
                kind
                if kind == K.FORWARD and not seg.expert
                else (K.FORWARD_EXPERT if kind == K.FORWARD else BACKWARD_KIND[(kind, seg.expert)])
            )
            new = Task(
                task_id=f"{prefix}:s{index}",
                kind=seg_kind,
                microbatch=task.microbatch,
                chunk=task.chunk,
                ops=seg.ops,
                deps=deps,
            )
            if seg.ring:  # issued with the attention, waited for by what follows it
                ring = ring_tasks(new.task_id, task, seg.layer, deps, forward)
                tasks.extend([*ring, new])
                deps = (new.task_id, *(r.task_id for r in ring))
                continue
        tasks.append(new)
        deps = (new.task_id,)
    return tasks


def _reduction_tasks(ctx: LoweringContext, program: list[Task]) -> list[Task]:
    last = program[-1].task_id
    tasks: list[Task] = []
    if ctx.layout == Layout.BIDIRECTIONAL:  # DualPipe's two copies of the layers: every gradient summed first
        tasks.append(
            Task(
                task_id="allreduce:grad_mirror",
                kind=K.ALL_REDUCE,
                role=Role.GRAD_MIRROR,
                group_axis="mirror",
                deps=(last,),
            )
        )
        last = tasks[-1].task_id
    axes = _reduction_axes(ctx)
    if ctx.zero == 3:  # each unit's gradients were reduce-scattered after its backward: the step waits for them
        tasks.append(
            Task(
                task_id="optimizer",
                kind=K.OPTIMIZER,
                deps=(
                    last,
                    *(
                        t.task_id
                        for t in program
                        if t.kind in (K.REDUCE_SCATTER, K.ALL_REDUCE) and t.nonblocking and t.role != Role.CP
                    ),
                ),
            )
        )
        return tasks  # the parameters stay sharded until the next step gathers them
    for kind, axis in axes if ctx.zero != 2 else ():  # ZeRO-2 reduce-scattered each chunk's as it finished
        if ctx.zero:
            tasks.append(
                Task(
                    task_id=f"reducescatter:grad_{kind}",
                    kind=K.REDUCE_SCATTER,
                    role=Role(f"grad_{kind}"),
                    group_axis=axis,
                    deps=(last,),
                )
            )
        else:
            tasks.append(
                Task(
                    task_id=f"allreduce:grad_{kind}",
                    kind=K.ALL_REDUCE,
                    role=Role(f"grad_{kind}"),
                    group_axis=axis,
                    deps=(last,),
                )
            )
        last = tasks[-1].task_id
    tasks.append(Task(task_id="optimizer", kind=K.OPTIMIZER, deps=(last,)))
    last = "optimizer"
    for kind, axis in axes if ctx.zero else ():
        tasks.append(
            Task(
                task_id=f"allgather:param_{kind}",
                kind=K.ALL_GATHER,
                role=Role(f"param_{kind}"),
                group_axis=axis,
                deps=(last,),
            )
        )
        last = tasks[-1].task_id
    if ctx.migration:
        tasks.append(Task(task_id="migrate", kind=K.ALL_TO_ALL, role=Role.MIGRATE, group_axis="ep", deps=(last,)))
    return tasks
