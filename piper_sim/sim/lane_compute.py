"""What a lane's compute tasks cost, per member: their experts' rows are their own.

Owns `LaneCompute`, the compute half of piper_sim.sim.engine.Simulation (a mixin: it uses the simulation's cost model,
stage plans and expert state): a compute task's seconds and FLOPs for the lane's members (one price for all, or one
per member for expert ops), the rows each member's experts get in a MoE layer, and the activation memory those rows
add beyond a balanced load. Must not import torch.
"""

from __future__ import annotations

import numpy as np

from piper_sim.routing.models import RoutingModel
from piper_sim.schedule.ir import Task
from piper_sim.sim.experts import ExpertState
from piper_sim.sim.stage_plans import StagePlan
from piper_sim.workload.cost import TaskCoster
from piper_sim.workload.memory import routed_row_bytes
from piper_sim.workload.mesh import Mesh
from piper_sim.workload.model import ModelSpec
from piper_sim.workload.ops import parse_op
from piper_sim.workload.parallel import ParallelSpec
from piper_sim.workload.task_kinds import TaskKind


class LaneCompute:
    """Compute prices of a lane's members (mixed into Simulation, whose state it reads)."""

    # what it reads of Simulation (set there)
    model: ModelSpec
    parallel: ParallelSpec
    mesh: Mesh
    routing: RoutingModel
    coster: TaskCoster
    plans: list[StagePlan]
    experts: ExpertState
    routed_tokens: int
    recompute_modules: tuple[str, ...]
    _rows: dict[tuple, tuple]
    _lane_ep: dict[int, list]

    def _member_rows(
        self, lane: tuple[int, ...], step: int, layer: int, microbatch: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Rows each lane member's experts get for one MoE layer and microbatch, as Dispatch holds them:
        (rows[member, j] of its j-th expert, experts it holds). Under uniform routing the same for every step and
        microbatch until the placement changes, so taken once per placement."""
        key = None
        if self.routing.is_uniform:
            key = (lane[0], layer, self.experts.version[self.experts.stage_of_layer[layer]])
            hit = self._rows.get(key)
            if hit is not None:
                return hit
        groups = self._lane_ep.get(lane[0])
        if groups is None:  # the lane's members by EP group: (group's first rank, members' positions, EP indices)
            by_group: dict[int, list[tuple[int, int]]] = {}
            for m, rank in enumerate(lane):
                by_group.setdefault(self.mesh.group(rank, "ep")[0], []).append((m, self.mesh.coords(rank)["ep"]))
            groups = self._lane_ep[lane[0]] = [
                (first, *map(np.array, zip(*pairs, strict=True))) for first, pairs in by_group.items()
            ]
        if len(groups) == 1:
            first, _, ep_index = groups[0]
            d = self.experts.dispatch(step, layer, microbatch, first)
            rows = (d.local_rows[ep_index], d.num_local[ep_index])
        else:
            found = [
                (members, ep_index, self.experts.dispatch(step, layer, microbatch, first))
                for first, members, ep_index in groups
            ]
            matrix = np.zeros((len(lane), max(d.local_rows.shape[1] for *_, d in found)), dtype=np.int64)
            num_local = np.zeros(len(lane), dtype=np.int64)
            for members, ep_index, d in found:
                matrix[members, : d.local_rows.shape[1]] = d.local_rows[ep_index]
                num_local[members] = d.num_local[ep_index]
            rows = (matrix, num_local)
        if key is not None:
            self._rows[key] = rows
        return rows

    def _compute_cost(
        self, lane: tuple[int, ...], stage: int, step: int, i: int, task: Task
    ) -> tuple[float | np.ndarray, float | np.ndarray]:
        """(seconds, flops) of a compute task: one value for all members, or one per member (expert ops)."""
        plan = self.plans[stage]
        if task.kind == TaskKind.OPTIMIZER:
            return (
                self.coster.optimizer_time_s(plan.optimizer_params, plan.param_tensors)
                + self.coster.fp8_weight_cast_s(plan.fp8_params)
            ), 0.0
        if not plan.expert_layers[i]:
            return plan.fixed_cost[i]
        seconds, flops = np.zeros(len(lane)), np.zeros(len(lane))
        s: float | np.ndarray  # an op's price: one for all members, or one per member
        f: float | np.ndarray
        for op in task.ops:
            parsed = parse_op(op)
            if parsed.name == "moe_act":  # the activation over the rows each member's experts got
                seconds += self._rows_priced(
                    task.kind, op, self._member_rows(lane, step, parsed.layer, task.microbatch)[0].sum(axis=1)
                )
                continue
            if not parsed.is_experts:
                s, f = self.coster.cost(task.kind, (op,))
                seconds += s
                flops += f
                continue
            rows, num_local = self._member_rows(lane, step, parsed.layer, task.microbatch)
            if (rows == rows[0]).all() and (num_local == num_local[0]).all():  # one price for all (memoized)
                s, f = self.coster.cost(task.kind, (op,), tuple(rows[0, : num_local[0]].tolist()))
            else:
                s, f = self.coster.experts_cost(task.kind, op, rows, num_local)
            seconds += s
            flops += f
        return seconds, flops

    def _rows_priced(self, kind: TaskKind, op: str, rows: np.ndarray) -> np.ndarray:
        """Seconds per member of an op whose work is over its rows alone (moe_act), one price per distinct count."""
        seconds = np.zeros(len(rows))
        for count in np.unique(rows):
            seconds[rows == count] = self.coster.cost(kind, (op,), (int(count),))[0]
        return seconds

    def _routed_extra_bytes(self, lane: tuple[int, ...], step: int, task: Task) -> np.ndarray:
        """Activations of the routed rows each member's experts got, beyond the balanced tokens x top_k that
        the stage plan counts (negative when it got fewer): skewed routing skews memory too."""
        extra = np.zeros(len(lane))
        for op in task.ops:
            parsed = parse_op(op)
            if parsed.is_experts:
                rows = self._member_rows(lane, step, parsed.layer, task.microbatch)[0].sum(axis=1)
                extra += (rows - self.routed_tokens * self.model.top_k) * routed_row_bytes(
                    self.model, self.parallel.etp, self.recompute_modules
                )
        return extra
