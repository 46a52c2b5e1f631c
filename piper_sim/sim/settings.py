"""What a simulated run prices besides its schedule and machine: the model and plan, the collective algorithms, the
routing and migration, the steps, recomputation and ZeRO.

Owns SimSettings, the engine's one object of a run's settings, built from a Config by settings_of (every field
built at load already; nothing is read again). Pure data: no simpy, no numpy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the config's built sections
    from piper_sim.collectives.algorithms import CollectiveChoice
    from piper_sim.config import Config
    from piper_sim.migration.controller import MigrationSpec
    from piper_sim.routing.models import RoutingModel
    from piper_sim.workload.model import ModelSpec
    from piper_sim.workload.parallel import ParallelSpec


@dataclass(frozen=True, kw_only=True)
class SimSettings:
    model: ModelSpec
    parallel: ParallelSpec
    collectives: CollectiveChoice
    routing: RoutingModel
    migration: MigrationSpec
    steps: int = 1
    flash_attention: bool = True
    recompute: str = "none"  # none | selective | full
    recompute_layers: int | None = None  # full: layers of each chunk recomputed (None: all)
    checkpoint_layers: int | None = None  # full: layers per checkpoint (None: the whole chunk)
    recompute_modules: tuple[str, ...] = ()  # selective recomputation's (config.py; () otherwise)
    zero: int = 0
    reshard_after_forward: bool = True  # ZeRO-3 (workload/fsdp.py)


def settings_of(cfg: Config) -> SimSettings:
    """The settings of a config's simulated run."""
    return SimSettings(
        model=cfg.model,
        parallel=cfg.parallel,
        collectives=cfg.collectives,
        routing=cfg.routing,
        migration=cfg.migration,
        steps=cfg.steps,
        flash_attention=cfg.flash_attention,
        recompute=cfg.recompute,
        recompute_layers=cfg.recompute_layers,
        checkpoint_layers=cfg.recompute_checkpoint_layers,
        recompute_modules=cfg.recompute_modules,
        zero=cfg.zero,
        reshard_after_forward=cfg.reshard_after_forward,
    )
