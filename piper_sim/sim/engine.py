"""The SimPy backend: one process per rank walks its program under the execution contract.

Owns the simulated run: compute durations from the cost model, collectives and p2p transfers
on the flow network, memory tracking, and the per-task records that become the RunTrace.
Contract (schedule/ir.py): one program counter per rank; compute and collective tasks block it;
send/recv are issued asynchronously and end when their transfer ends; a collective starts when
all members have reached it; a task waits for its deps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import simpy

from piper_sim.collectives.algorithms import ALL_REDUCE, ALL_TO_ALL, Phase
from piper_sim.routing.models import RoutingModel
from piper_sim.schedule.ir import Schedule, Task
from piper_sim.sim.collective import CollectiveRunner
from piper_sim.sim.network import FlowNetwork
from piper_sim.sim.plan import StagePlan, build_stage_plans
from piper_sim.topology.graph import Topology
from piper_sim.workload.cost import TaskCoster
from piper_sim.workload.model import ModelSpec
from piper_sim.workload.parallel import ParallelSpec


@dataclass(kw_only=True)
class SimRecords:
    """Per stage arrays indexed [step, rank within stage, task index]."""

    start_s: list[np.ndarray]
    end_s: list[np.ndarray]
    flops: list[np.ndarray]
    bytes: list[np.ndarray]
    peak_memory_bytes: np.ndarray  # per rank
    link_bytes: np.ndarray
    num_flows: int
    num_solves: int


class Simulation:
    def __init__(self, *, schedule: Schedule, model: ModelSpec, parallel: ParallelSpec, topology: Topology,
                 placement: list[str], coster: TaskCoster, routing: RoutingModel, all_to_all: str,
                 all_reduce: str, steps: int = 1, flash_attention: bool = True) -> None:
        self.schedule, self.model, self.parallel, self.topo = schedule, model, parallel, topology
        self.placement, self.coster, self.routing, self.steps = placement, coster, routing, steps
        self.a2a = ALL_TO_ALL.get(all_to_all, "collectives.all_to_all")
        self.a2a_name, self.ar_name = all_to_all, all_reduce
        self.all_reduce = ALL_REDUCE.get(all_reduce, "collectives.all_reduce")
        self.mesh = schedule.mesh
        self.env = simpy.Environment()
        self.network = FlowNetwork(self.env, topology.capacity_bytes_per_s)
        self.runner = CollectiveRunner(self.env, self.network, topology)
        self.plans: list[StagePlan] = build_stage_plans(schedule, model, parallel, flash_attention)
        for plan in self.plans:
            plan.fixed_cost = [coster.cost(t.kind, t.ops) if t.is_compute and t.kind != "optimizer" and not e
                               else (0.0, 0.0) for t, e in zip(plan.program, plan.expert_layers, strict=True)]
        self.tokens = parallel.micro_batch_size * model.seq_len
        self.experts_per_rank = model.num_experts // parallel.ep
        self.row_bytes = model.d_model * model.dtype_bytes
        self._arrivals: dict[tuple, list] = {}
        self._p2p: dict[tuple, tuple] = {}
        self._async_done: dict[tuple[int, int, int], simpy.Event] = {}
        self._counts: dict[tuple, np.ndarray] = {}
        self._group_gpus: dict[tuple[int, ...], tuple[str, ...]] = {}
        per_stage = self.mesh.num_ranks // self.mesh.pp
        shape = lambda p: (steps, per_stage, len(schedule.stage_programs[p]))  # noqa: E731
        self.records = SimRecords(
            start_s=[np.full(shape(p), np.nan) for p in range(self.mesh.pp)],
            end_s=[np.full(shape(p), np.nan) for p in range(self.mesh.pp)],
            flops=[np.zeros(shape(p)) for p in range(self.mesh.pp)],
            bytes=[np.zeros(shape(p)) for p in range(self.mesh.pp)],
            peak_memory_bytes=np.zeros(self.mesh.num_ranks), link_bytes=self.network.link_bytes,
            num_flows=0, num_solves=0)

    # ---- running -------------------------------------------------------------------------------
    def run(self) -> SimRecords:
        for rank in range(self.mesh.num_ranks):
            self.env.process(self._rank(rank))
        self.env.run()
        unfinished = [p for p, arr in enumerate(self.records.end_s) if np.isnan(arr).any()]
        if unfinished:
            raise RuntimeError(f"simulation stalled: stage(s) {unfinished} did not finish (schedule deadlock)")
        self.records.num_flows = self.network.num_flows
        self.records.num_solves = self.network.num_solves
        return self.records

    def _rank(self, rank: int):
        stage = self.mesh.stage_of(rank)
        plan = self.plans[stage]
        local = rank - stage * (self.mesh.num_ranks // self.mesh.pp)
        rec = self.records
        start, end, flops, nbytes = rec.start_s[stage], rec.end_s[stage], rec.flops[stage], rec.bytes[stage]
        memory = plan.static_bytes
        peak = memory
        for step in range(self.steps):
            for i, task in enumerate(plan.program):
                for d in plan.async_deps[i]:
                    ev = self._async_done[(rank, step, d)]
                    if not ev.triggered:
                        yield ev
                memory += plan.mem_at_start[i]
                peak = max(peak, memory)
                stream = plan.streams[i]
                if stream == 0:  # compute
                    seconds, f = self._compute_cost(rank, stage, step, i, task)
                    start[step, local, i] = self.env.now
                    yield self.env.timeout(seconds)
                    end[step, local, i] = self.env.now
                    flops[step, local, i] = f
                elif stream == 2:  # collective
                    start[step, local, i] = self.env.now
                    ev, sent = self._arrive(rank, step, i, task)
                    nbytes[step, local, i] = sent
                    yield ev
                    end[step, local, i] = self.env.now
                else:
                    self._post_p2p(rank, stage, local, step, i, task)
                memory += plan.mem_at_end[i]
        rec.peak_memory_bytes[rank] = peak

    # ---- compute -------------------------------------------------------------------------------
    def _compute_cost(self, rank: int, stage: int, step: int, i: int, task: Task) -> tuple[float, float]:
        plan = self.plans[stage]
        if task.kind == "optimizer":
            return self.coster.optimizer_time_s(plan.params_dense + plan.params_expert), 0.0
        if not plan.expert_layers[i]:
            return plan.fixed_cost[i]
        ep_index = self.mesh.coords(rank)["ep"]
        lo = ep_index * self.experts_per_rank
        seconds = flops = 0.0
        for op in task.ops:
            layer = int(op.rpartition(":")[2]) if op.startswith("experts:") else -1
            rows: tuple[int, ...] = ()
            if layer >= 0:
                counts = self._routing_counts(rank, step, layer, task.microbatch)
                rows = tuple(counts[:, lo:lo + self.experts_per_rank].sum(axis=0).tolist())
            s, f = self.coster.cost(task.kind, (op,), rows)
            seconds += s
            flops += f
        return seconds, flops

    def _routing_counts(self, rank: int, step: int, layer: int, microbatch: int) -> np.ndarray:
        group = self.mesh.group(rank, "ep")
        key = ("u",) if self.routing.is_uniform else (step, layer, microbatch, group[0])
        counts = self._counts.get(key)
        if counts is None:
            counts = self._counts[key] = self.routing.counts(step, layer, microbatch, group[0], len(group),
                                                              self.tokens)
        return counts

    # ---- collectives ---------------------------------------------------------------------------
    def _arrive(self, rank: int, step: int, i: int, task: Task) -> tuple[simpy.Event, float]:
        """Join collective i of this step; returns its end event and the bytes this member sends."""
        group = self.mesh.group(rank, task.group_axis)
        key = (step, group[0], i)
        waiting = self._arrivals.get(key)
        if waiting is None:
            phases, sent, algo = self._phases(rank, step, task, group)
            waiting = self._arrivals[key] = [0, self.env.event(), phases, sent, algo]
        waiting[0] += 1
        if waiting[0] == len(group):
            del self._arrivals[key]
            gpus = self._group_gpus.get(group)
            if gpus is None:
                gpus = self._group_gpus[group] = tuple(self.placement[r] for r in group)
            done = self.runner.run(waiting[2], gpus, (gpus, waiting[4], task.role))
            done.callbacks.append(lambda _ev, ev=waiting[1]: ev.succeed())
        member = group.index(rank) if len(group) < 8 else self._member_index(rank, group)
        return waiting[1], float(waiting[3][member])

    def _member_index(self, rank: int, group: tuple[int, ...]) -> int:
        # groups are arithmetic progressions of ranks (mesh layout)
        return (rank - group[0]) // (group[1] - group[0])

    def _phases(self, rank: int, step: int, task: Task, group: tuple[int, ...]):
        gpus = [self.placement[r] for r in group]
        if task.kind == "all_to_all":
            counts = self._routing_counts(rank, step, task.layer, task.microbatch)
            per_dst = counts.reshape(len(group), len(group), self.experts_per_rank).sum(axis=2)
            matrix = per_dst * self.row_bytes
            if task.role == "combine":
                matrix = matrix.T
            return self.a2a(matrix, gpus, self.topo), matrix.sum(axis=1) - np.diag(matrix), self.a2a_name
        plan = self.plans[self.mesh.stage_of(rank)]
        params = plan.params_dense if task.role == "grad_dense" else plan.params_expert
        size = params * self.model.dtype_bytes
        return self.all_reduce(size, gpus, self.topo), np.full(len(group), size), self.ar_name

    # ---- p2p -----------------------------------------------------------------------------------
    def _post_p2p(self, rank: int, stage: int, local: int, step: int, i: int, task: Task) -> None:
        done = self._async_done[(rank, step, i)] = self.env.event()
        peer = self.mesh.peer(rank, task.peer_stage)
        src, dst = (rank, peer) if task.kind == "send" else (peer, rank)
        key = (step, src, dst, task.tag)
        mine = (stage, local, i, done)
        other = self._p2p.pop(key, None)
        if other is None:
            self._p2p[key] = mine
            return
        size = float(self.tokens * self.row_bytes)
        start = self.env.now
        gpus = (self.placement[src], self.placement[dst])
        phase_done = self.runner.run([_p2p_phase(size)], gpus, (gpus, "p2p", ""))

        def finish(_ev, ends=(mine, other)) -> None:
            for st, lo, idx, ev in ends:
                self.records.start_s[st][step, lo, idx] = start
                self.records.end_s[st][step, lo, idx] = self.env.now
                self.records.bytes[st][step, lo, idx] = size
                ev.succeed()

        phase_done.callbacks.append(finish)


def _p2p_phase(size: float) -> Phase:
    return Phase(src=np.array([0]), dst=np.array([1]), sizes=np.array([size]), name="p2p")

