"""Expert routing state of a simulated run: routed counts, expert placement per stage, migration.

Owns, for the simulator, which rows each rank's experts get (from the routing model and the
current expert placement), the imbalance tracker, and one Migrator per pipeline stage (a stage's
MoE layers are only routed by its own ranks). Placement changes only between steps, at the
stage's `migrate` task.
"""

from __future__ import annotations

import numpy as np

from piper_sim.migration.controller import MigrationEvent, MigrationSpec, Migrator
from piper_sim.migration.expert_placement import Dispatch, ExpertPlacement, dispatch
from piper_sim.migration.moved_bytes import expert_state_bytes, move_matrix
from piper_sim.routing.metrics import ImbalanceTracker
from piper_sim.routing.models import RoutingModel
from piper_sim.schedule.ir import Schedule
from piper_sim.workload.model import ModelSpec
from piper_sim.workload.task_kinds import Role, TaskKind


class ExpertState:
    def __init__(
        self,
        model: ModelSpec,
        schedule: Schedule,
        routing: RoutingModel,
        migration: MigrationSpec,
        ep: int,
        tokens_per_microbatch: int,
        ep_groups: list[list[int]] | None = None,
    ) -> None:
        """ep_groups[stage]: the first rank of each of the stage's EP groups (what a migration decision waits
        for: every group's routing of the step)."""
        self.routing, self.ep, self.tokens = routing, ep, tokens_per_microbatch
        self.ep_groups = ep_groups or [[] for _ in range(schedule.pp)]
        self.routed_by_stage = [
            sorted(
                {
                    (t.layer, t.microbatch)
                    for t in program
                    if t.kind == TaskKind.ALL_TO_ALL and t.layer >= 0 and t.role != Role.MIGRATE
                }
            )
            for program in schedule.stage_programs
        ]
        self.spec = migration
        state_bytes = expert_state_bytes(model, self.spec.state_bytes_per_param)
        self.migrators: list[Migrator] = []
        self.stage_of_layer: dict[int, int] = {}
        for p in range(schedule.pp):
            chunks = [schedule.stage_layers[schedule.virtual_stage(p, c)] for c in range(schedule.vpp)]
            layers = [layer for chunk in chunks for layer in chunk if model.is_moe_layer(layer)]
            self.stage_of_layer.update({layer: p for layer in layers})
            placement = ExpertPlacement.contiguous(layers, model.num_experts, ep)
            self.migrators.append(Migrator(self.spec, placement, state_bytes))
        self.version = [0] * schedule.pp
        self.tracker = ImbalanceTracker()
        self._cache: dict[tuple, Dispatch] = {}
        self._moves: dict[tuple[int, int], np.ndarray] = {}
        self.events: list[tuple[int, MigrationEvent]] = []

    def dispatch(self, step: int, layer: int, microbatch: int, group_first: int) -> Dispatch:
        """Rows between the EP members of one group for one all-to-all (cached; observed once)."""
        stage = self.stage_of_layer[layer]
        if self.routing.is_uniform:
            key: tuple = ("u", layer, self.version[stage])
        else:
            key = (step, layer, microbatch, group_first)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        routed = self.routing.route(step, layer, microbatch, group_first, self.ep, self.tokens)
        migrator = self.migrators[stage]
        result = self._cache[key] = dispatch(routed.kept, migrator.placement.owners(layer), self.ep)
        if not self.routing.is_uniform:  # uniform routing has nothing to observe: every step is the same
            self.tracker.add(step, layer, group_first, microbatch, result.tokens_per_rank)
            migrator.observe(layer, routed.routed.sum(axis=0))
        return result

    def migrate(self, stage: int, step: int) -> np.ndarray:
        """End of a step on one stage: rebalance its layers; bytes[src member, dst member] to move.

        Every EP group of the stage asks; the decision is made once per (stage, step).
        """
        hit = self._moves.get((stage, step))
        if hit is not None:
            return hit
        self._moves[(stage, step)] = matrix = self._decide(stage, step)
        return matrix

    def _decide(self, stage: int, step: int) -> np.ndarray:
        # the step's loads of every EP group of the stage, whichever group asks first (dispatch observes once)
        for layer, microbatch in self.routed_by_stage[stage]:
            for group_first in self.ep_groups[stage]:
                self.dispatch(step, layer, microbatch, group_first)
        migrator = self.migrators[stage]
        event = migrator.end_of_step(step)
        self.events.append((stage, event))
        if event.migrated:
            self.version[stage] += 1
            return move_matrix(event.moves, self.ep).astype(float)
        return np.zeros((self.ep, self.ep))

    def summary(self) -> dict:
        per_stage = [m.summary() for m in self.migrators]
        return {
            "imbalance": self.tracker.summary() if not self.routing.is_uniform else {"overall": {"lif": 1.0}},
            "migration": {
                "policy": per_stage[0]["policy"] if per_stage else "none",
                "experts_moved": sum(s["experts_moved"] for s in per_stage),
                "bytes_moved_per_group": sum(s["bytes_moved_per_group"] for s in per_stage),
                "per_stage": per_stage,
            },
        }
