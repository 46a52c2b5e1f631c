"""What each collective task of a simulated run sends: its phases, library calls and host-side cost.

Owns the phases of a collective task (an all-to-all's from its routed matrix, an all-reduce's or a ZeRO
shard's from the bytes of the gradients or parameters it moves, a DeepSpeed bucket's from its share of them
(workload/deepspeed_zero.py), migration's point-to-point sends), the memo of
collectives that repeat (the same phase objects again, so the collective runner finds its recorded runs by
identity; a skewed all-to-all's for its group's members), and the number of library calls a collective
makes with the host-side cost they carry. The engine (engine.py) asks for them when a group's collective starts.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from piper_sim.collectives.algorithms import ALL_REDUCE, ALL_TO_ALL, Fanout, bind_fanout, matrix_phase
from piper_sim.collectives.params import library_units
from piper_sim.collectives.sharded import ALL_GATHER, REDUCE_SCATTER
from piper_sim.network import CollectiveRunner
from piper_sim.routing.models import RoutingModel
from piper_sim.schedule.ir import Schedule, Task
from piper_sim.schedule.lower_fsdp import shard_axes
from piper_sim.sim.experts import ExpertState
from piper_sim.sim.stage_plans import StagePlan
from piper_sim.topology.graph import Topology
from piper_sim.workload.cost import TaskCoster
from piper_sim.workload.deepspeed_zero import reduce_buckets
from piper_sim.workload.model import ModelSpec
from piper_sim.workload.task_kinds import Role, TaskKind


class CollectiveTasks:
    def __init__(
        self,
        *,
        schedule: Schedule,
        model: ModelSpec,
        topology: Topology,
        placement: list[str],
        plans: list[StagePlan],
        experts: ExpertState,
        routing: RoutingModel,
        coster: TaskCoster,
        runner: CollectiveRunner,
        all_to_all: str,
        all_reduce: str,
        activation_bytes: float,
        ring_bytes: float = 0.0,
    ) -> None:
        self.mesh, self.model, self.topo, self.placement = schedule.mesh, model, topology, placement
        self.plans, self.experts, self.routing, self.coster, self.runner = plans, experts, routing, coster, runner
        self.a2a = ALL_TO_ALL.get(all_to_all, "collectives.all_to_all")
        # by role: an algorithm that deduplicates tokens (deepep) knows the model's top-k and a combine's matrix
        self._a2a_role = {
            role: bind_fanout(
                self.a2a, Fanout(model.top_k, model.num_experts, role == Role.COMBINE, routing.adjacent_experts)
            )
            for role in (Role.DISPATCH, Role.COMBINE)
        }
        self.all_reduce = ALL_REDUCE.get(all_reduce, "collectives.all_reduce")
        self.a2a_name, self.ar_name = all_to_all, all_reduce
        self.sharded = (
            {
                TaskKind.REDUCE_SCATTER: REDUCE_SCATTER.get(all_reduce, "collectives.all_reduce"),
                TaskKind.ALL_GATHER: ALL_GATHER.get(all_reduce, "collectives.all_reduce"),
            }
            if any(
                t.kind in (TaskKind.REDUCE_SCATTER, TaskKind.ALL_GATHER)
                for prog in schedule.stage_programs
                for t in prog
            )
            else {}
        )
        self.row_bytes = model.d_model * model.dtype_bytes
        self.activation_bytes = activation_bytes  # a micro-batch's activations, whole
        self.ring_bytes = ring_bytes  # context parallelism: a micro-batch's K/V of one layer, all its CP ranks'
        self._num_calls: dict[tuple, int] = {}  # (kind, migrate?, group) -> library calls per collective
        self._phase_cache: dict[tuple, tuple] = {}  # repeating collectives' phases (see phases)
        # skewed all-to-alls' phases by (step, layer, microbatch, role, group), from the first member's ask to the last
        self._skewed: dict[tuple, tuple] = {}
        self._skewed_uses: dict[tuple, int] = {}
        self._a2a_uses = Counter(
            (stage, t.layer, t.microbatch, t.role)  # a stage's, for each of its groups
            for stage, program in enumerate(schedule.stage_programs)
            for t in program
            if t.kind == TaskKind.ALL_TO_ALL
        )

    def calls(self, task: Task, group: tuple[int, ...]) -> int:
        """Library calls a collective makes: one per phase (split-size exchange included), as the torch
        backend does (one gloo call per phase); moving experts is one call; an all-to-all in a group of
        one moves nothing and makes none."""
        key = (task.kind, task.role == Role.MIGRATE, group)
        hit = self._num_calls.get(key)
        if hit is None:
            gpus = [self.placement[r] for r in group]
            if task.kind == TaskKind.ALL_TO_ALL and len(group) == 1:
                hit = 0
            elif task.role == Role.MIGRATE:
                hit = 1
            elif task.kind == TaskKind.ALL_TO_ALL:
                hit = len(self.a2a(np.ones((len(group), len(group))), gpus, self.topo))
            else:
                hit = len(self.all_reduce(1.0, gpus, self.topo))
            self._num_calls[key] = hit
        return hit

    def unit_share(self, task: Task) -> float:
        """The share of its rank's compute units an issued collective's kernels hold while it runs: its library's
        compute_units on the machine over the device's (sim/busy_units.py); 0 where either is not given."""
        device = self.coster.profile.compute_units
        if not device or task.role == Role.MIGRATE or task.role == Role.CP:  # the CP ring: the ring model's own
            return 0.0
        name = self.a2a_name if task.kind == TaskKind.ALL_TO_ALL else self.ar_name
        return library_units(self.topo, name) / device

    def host_cost_s(self, task: Task, group: tuple[int, ...]) -> float:
        """Host-side cost of a collective: the profile's per-call cost for the group size, once per call, and
        an all-to-all's work around its calls (TaskCoster.exchange_s; also in a group of one)."""
        calls = self.calls(task, group) * self.coster.profile.collective_call_s(task.kind, len(group))
        return calls + (self.coster.exchange_s(task) if task.kind == TaskKind.ALL_TO_ALL else 0.0)

    def phases(self, rank: int, step: int, task: Task, group: tuple[int, ...]):
        """(phases, bytes each member sends, algorithm name) of a collective; the same objects again for a
        collective that repeats (an all-reduce, an all-to-all under uniform routing until the experts move),
        so the runner's recorded runs are found by identity."""
        if task.role == Role.MIGRATE:  # expert state moves between members: direct point-to-point sends
            matrix = self.experts.migrate(self.mesh.stage_of(rank), step)
            return [matrix_phase(matrix, "migrate")], matrix.sum(axis=1) - np.diag(matrix), "direct"
        if task.kind == TaskKind.ALL_TO_ALL and not self.routing.is_uniform:
            # a matrix of its own: the same objects for every member, let go after the last
            key = (step, task.layer, task.microbatch, task.role, group)
            hit = self._skewed.get(key)
            if hit is None:
                hit = self._skewed[key] = self._a2a_phases(step, task.layer, task.microbatch, task.role, group)
            self._skewed_uses[key] = uses = self._skewed_uses.get(key, 0) + 1
            if uses == self._a2a_uses[(self.mesh.stage_of(group[0]), task.layer, task.microbatch, task.role)]:
                del self._skewed[key], self._skewed_uses[key]
            return hit
        version = self.experts.version[self.mesh.stage_of(rank)] if task.kind == TaskKind.ALL_TO_ALL else 0
        cache_key = (group, task.kind, task.role, task.layer, task.chunk, version)
        hit = self._phase_cache.get(cache_key)
        if hit is None:
            hit = self._phase_cache[cache_key] = self._build(step, task, group)
        return hit

    def _a2a_phases(self, step: int, layer: int, microbatch: int, role: Role, group: tuple[int, ...]):
        d = self.experts.dispatch(step, layer, microbatch, group[0])
        matrix = d.bytes_matrix(self.row_bytes, role).astype(float)
        phases = self._a2a_role[role](matrix, [self.placement[r] for r in group], self.topo)
        return phases, matrix.sum(axis=1) - np.diag(matrix), self.a2a_name

    def _build(self, step: int, task: Task, group: tuple[int, ...]):
        gpus = [self.placement[r] for r in group]
        if task.kind == TaskKind.ALL_TO_ALL:
            return self._a2a_phases(step, task.layer, task.microbatch, task.role, group)
        plan = self.plans[self.mesh.stage_of(group[0])]
        if task.role == Role.TP:  # a micro-batch's activations (or their gradients), whole
            size = self.activation_bytes
        elif task.role == Role.CP:  # a layer's K/V (or their gradients) around the CP ring: point-to-point steps
            ring = {TaskKind.ALL_GATHER: ALL_GATHER, TaskKind.REDUCE_SCATTER: REDUCE_SCATTER}[task.kind].get("ring")
            return ring(self.ring_bytes, gpus, self.topo), np.full(len(group), self.ring_bytes), "ring"
        else:  # gradients or parameters of one class: the stage's, one chunk's (ZeRO-2's buckets) or one unit's
            kind = task.role.partition("_")[2]
            held = {"dense": plan.params_dense, "expert": plan.params_expert, "replicated": plan.params_replicated}
            held["mirror"] = sum(held.values())  # DualPipe: every gradient the rank holds, with its counterpart's
            if task.nonblocking:  # ZeRO-3: one unit's (workload/fsdp.py); HSDP's all-reduce its shard's
                size = self.model.dtype_bytes * plan.unit_params[(task.chunk, task.layer)][kind]
                if task.kind == TaskKind.ALL_REDUCE:
                    shard, _ = shard_axes(self.mesh, kind)
                    size /= len(self.mesh.group(group[0], shard)) if shard else 1
            else:  # the stage's or one chunk's (ZeRO-2); DeepSpeed: one call of its reduce buckets (task.layer)
                params = plan.chunk_params[task.chunk] if task.chunk >= 0 else held
                elements = reduce_buckets(params)[kind][task.layer] if task.layer >= 0 else params[kind]
                size = self.model.dtype_bytes * elements
        algorithm = self.sharded[task.kind] if task.kind in self.sharded else self.all_reduce
        return algorithm(size, gpus, self.topo), np.full(len(group), size), self.ar_name
