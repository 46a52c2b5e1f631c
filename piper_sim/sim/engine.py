"""The SimPy backend: processes walk the stage programs under the execution contract.

Owns the simulated run: compute durations from the cost model, collectives and p2p transfers
on the flow network, memory tracking, and the per-task records that become the RunTrace.
Contract (schedule/ir.py): one program counter per rank; compute and collective tasks block it;
send/recv are issued asynchronously and end when their transfer ends; a collective starts when
all members have reached it; a task waits for its deps.

Lanes: one SimPy process drives a lane, a set of ranks of one pipeline stage that are known to
behave identically (same program, same compute costs under uniform routing). A lane's p2p
transfers still put every member's flow into the network, and its collectives count every member,
so contention is modelled as with one process per rank. Members stay identical as long as their
transfers end at the same time; the engine checks that on every transfer and raises Asymmetry
when it does not, and the caller then reruns with one lane per rank (see simulate.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import simpy

from piper_sim.collectives.algorithms import ALL_REDUCE, ALL_TO_ALL, Phase, matrix_phase
from piper_sim.collectives.sharded import ALL_GATHER, REDUCE_SCATTER
from piper_sim.routing.models import RoutingModel
from piper_sim.schedule.ir import Schedule, Task
from piper_sim.sim.collective import CollectiveRunner
from piper_sim.sim.experts import ExpertState
from piper_sim.sim.host import host_model
from piper_sim.sim.network import FlowNetwork
from piper_sim.sim.plan import StagePlan, build_stage_plans
from piper_sim.topology.graph import Topology
from piper_sim.workload.cost import TaskCoster
from piper_sim.workload.memory import routed_row_bytes
from piper_sim.workload.model import ModelSpec
from piper_sim.workload.ops import parse_op
from piper_sim.workload.parallel import ParallelSpec
from piper_sim.workload.profile import HostProfile


class Asymmetry(Exception):
    """Members of a lane would diverge: the run must use one lane per rank."""


@dataclass(kw_only=True)
class SimRecords:
    """Per stage arrays indexed [step, rank within stage, task index]."""

    start_s: list[np.ndarray]
    end_s: list[np.ndarray]
    flops: list[np.ndarray]
    bytes: list[np.ndarray]
    cpu_s: list[np.ndarray]  # the work priced for a blocking task on one unshared core (NaN: send/recv)
    peak_memory_bytes: np.ndarray  # per rank
    first_step_peak_memory_bytes: np.ndarray  # per rank, over step 0 only (what a run that counts it on step 0 sees)
    link_bytes: np.ndarray
    num_flows: int
    num_solves: int
    num_lanes: int


class Simulation:
    def __init__(self, *, schedule: Schedule, model: ModelSpec, parallel: ParallelSpec, topology: Topology,
                 placement: list[str], coster: TaskCoster, routing: RoutingModel, all_to_all: str,
                 all_reduce: str, steps: int = 1, flash_attention: bool = True, collapse: bool = False,
                 migration: dict | None = None, host_profile: HostProfile | None = None,
                 recompute: str = "none", recompute_layers: int | None = None, zero: int = 0) -> None:
        self.schedule, self.model, self.parallel, self.topo = schedule, model, parallel, topology
        self.placement, self.coster, self.routing, self.steps = placement, coster, routing, steps
        self.a2a = ALL_TO_ALL.get(all_to_all, "collectives.all_to_all")
        self.a2a_name, self.ar_name = all_to_all, all_reduce
        self.all_reduce = ALL_REDUCE.get(all_reduce, "collectives.all_reduce")
        self.mesh = schedule.mesh
        self.per_stage = self.mesh.num_ranks // self.mesh.pp
        self.env = simpy.Environment()
        self.network = FlowNetwork(self.env, topology.capacity_bytes_per_s)
        self.runner = CollectiveRunner(self.env, self.network, topology)
        self.plans: list[StagePlan] = build_stage_plans(schedule, model, parallel, flash_attention,
                                                        recompute=recompute, recompute_layers=recompute_layers,
                                                        zero=zero)
        self.sharded = {"reduce_scatter": REDUCE_SCATTER.get(all_reduce, "collectives.all_reduce"),
                        "all_gather": ALL_GATHER.get(all_reduce, "collectives.all_reduce")} if zero else {}
        for plan in self.plans:
            plan.fixed_cost = [coster.cost(t.kind, t.ops) if t.is_compute and t.kind != "optimizer" and not e
                               else (0.0, 0.0) for t, e in zip(plan.program, plan.expert_layers, strict=True)]
        self.tokens = parallel.micro_batch_size * model.seq_len
        self.row_bytes = model.d_model * model.dtype_bytes
        self.experts = ExpertState(model, schedule, routing, migration, parallel.ep, self.tokens)
        self.lanes = self._lanes(collapse)
        self._lane_of = {r: li for li, lane in enumerate(self.lanes) for r in lane}
        self.host = host_model(self.env, topology, host_profile, [len(lane) for lane in self.lanes])
        self._arrivals: dict[tuple, list] = {}
        self._p2p: dict[tuple, tuple] = {}
        self._async_done: dict[tuple[int, int, int], simpy.Event] = {}
        self._group_gpus: dict[tuple[int, ...], tuple[str, ...]] = {}
        self._num_calls: dict[tuple, int] = {}  # (kind, migrate?, group) -> library calls per collective
        self._lane_groups: dict[tuple[int, str], list] = {}
        self._p2p_gpus: dict[tuple[int, int], tuple[str, ...]] = {}
        shape = lambda p: (steps, self.per_stage, len(schedule.stage_programs[p]))  # noqa: E731
        self.records = SimRecords(
            start_s=[np.full(shape(p), np.nan) for p in range(self.mesh.pp)],
            end_s=[np.full(shape(p), np.nan) for p in range(self.mesh.pp)],
            flops=[np.zeros(shape(p)) for p in range(self.mesh.pp)],
            bytes=[np.zeros(shape(p)) for p in range(self.mesh.pp)],
            cpu_s=[np.full(shape(p), np.nan) for p in range(self.mesh.pp)],
            peak_memory_bytes=np.zeros(self.mesh.num_ranks),
            first_step_peak_memory_bytes=np.zeros(self.mesh.num_ranks), link_bytes=self.network.link_bytes,
            num_flows=0, num_solves=0, num_lanes=len(self.lanes))

    # ---- lanes ---------------------------------------------------------------------------------
    def _lanes(self, collapse: bool) -> list[tuple[int, ...]]:
        """Whole pipeline stages when members are interchangeable, else one lane per rank."""
        singles = [(r,) for r in range(self.mesh.num_ranks)]
        if not collapse or not self.routing.is_uniform or self.mesh.tp > 1:
            return singles
        moe = self.model.moe_layer_indices
        if moe:
            rows = self.experts.dispatch(0, moe[0], 0, 0).expert_rows
            if any(tuple(r) != tuple(rows[0]) for r in rows):  # uneven expert rows: compute differs
                return singles
        return [tuple(self.mesh.stage_ranks(p)) for p in range(self.mesh.pp)]

    # ---- running -------------------------------------------------------------------------------
    def run(self) -> SimRecords:
        for lane in self.lanes:
            self.env.process(self._lane(lane))
        self.env.run()
        unfinished = [p for p, arr in enumerate(self.records.end_s) if np.isnan(arr).any()]
        if unfinished:
            raise RuntimeError(f"simulation stalled: stage(s) {unfinished} did not finish (schedule deadlock)")
        self.records.num_flows = self.network.num_flows
        self.records.num_solves = self.network.num_solves
        return self.records

    def _lane(self, lane: tuple[int, ...]):
        rank = lane[0]
        stage = self.mesh.stage_of(rank)
        plan = self.plans[stage]
        lane_id = self._lane_of[rank]
        local = np.array(lane) - stage * self.per_stage
        rec = self.records
        start, end, flops, nbytes = rec.start_s[stage], rec.end_s[stage], rec.flops[stage], rec.bytes[stage]
        cpu = rec.cpu_s[stage]
        memory = peak = plan.static_bytes
        routed_extra: dict[tuple[int, int], float] = {}  # (chunk, microbatch) -> bytes beyond a balanced load
        for step in range(self.steps):
            for i, task in enumerate(plan.program):
                for d in plan.async_deps[i]:
                    ev = self._async_done[(lane_id, step, d)]
                    if not ev.triggered:  # blocked on a transfer: woken when it ends
                        yield ev
                        if self.host.charges_wakeups:
                            yield self.env.timeout(self.host.wake_wait_s(1))
                memory += plan.mem_at_start[i]
                if task.kind == "forward_expert":
                    extra = self._routed_extra_bytes(rank, step, task)
                    key = (task.chunk, task.microbatch)
                    routed_extra[key] = routed_extra.get(key, 0.0) + extra
                    memory += extra
                peak = max(peak, memory)
                stream = plan.streams[i]
                if stream == 0:  # compute
                    seconds, f = self._compute_cost(rank, stage, step, i, task)
                    start[step, local, i] = self.env.now
                    cpu[step, local, i] = seconds
                    self.host.begin_compute(len(lane))
                    yield self.host.compute(lane_id, len(lane), seconds)
                    self.host.end_compute(len(lane))
                    end[step, local, i] = self.env.now
                    flops[step, local, i] = f
                elif stream == 2:  # collective
                    start[step, local, i] = self.env.now
                    host = self._host_cost_s(task, tuple(self.mesh.group(rank, task.group_axis)))
                    cpu[step, local, i] = host
                    if self.host.runs_host_work:  # the calls' host-side work runs on the rank's cores
                        yield self.host.compute(lane_id, len(lane), host)
                    ev = self._arrive(lane, step, i, task, nbytes[step], host)
                    yield ev
                    end[step, local, i] = self.env.now
                else:
                    self._post_p2p(lane, lane_id, stage, local, step, i, task)
                memory += plan.mem_at_end[i]
                if plan.mem_at_end[i] < 0:  # the (chunk, microbatch) releases its activations
                    memory -= routed_extra.pop((task.chunk, task.microbatch), 0.0)
            if step == 0:
                rec.first_step_peak_memory_bytes[list(lane)] = peak
        rec.peak_memory_bytes[list(lane)] = peak

    # ---- compute -------------------------------------------------------------------------------
    def _wake(self, done: simpy.Event, calls: int) -> None:
        """End a collective: at once, or after its members' wait for a core (the host model's)."""
        wait = self.host.wake_wait_s(calls) if calls else 0.0
        if wait <= 0:
            done.succeed()
        else:
            self.env.timeout(wait).callbacks.append(lambda _ev: done.succeed())

    def _compute_cost(self, rank: int, stage: int, step: int, i: int, task: Task) -> tuple[float, float]:
        plan = self.plans[stage]
        if task.kind == "optimizer":
            return self.coster.optimizer_time_s(plan.optimizer_params, plan.param_tensors), 0.0
        if not plan.expert_layers[i]:
            return plan.fixed_cost[i]
        ep_index = self.mesh.coords(rank)["ep"]
        group_first = self.mesh.group(rank, "ep")[0]
        seconds = flops = 0.0
        for op in task.ops:
            rows: tuple[int, ...] = ()
            parsed = parse_op(op)
            if parsed.is_experts:
                rows = tuple(self.experts.dispatch(step, parsed.layer, task.microbatch,
                                                   group_first).expert_rows[ep_index])
            s, f = self.coster.cost(task.kind, (op,), rows)
            seconds += s
            flops += f
        return seconds, flops

    def _routed_extra_bytes(self, rank: int, step: int, task: Task) -> float:
        """Activations of the routed rows this rank's experts got, beyond the balanced tokens x top_k that
        the stage plan counts (negative when it got fewer): skewed routing skews memory too."""
        ep_index = self.mesh.coords(rank)["ep"]
        group_first = self.mesh.group(rank, "ep")[0]
        extra = 0.0
        for op in task.ops:
            parsed = parse_op(op)
            if parsed.is_experts:
                dispatch = self.experts.dispatch(step, parsed.layer, task.microbatch, group_first)
                rows = sum(dispatch.expert_rows[ep_index])
                extra += (rows - self.tokens * self.model.top_k) * routed_row_bytes(self.model)
        return extra

    # ---- collectives ---------------------------------------------------------------------------
    def _groups_of_lane(self, lane: tuple[int, ...], axis: str) -> list:
        """[(group, lane-local stage indices of members in it, their indices in the group)]."""
        key = (lane[0], axis)
        hit = self._lane_groups.get(key)
        if hit is None:
            stage_base = self.mesh.stage_of(lane[0]) * self.per_stage
            by_group: dict[tuple[int, ...], list[int]] = {}
            for rank in lane:
                by_group.setdefault(self.mesh.group(rank, axis), []).append(rank)
            hit = self._lane_groups[key] = [
                (group, np.array(members) - stage_base, np.array([group.index(r) for r in members]))
                for group, members in by_group.items()]
        return hit

    def _arrive(self, lane: tuple[int, ...], step: int, i: int, task: Task, nbytes: np.ndarray,
                host_s: float) -> simpy.Event:
        """Join collective i with every member of the lane (host_s: its host work, the same in each of the
        lane's groups); returns the event of its end."""
        events = []
        for group, stage_local, in_group in self._groups_of_lane(lane, task.group_axis):
            key = (step, group[0], i)
            waiting = self._arrivals.get(key)
            if waiting is None:
                phases, sent, algo = self._phases(group[0], step, task, group)
                waiting = self._arrivals[key] = [0, self.env.event(), phases, sent, algo]
            waiting[0] += len(in_group)
            nbytes[stage_local, i] = waiting[3][in_group]
            if waiting[0] == len(group):
                del self._arrivals[key]
                gpus = self._group_gpus.get(group)
                if gpus is None:
                    gpus = self._group_gpus[group] = tuple(self.placement[r] for r in group)
                # on shared cores the host work already ran on the rank's share of them
                done = self.runner.run(waiting[2], gpus, (gpus, waiting[4], task.role),
                                       delay_s=0.0 if self.host.runs_host_work else host_s)
                calls = self._calls(task, group) if self.host.charges_wakeups else 0
                done.callbacks.append(lambda _ev, ev=waiting[1], calls=calls: self._wake(ev, calls))
            events.append(waiting[1])
        return events[0] if len(events) == 1 else self.env.all_of(events)

    def _calls(self, task: Task, group: tuple[int, ...]) -> int:
        """Library calls a collective makes: one per phase (split-size exchange included), as the torch
        backend does (one gloo call per phase); moving experts is one call; an all-to-all in a group of
        one moves nothing and makes none."""
        key = (task.kind, task.role == "migrate", group)
        hit = self._num_calls.get(key)
        if hit is None:
            gpus = [self.placement[r] for r in group]
            if task.kind == "all_to_all" and len(group) == 1:
                hit = 0
            elif task.role == "migrate":
                hit = 1
            elif task.kind == "all_to_all":
                hit = len(self.a2a(np.ones((len(group), len(group))), gpus, self.topo))
            else:
                hit = len(self.all_reduce(1.0, gpus, self.topo))
            self._num_calls[key] = hit
        return hit

    def _host_cost_s(self, task: Task, group: tuple[int, ...]) -> float:
        """Host-side cost of a collective: the profile's per-call cost for the group size, once per call, and
        an all-to-all's work around its calls (TaskCoster.exchange_s; also in a group of one)."""
        calls = self._calls(task, group) * self.coster.profile.collective_call_s(task.kind, len(group))
        return calls + (self.coster.exchange_s(task) if task.kind == "all_to_all" else 0.0)

    def _phases(self, rank: int, step: int, task: Task, group: tuple[int, ...]):
        gpus = [self.placement[r] for r in group]
        if task.role == "migrate":  # expert state moves between members: direct point-to-point sends
            matrix = self.experts.migrate(self.mesh.stage_of(rank), step)
            return [matrix_phase(matrix, "migrate")], matrix.sum(axis=1) - np.diag(matrix), "direct"
        if task.kind == "all_to_all":
            d = self.experts.dispatch(step, task.layer, task.microbatch, group[0])
            matrix = d.bytes_matrix(self.row_bytes, task.role).astype(float)
            return self.a2a(matrix, gpus, self.topo), matrix.sum(axis=1) - np.diag(matrix), self.a2a_name
        plan = self.plans[self.mesh.stage_of(rank)]
        params = plan.params_dense if task.role in ("grad_dense", "param_dense") else plan.params_expert
        size = params * self.model.dtype_bytes
        algorithm = self.sharded[task.kind] if task.kind in self.sharded else self.all_reduce
        return algorithm(size, gpus, self.topo), np.full(len(group), size), self.ar_name

    # ---- p2p -----------------------------------------------------------------------------------
    def _post_p2p(self, lane: tuple[int, ...], lane_id: int, stage: int, local: np.ndarray, step: int, i: int,
                  task: Task) -> None:
        done = self._async_done[(lane_id, step, i)] = self.env.event()
        peer_lane = self._lane_of[self.mesh.peer(lane[0], task.peer_stage)]
        src, dst = (lane_id, peer_lane) if task.kind == "send" else (peer_lane, lane_id)
        key = (step, src, dst, task.tag)
        mine = (stage, local, i, done)
        other = self._p2p.pop(key, None)
        if other is None:
            self._p2p[key] = mine
            return
        gpus = self._p2p_gpus.get((src, dst))
        if gpus is None:
            senders = self.lanes[src]
            receivers = tuple(self.mesh.peer(r, self.mesh.stage_of(self.lanes[dst][0])) for r in senders)
            gpus = self._p2p_gpus[(src, dst)] = tuple(self.placement[r] for r in senders + receivers)
        size = float(self.tokens * self.row_bytes)
        n = len(gpus) // 2
        phase = Phase(src=np.arange(n), dst=np.arange(n, 2 * n), sizes=np.full(n, size), name="p2p")
        if n > 1 and self.runner.latency_spread_s(phase, gpus, (gpus, "p2p", "")) > 0:
            raise Asymmetry(f"transfer {task.tag}: lane members' routes have different latencies")
        transfer = self.runner.run([phase], gpus, (gpus, "p2p", ""), delay_s=self.coster.profile.p2p_overhead_s)
        started = self.env.now

        def finish(ev, ends=(mine, other)) -> None:
            member_end = ev.value
            if member_end.size > 1 and np.ptp(member_end) > 1e-9 * max(self.env.now - started, 1e-12):
                raise Asymmetry(f"transfer {task.tag} ends at different times across lane members")
            for st, lo, idx, event in ends:
                self.records.start_s[st][step, lo, idx] = started
                self.records.end_s[st][step, lo, idx] = self.env.now
                self.records.bytes[st][step, lo, idx] = size
                event.succeed()

        transfer.callbacks.append(finish)
