"""Expert migration: placement maps, dispatch under any placement, policies (none, greedy, lpt), bytes moved."""

from piper_sim.migration.controller import (
    LayerDecision,
    MigrationEvent,
    MigrationSpec,
    Migrator,
    migration_from_config,
    migration_step,
)
from piper_sim.migration.expert_placement import Dispatch, ExpertPlacement, dispatch, rank_loads
from piper_sim.migration.moved_bytes import Move, expert_state_bytes, move_matrix, placement_moves, total_bytes
from piper_sim.migration.policies import POLICIES, Rebalance, greedy_swap, lpt_rebalance, rebalance

__all__ = [
    "POLICIES",
    "Dispatch",
    "ExpertPlacement",
    "LayerDecision",
    "MigrationEvent",
    "MigrationSpec",
    "Migrator",
    "Move",
    "Rebalance",
    "dispatch",
    "expert_state_bytes",
    "greedy_swap",
    "lpt_rebalance",
    "migration_from_config",
    "migration_step",
    "move_matrix",
    "placement_moves",
    "rank_loads",
    "rebalance",
    "total_bytes",
]
