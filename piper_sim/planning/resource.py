"""Memory per pipeline stage of a plan: Piper's resource model with the simulator's own formulas.

Owns stage_memory: per stage, the training state of the parameters the stage's ranks hold (16 bytes per
parameter in mixed precision: fp16 weight and grad, fp32 master, Adam m and v; workload/memory.py) plus the
peak of the activations alive at once under the plan's schedule (schedule/liveness.py: from a
(chunk, microbatch)'s first forward to its last backward, walked over the generator's own program, so
1F1B's stage i holds min(pp - i, M) microbatches, GPipe all M, interleaved and ZB-H1 by their orders).
These are the functions the simulator's memory tracker uses (workload/stage_memory.py), so under balanced routing the
model and the tracker agree exactly; skewed routing adds the rows a rank's experts really get, which only
the simulator sees.

A plan fits when every stage's peak is within HBM less the framework reserve (workload/memory.py).
Pure: no simpy, torch (the live counts per schedule shape are cached; peak = counts @ bytes per chunk).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import numpy as np

from piper_sim.planning.plan_point import PlanPoint
from piper_sim.schedule.build import split_layers
from piper_sim.schedule.generator_registry import SCHEDULES, schedule_layout
from piper_sim.schedule.ir import Task, VirtualStages
from piper_sim.schedule.liveness import activation_deltas
from piper_sim.workload.memory import rank_params
from piper_sim.workload.model import ModelSpec
from piper_sim.workload.parallel import ParallelSpec
from piper_sim.workload.recompute import DEFAULT_SELECTIVE_MODULES
from piper_sim.workload.stage_memory import stage_activation_terms, stage_memory_terms


@dataclass(frozen=True, kw_only=True)
class StageMemory:
    state_bytes: float  # weights, gradients and optimizer state of the parameters held (ZeRO-sharded)
    activation_bytes: float  # peak of the activations alive at once (with a recomputed layer's transient)

    @property
    def peak_bytes(self) -> float:
        return self.state_bytes + self.activation_bytes


@functools.lru_cache(maxsize=4096)
def coarse_programs(schedule: str, pp: int, vpp: int, num_microbatches: int) -> tuple[tuple[Task, ...], ...]:
    """The generator's per-stage programs (cached: many plans share a schedule shape)."""
    return SCHEDULES.get(schedule, "schedule")(pp, vpp, num_microbatches)


def stage_memory(
    model: ModelSpec,
    point: PlanPoint,
    *,
    flash_attention: bool = True,
    recompute_layers: int | None = None,
    checkpoint_layers: int | None = None,
    fp8_transposed_copies: bool = True,
    recompute_modules: tuple[str, ...] = DEFAULT_SELECTIVE_MODULES,
) -> list[StageMemory]:
    """Per pipeline stage: state and peak activation bytes of one of its ranks (a config's recompute_layers and
    recompute_checkpoint_layers where given; the planner's plans recompute whole chunks); fp8_transposed_copies:
    the device's, for a model in fp8 (DeviceProfile); recompute_modules: a config's, for selective recomputation."""
    # The terms do not depend on the micro-batch count (only live_counts does) nor on the all-to-all: plans that
    # differ only there share them (one lookup per plan). settings: _stage_terms' arguments after the stage.
    settings = (
        flash_attention,
        point.recompute,
        recompute_layers,
        point.zero,
        checkpoint_layers,
        fp8_transposed_copies,
        recompute_modules,
        point.reshard_after_forward,
    )
    layout = schedule_layout(point.schedule)
    mesh = (point.pp, point.ep, point.dp, point.tp, point.etp, point.sp, point.vpp, point.micro_batch_size)
    key = (model, layout, *mesh, point.cp, point.dp_shard, *settings)
    terms = _TERMS.get(key)
    if terms is None:
        if len(_TERMS) >= 65536:
            _TERMS.clear()
        parallel = replace(point.parallel, num_microbatches=1)
        shapes = [stage_shape(model, layout, point.pp, point.vpp, p) for p in range(point.pp)]
        first = {s: p for p, s in reversed(list(enumerate(shapes)))}  # stages of one shape have the same terms
        computed = {s: _stage_terms(model, layout, parallel, p, *settings) for s, p in first.items()}
        terms = _TERMS[key] = tuple(computed[s] for s in shapes)
    out = []
    for p, (state, act, transient) in enumerate(terms):
        counts = live_counts(point.schedule, point.pp, point.vpp, point.num_microbatches, p)
        peak = float(np.max(counts @ act))
        out.append(StageMemory(state_bytes=state, activation_bytes=peak + transient))
    return out


_TERMS: dict[tuple, tuple[tuple[float, np.ndarray, float], ...]] = {}  # stage_memory's terms of every stage


def stage_shape(model: ModelSpec, layout, pp: int, vpp: int, p: int) -> tuple:
    """What stage p's memory terms depend on of its place in the pipeline: per chunk, which of its layers are MoE
    layers (in order) and whether it starts or ends a pipeline (the embedding, the head and the loss). Every term of
    workload/stage_memory.py reads a layer through model.is_moe_layer, so stages of one shape (the middle stages of a
    pipeline, mostly) hold the same bytes."""
    stages, layers = _layout_layers(model.num_layers, layout, pp, vpp)
    chunks = [stages.of(p, c) for c in range(vpp)]
    return tuple((tuple(map(model.is_moe_layer, layers[v])), stages.is_first(v), stages.is_last(v)) for v in chunks)


def _stage_terms(
    model: ModelSpec,
    layout,
    parallel: ParallelSpec,
    p: int,
    flash_attention: bool,
    recompute: str,
    recompute_layers: int | None,
    zero: int,
    checkpoint_layers: int | None,
    fp8_transposed_copies: bool,
    recompute_modules: tuple[str, ...],
    reshard_after_forward: bool,
) -> tuple[float, np.ndarray, float]:
    """Stage p's (state bytes, activation bytes per chunk, transient bytes): stage_memory_terms
    (workload/stage_memory.py) for the stage's chunks of the layout (stage_memory keeps them per plan shape in
    _TERMS)."""
    stages, layers = _layout_layers(model.num_layers, layout, parallel.pp, parallel.vpp)
    chunks = [stages.of(p, c) for c in range(parallel.vpp)]
    held = tuple(layer for v in chunks for layer in layers[v])
    params = rank_params(
        model,
        held,
        first=any(map(stages.is_first, chunks)),
        last=any(map(stages.is_last, chunks)),
        ep=parallel.ep,
        split=parallel.split,
    )
    activations = _activation_terms(
        model,
        layout,
        parallel.pp,
        parallel.vpp,
        p,
        parallel.micro_batch_size,
        parallel.split,
        flash_attention,
        recompute,
        recompute_layers,
        checkpoint_layers,
        recompute_modules,
        parallel,
    )
    terms = stage_memory_terms(
        model,
        layers,
        chunks,
        parallel,
        params,
        flash_attention=flash_attention,
        recompute=recompute,
        recompute_layers=recompute_layers,
        zero=zero,
        stages=stages,
        checkpoint_layers=checkpoint_layers,
        fp8_transposed_copies=fp8_transposed_copies,
        recompute_modules=recompute_modules,
        reshard_after_forward=reshard_after_forward,
        activations=activations,
    )
    act = np.array([terms["act"][c] for c in range(parallel.vpp)])
    act.setflags(write=False)
    return terms["state"], act, terms["transient"]


_ACTIVATIONS: dict[tuple, tuple[dict[int, float], float]] = {}


def _activation_terms(
    model: ModelSpec,
    layout,
    pp: int,
    vpp: int,
    p: int,
    micro_batch_size: int,
    split,
    flash_attention: bool,
    recompute: str,
    recompute_layers: int | None,
    checkpoint_layers: int | None,
    recompute_modules: tuple[str, ...],
    parallel: ParallelSpec,
) -> tuple[dict[int, float], float]:
    """stage_memory.stage_activation_terms of stage p, memoized on what they depend on (the arguments but `parallel`,
    which only carries them): plans that differ in ZeRO, EP or DP share them."""
    key = (
        model,
        layout,
        pp,
        vpp,
        p,
        micro_batch_size,
        split,
        flash_attention,
        recompute,
        recompute_layers,
        checkpoint_layers,
        recompute_modules,
    )
    if key not in _ACTIVATIONS:
        if len(_ACTIVATIONS) >= 65536:
            _ACTIVATIONS.clear()
        stages, layers = _layout_layers(model.num_layers, layout, pp, vpp)
        _ACTIVATIONS[key] = stage_activation_terms(
            model,
            layers,
            [stages.of(p, c) for c in range(vpp)],
            parallel,
            flash_attention=flash_attention,
            recompute=recompute,
            recompute_layers=recompute_layers,
            stages=stages,
            checkpoint_layers=checkpoint_layers,
            recompute_modules=recompute_modules,
        )
    return _ACTIVATIONS[key]


@functools.lru_cache(maxsize=4096)
def _layout_layers(num_layers: int, layout, pp: int, vpp: int) -> tuple[VirtualStages, tuple[tuple[int, ...], ...]]:
    """The virtual stages of a layout and their layers (schedule.build.split_layers), once per shape."""
    stages = VirtualStages(layout, pp, vpp)
    return stages, split_layers(num_layers, stages)


@functools.lru_cache(maxsize=16384)
def live_counts(schedule: str, pp: int, vpp: int, num_microbatches: int, stage: int) -> np.ndarray:
    """[position, chunk]: microbatches of each chunk alive at each task of the stage's program, counted as the
    tracker counts them (a task's additions before its releases), so that the peak of live bytes is
    max(counts @ bytes per chunk) (schedule.liveness.peak_live_bytes, computed once per schedule shape)."""
    program = coarse_programs(schedule, pp, vpp, num_microbatches)[stage]
    columns = []
    for chunk in range(vpp):
        at_start, at_end = activation_deltas(program, {c: float(c == chunk) for c in range(vpp)})
        added = np.cumsum(at_start)
        released = np.concatenate(([0.0], np.cumsum(at_end)[:-1]))
        columns.append(added + released)
    counts = np.column_stack(columns)
    counts.setflags(write=False)
    return counts
