"""Lowering: coarse per-chunk forward/backward programs -> executable programs.

Owns lower() and the expansion of each coarse task into tasks: a chunk's segments (lower_segments.py) as compute
tasks, all-to-alls and tensor-parallel collectives, the pipeline send/recv pairs between stages, the recomputation
before a backward, and ZeRO-3's units (lower_fsdp.py), with the gradient reductions and the optimizer step at the
end of each program (lower_reductions.py). What the passes share is lower_context.py's. Pure data: imports no
simpy, torch or numpy.
"""

from __future__ import annotations

from dataclasses import replace

from piper_sim.schedule.ir import Schedule, Task
from piper_sim.schedule.lower_context import LoweringContext
from piper_sim.schedule.lower_context_parallel import ring_tasks
from piper_sim.schedule.lower_fsdp import gathering_passes, unit_collectives, unit_runs, with_gathers
from piper_sim.schedule.lower_overlap import combined_order, interleaved, issued, pairs
from piper_sim.schedule.lower_reductions import bucket_reduce_scatters, reduction_tasks
from piper_sim.schedule.lower_segments import Segment
from piper_sim.workload.deepspeed_zero import DEFAULT_GRADIENT_REDUCE
from piper_sim.workload.model import ModelSpec
from piper_sim.workload.parallel import TensorSplit
from piper_sim.workload.recompute import DEFAULT_SELECTIVE_MODULES
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
    gradient_reduce: str = DEFAULT_GRADIENT_REDUCE,
    overlap_all_to_all: bool = False,
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
    reshard_after_forward false only the passes that find their chunk sharded gather (gathering_passes).
    gradient_reduce deepspeed (zero 1 or 2): each reduce-scatter becomes the all-reduces of DeepSpeed's buckets
    (lower_reductions.py, workload/deepspeed_zero.py). The mesh's tp and etp, and sp, place the tensor-parallel
    collectives (TensorSplit; docs/tensor-parallel.md). overlap_all_to_all: each forward that runs right before the
    backward of another micro-batch is lowered with it as one interleaved pass whose MoE all-to-alls are issued on
    the communication stream (lower_overlap.py; not with zero 3).
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
        gradient_reduce=gradient_reduce,
        mesh=mesh,
        overlap_all_to_all=overlap_all_to_all,
    )
    programs = tuple(_lower_stage(ctx, p, program) for p, program in enumerate(coarse.stage_programs))
    return replace(coarse, stage_programs=programs, lowered=True, stage_layers=stage_layers)


def _lower_stage(ctx: LoweringContext, pp_index: int, coarse: tuple[Task, ...]) -> tuple[Task, ...]:
    if ctx.zero == 3:
        ctx = replace(ctx, gathering=gathering_passes(coarse, reshard_after_forward=ctx.reshard_after_forward))
    if ctx.overlap_all_to_all and ctx.pp == 1:
        coarse = combined_order(coarse)
    out: list[Task] = []
    last_of: dict[str, str] = {}  # coarse id -> id of its last lowered task (local deps)
    paired: Task | None = None  # a forward lowered with the backward after it (lower_overlap.py), waiting for it
    for i, task in enumerate(coarse):
        if paired is not None:
            forward = issued(_lower_task(ctx, pp_index, paired, last_of))
            last_of[paired.task_id] = _last_blocking(forward)
            backward = issued(_lower_task(ctx, pp_index, task, last_of))
            new = interleaved(forward, backward)
            paired = None
        elif ctx.overlap_all_to_all and pairs(task, coarse[i + 1] if i + 1 < len(coarse) else None):
            paired = task
            continue
        else:
            new = backward = _lower_task(ctx, pp_index, task, last_of)
        last_of[task.task_id] = _last_blocking(backward)
        out.extend(new)
        if ctx.zero == 2 and task.kind in (K.BACKWARD, K.BACKWARD_WEIGHT):  # the chunk's weight gradients are done
            out.extend(bucket_reduce_scatters(ctx, ctx.stages.of(pp_index, task.chunk), task, last_of[task.task_id]))
    out.extend(reduction_tasks(ctx, out, pp_index))
    return tuple(out)


def _lower_task(ctx: LoweringContext, pp_index: int, task: Task, last_of: dict[str, str]) -> list[Task]:
    """One coarse task's lowered tasks."""
    v = ctx.stages.of(pp_index, task.chunk)
    if task.kind == K.FORWARD:
        return _lower_forward(ctx, pp_index, v, task, last_of)
    if task.kind in (K.BACKWARD, K.BACKWARD_INPUT):
        return _lower_backward(ctx, pp_index, v, task, last_of)
    if task.kind == K.BACKWARD_WEIGHT:
        ops = tuple(op for s in ctx.segments(v) for op in s.ops)
        deps = tuple(last_of[d] for d in task.deps)
        return [
            Task(
                task_id=task.task_id,
                kind=K.BACKWARD_WEIGHT,
                microbatch=task.microbatch,
                chunk=task.chunk,
                ops=ops,
                deps=deps,
            )
        ]
    raise ValueError(f"cannot lower coarse task kind {task.kind!r}")


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
        tasks.extend(with_gathers(_chained(runs), unit_collectives(ctx, v, task, "F")))
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
        _chained(runs), unit_collectives(ctx, v, task, "B"), unit_collectives(ctx, v, task, "B", reduce=True)
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
