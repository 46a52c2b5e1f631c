"""From a Config to the lowered Schedule of one training step: the one schedule both backends run.

Owns choosing the generator, splitting layers over pipeline chunks and lowering. Pure data: imports no
simpy, numpy or torch.
"""

from __future__ import annotations

from piper_sim.config import Config
from piper_sim.schedule.generator_registry import SCHEDULES, schedule_layout
from piper_sim.schedule.ir import Schedule, VirtualStages
from piper_sim.schedule.lower import lower
from piper_sim.workload.parallel import stage_layer_split


def split_layers(num_layers: int, stages: VirtualStages) -> tuple[tuple[int, ...], ...]:
    """Layers per virtual stage: the model split over one pipeline's virtual stages, repeated for each
    pipeline of the layout (a bidirectional layout's second pipeline holds a copy of the same layers)."""
    return stage_layer_split(num_layers, stages.pipeline_length) * stages.num_pipelines


def build_coarse_schedule(cfg: Config) -> Schedule:
    """The generator's schedule: forward/backward per chunk and microbatch, per pipeline stage."""
    par = cfg.parallel
    generator = SCHEDULES.get(cfg.schedule, "schedule")
    programs = generator(par.pp, par.vpp, par.num_microbatches)
    return Schedule(
        name=cfg.schedule,
        mesh=par.mesh,
        vpp=par.vpp,
        num_microbatches=par.num_microbatches,
        stage_programs=programs,
        layout=schedule_layout(cfg.schedule),
    )


def build_schedule(cfg: Config) -> Schedule:
    """The lowered schedule of one training step for this config."""
    coarse = build_coarse_schedule(cfg)
    layers = split_layers(cfg.model.num_layers, coarse.stages)
    return lower(
        coarse,
        cfg.model,
        layers,
        migration=cfg.migration.active,
        recompute=cfg.recompute,
        recomputed=cfg.recompute_layers,
        zero=cfg.zero,
        sp=cfg.parallel.sp,
        reshard_after_forward=cfg.reshard_after_forward,
        recompute_modules=cfg.recompute_modules,
        gradient_reduce=cfg.gradient_reduce,
        overlap_all_to_all=cfg.collectives.overlap_all_to_all,
    )
