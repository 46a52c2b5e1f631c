"""From a Config to the lowered Schedule of one training step: the one schedule both backends run.

Owns choosing the generator, splitting layers over pipeline chunks and lowering. Pure data: imports no
simpy, numpy or torch.
"""

from __future__ import annotations

from piper_sim.config import Config
from piper_sim.schedule.ir import Schedule
from piper_sim.schedule.lower import lower
from piper_sim.schedule.registry import SCHEDULES
from piper_sim.workload.parallel import stage_layer_split


def build_coarse_schedule(cfg: Config) -> Schedule:
    """The generator's schedule: forward/backward per chunk and microbatch, per pipeline stage."""
    par = cfg.parallel
    generator = SCHEDULES.get(cfg.schedule, "schedule")
    programs = generator(par.pp, par.vpp, par.num_microbatches)
    return Schedule(name=cfg.schedule, mesh=par.mesh, vpp=par.vpp, num_microbatches=par.num_microbatches,
                    stage_programs=programs)


def build_schedule(cfg: Config) -> Schedule:
    """The lowered schedule of one training step for this config."""
    layers = stage_layer_split(cfg.model.num_layers, cfg.parallel.pp * cfg.parallel.vpp)
    migration = bool(cfg.migration.get("enabled")) and cfg.migration.get("policy", "greedy") != "none"
    return lower(build_coarse_schedule(cfg), cfg.model, layers, migration=migration, recompute=cfg.recompute,
                 recomputed=cfg.recompute_layers, zero=cfg.zero)
