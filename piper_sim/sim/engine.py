"""The SimPy backend: processes walk the stage programs under the execution contract.

Owns Simulation, the simulated run: its lanes and their processes, each walking its stage's program, memory
tracking, and the per-task records (run_records.py) that become the RunTrace. A lane's compute is priced per member
(lane_compute.py), its p2p transfers (lane_p2p.py) and collectives (lane_collectives.py, their phases from
collective_tasks.py) run on the flow network.
Contract (schedule/ir.py): one program counter per rank; compute and collective tasks block it;
send/recv and nonblocking collectives (ZeRO-3) are issued asynchronously and end when their transfer ends;
a collective starts when all members have reached it; a task waits for its deps.

Lanes: one SimPy process drives a lane, ranks of one pipeline stage that run the same program: the whole stage
under uniform routing, each EP group of it under skewed routing. Each member keeps a clock of its own: compute
needs no event (a member's expert rows, hence its compute time and memory, are its own), and a member's
network action (its arrival at a collective, its half of a p2p transfer) is scheduled at its clock. Every
member's flow enters the network and collectives count every member, so contention is modelled as with one
process per rank. Collectives that follow one another directly (a step's gradient reduce-scatters) are
chained: each member arrives at the next when its own group of the last one ends, so groups whose collectives
end apart keep their own times; likewise a collective after transfers in flight (the last gradient send before
the reduce-scatters): each group joins when its own members' transfers have landed. A lane only goes wrong
when a member's action would fall behind the simulated time (it would have changed what the network already
did); the engine raises Asymmetry then, naming the axis of the collective whose groups ended apart, and the
caller reruns with lanes split by route latency, then by the groups of that axis, and only then one lane per rank
(see simulator.py). On
shared cores (the CPU testbed) the host model times compute per lane, so members must agree; lanes are used
there only when their compute is equal.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass

import numpy as np
import simpy

from piper_sim.host_memory import MemoryGuard
from piper_sim.machine import Machine
from piper_sim.network import CollectiveRunner, FlowNetwork
from piper_sim.schedule.ir import Schedule
from piper_sim.sim.busy_units import BusyUnits
from piper_sim.sim.collective_tasks import CollectiveTasks
from piper_sim.sim.experts import ExpertState
from piper_sim.sim.host import Asymmetry, host_model
from piper_sim.sim.lane_collectives import LaneCollectives
from piper_sim.sim.lane_compute import LaneCompute
from piper_sim.sim.lane_p2p import LaneP2P
from piper_sim.sim.run_records import SimRecords
from piper_sim.sim.settings import SimSettings
from piper_sim.sim.stage_plans import (
    COLLECTIVE_CODE,
    COMPUTE_CODE,
    NONBLOCKING_CODE,
    P2P_CODE,
    StagePlan,
    build_stage_plans,
)
from piper_sim.workload.context_parallel import kv_chunk_bytes
from piper_sim.workload.cost import TaskCoster
from piper_sim.workload.task_kinds import TaskKind


@dataclass(frozen=True)
class LaneSplit:
    """Which ranks a lane drives: collapse: one lane per stage (per EP group under skewed routing), else one lane per
    rank; by_latency: each split by its members' route latencies (Simulation._by_latency); axes: each split by the
    groups of these axes (those whose collectives' groups ended apart in a run given up; Simulation._by_groups)."""

    collapse: bool = True
    by_latency: bool = False
    axes: tuple[str, ...] = ()


PER_RANK = LaneSplit(collapse=False)


def _split(lanes: list[tuple[int, ...]], key: Callable[[int], Hashable]) -> list[tuple[int, ...]]:
    """Each lane split into its members of one key, in the order the keys first appear."""
    split: list[tuple[int, ...]] = []
    for lane in lanes:
        by_key: dict[Hashable, list[int]] = {}
        for rank in lane:
            by_key.setdefault(key(rank), []).append(rank)
        split.extend(tuple(members) for members in by_key.values())
    return split


class Simulation(LaneCollectives, LaneCompute, LaneP2P):
    def __init__(
        self,
        schedule: Schedule,
        machine: Machine,
        settings: SimSettings,
        coster: TaskCoster,
        lanes: LaneSplit = PER_RANK,
    ) -> None:
        """The run of schedule on machine under settings (sim/settings.py), compute priced by coster, in the lanes
        `lanes` asks for (LaneSplit)."""
        model, parallel, topology, routing = settings.model, settings.parallel, machine.topology, settings.routing
        placement, steps, recompute_modules = list(machine.placement), settings.steps, settings.recompute_modules
        self.schedule, self.model, self.parallel, self.topo = schedule, model, parallel, topology
        self.recompute_modules = recompute_modules  # selective recomputation's (config.py; () otherwise)
        self.placement, self.coster, self.routing, self.steps = placement, coster, routing, steps
        self.mesh = schedule.mesh
        self.per_stage = self.mesh.num_ranks // self.mesh.pp
        self.env = simpy.Environment()
        self.network = FlowNetwork(self.env, topology.capacity_bytes_per_s, batch=True)
        self.runner = CollectiveRunner(self.env, self.network, topology)
        self.plans: list[StagePlan] = build_stage_plans(
            schedule,
            model,
            parallel,
            settings.flash_attention,
            recompute=settings.recompute,
            recompute_layers=settings.recompute_layers,
            checkpoint_layers=settings.checkpoint_layers,
            zero=settings.zero,
            fp8_transposed_copies=coster.profile.fp8_transposed_copies,
            recompute_modules=recompute_modules,
            reshard_after_forward=settings.reshard_after_forward,
        )
        for plan in self.plans:
            plan.fixed_cost = [
                coster.cost(t.kind, t.ops) if t.is_compute and t.kind != TaskKind.OPTIMIZER and not e else (0.0, 0.0)
                for t, e in zip(plan.program, plan.expert_layers, strict=True)
            ]
        self.tokens = parallel.tokens_per_microbatch(model.seq_len)  # a rank's: its sequence chunks under cp
        self.routed_tokens = int(self.tokens * parallel.split.dispatch_share)  # tokens a rank routes
        activation_bytes = float(self.tokens * model.d_model * model.dtype_bytes)  # a micro-batch's, whole
        self.p2p_bytes = activation_bytes * parallel.split.sequence_share  # what a rank sends a stage on
        ep_groups = [
            sorted({self.mesh.group(r, "ep")[0] for r in self.mesh.stage_ranks(p)}) for p in range(self.mesh.pp)
        ]
        self.experts = ExpertState(
            model, schedule, routing, settings.migration, parallel.ep, self.routed_tokens, ep_groups
        )
        self.collectives = CollectiveTasks(
            schedule=schedule,
            model=model,
            topology=topology,
            placement=placement,
            plans=self.plans,
            experts=self.experts,
            routing=routing,
            coster=coster,
            runner=self.runner,
            all_to_all=settings.collectives.all_to_all,
            all_reduce=settings.collectives.all_reduce,
            activation_bytes=activation_bytes,
            ring_bytes=parallel.cp * kv_chunk_bytes(model, parallel),
        )
        self.host = host_model(self.env, topology, machine.host_profile)  # the lanes follow what it allows
        self.busy = BusyUnits(self.env)  # issued collectives' hold on their ranks' compute units (busy_units.py)
        self.lanes = self._lanes(lanes.collapse)
        if lanes.collapse and lanes.by_latency:
            self.lanes = self._by_latency(self.lanes)
        if lanes.collapse and lanes.axes:
            self.lanes = self._by_groups(self.lanes, lanes.axes)
        self.tasks_done = 0  # of the ranks' tasks, those their lanes have passed (simulate's progress line reads it)
        self.guard: MemoryGuard | None = None  # simulate's host-memory guard, checked after every lane task
        self._lane_of = {r: li for li, lane in enumerate(self.lanes) for r in lane}
        self.host.attach_lanes([len(lane) for lane in self.lanes])
        self._arrivals: dict[tuple, list] = {}
        self._p2p: dict[tuple, tuple] = {}
        self._async_done: dict[tuple[int, int, int], simpy.Event] = {}
        # (lane, step, task) of a posted p2p task: [each member's landing time (NaN until it lands), watchers]
        self._landed: dict[tuple[int, int, int], list] = {}
        self._group_gpus: dict[tuple[int, ...], tuple[str, ...]] = {}
        self._lane_groups: dict[tuple[int, str], tuple[list, np.ndarray, np.ndarray]] = {}
        self._p2p_routes: dict[tuple[int, int], tuple] = {}
        self._rows: dict[tuple, tuple] = {}  # member rows per (lane, layer, placement) under uniform routing
        self._lane_ep: dict[int, list] = {}  # a lane's members by EP group (_member_rows), by its first rank
        shape = lambda p: (steps, self.per_stage, len(schedule.stage_programs[p]))  # noqa: E731
        self.records = SimRecords(
            start_s=[np.full(shape(p), np.nan) for p in range(self.mesh.pp)],
            end_s=[np.full(shape(p), np.nan) for p in range(self.mesh.pp)],
            flops=[np.zeros(shape(p)) for p in range(self.mesh.pp)],
            bytes=[np.zeros(shape(p)) for p in range(self.mesh.pp)],
            cpu_s=[np.full(shape(p), np.nan) for p in range(self.mesh.pp)],
            peak_memory_bytes=np.zeros(self.mesh.num_ranks),
            first_step_peak_memory_bytes=np.zeros(self.mesh.num_ranks),
            link_bytes=self.network.link_bytes,
            num_flows=0,
            num_solves=0,
            num_lanes=len(self.lanes),
        )

    # ---- lanes ---------------------------------------------------------------------------------
    def _lanes(self, collapse: bool) -> list[tuple[int, ...]]:
        """Ranks simulated by one process (a lane): a whole pipeline stage under uniform routing, a stage's EP
        group under skewed routing (the groups' all-to-alls end apart); one lane per rank when cores are
        shared and members' compute differs (the host model times compute per lane)."""
        singles: list[tuple[int, ...]] = [(r,) for r in range(self.mesh.num_ranks)]
        if not collapse:
            return singles
        stages = [tuple(self.mesh.stage_ranks(p)) for p in range(self.mesh.pp)]
        if self.routing.is_uniform:
            moe = self.model.moe_layer_indices
            rows = self.experts.dispatch(0, moe[0], 0, 0).expert_rows if moe else [()]
            if all(tuple(r) == tuple(rows[0]) for r in rows) or self.host.lanes_may_differ():
                return stages
            return singles
        if not self.host.lanes_may_differ():
            return singles
        return sorted({self.mesh.group(r, "ep") for stage in stages for r in stage})

    def _by_latency(self, lanes: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
        """Lanes split so that members' pipeline columns (a rank and its peers at the other stages) have routes of
        equal latency at every hop: the transfers of members whose routes differ land apart, so over many
        micro-batches their clocks drift apart by more than a lane can absorb (dense pipelines across a fat tree's
        leaves)."""
        stage = self.per_stage
        hops = []
        for p in range(self.mesh.pp - 1):
            ranks, nexts = list(self.mesh.stage_ranks(p)), list(self.mesh.stage_ranks(p + 1))
            hops += [self._p2p_latency_s(ranks, nexts)[1], self._p2p_latency_s(nexts, ranks)[1]]
        column = [tuple(h[c] for h in hops) for c in range(stage)]
        return _split(lanes, lambda rank: column[rank % stage])

    def _by_groups(self, lanes: list[tuple[int, ...]], axes: tuple[str, ...]) -> list[tuple[int, ...]]:
        """Lanes split so that each lies in one group of each of the axes: members of one group of a collective
        arrive and leave together, while groups of it that end apart (different contention on their routes) would
        take a lane's members apart."""
        return _split(lanes, lambda rank: tuple(self.mesh.group(rank, axis)[0] for axis in axes))

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
        self.records.num_reserved, self.records.num_broken = self.runner.num_reserved, self.runner.num_broken
        self.records.num_mirrored = self.runner.recorder.timelines.num_mirrored
        return self.records

    def _at(self, time_s: float, action) -> None:
        """Run action at simulated time time_s, or now when that has passed. A lane's members keep clocks of their
        own (compute needs no event), so a member's network action may lie ahead of the simulation."""
        if time_s > self.env.now:
            self.env.timeout(time_s - self.env.now).callbacks.append(lambda _ev: action())
        else:
            action()

    def _check_on_time(self, time_s: float, axis: str | None = None) -> None:
        """Something starts on the network at time_s: if that has passed, it would have changed what the network
        already did (members of a lane fell apart), and the run needs smaller lanes; axis: the group axis of the
        collective that starts (None: a transfer)."""
        if time_s < self.env.now - 1e-12 * max(self.env.now, 1e-9):
            raise Asymmetry(f"a lane member's network action at {time_s:.9g} s falls behind the simulated time", axis)

    def _lane(self, lane: tuple[int, ...]):
        rank = lane[0]
        stage = self.mesh.stage_of(rank)
        plan = self.plans[stage]
        lane_id = self._lane_of[rank]
        offsets = np.array(lane) - stage * self.per_stage
        n = len(lane)
        local: np.ndarray | slice = offsets  # the members' rows in the stage's records
        if np.array_equal(offsets, np.arange(offsets[0], offsets[0] + n)):  # consecutive ranks: a slice writes faster
            local = slice(int(offsets[0]), int(offsets[0]) + n)
        rec = self.records
        start, end, flops, nbytes = rec.start_s[stage], rec.end_s[stage], rec.flops[stage], rec.bytes[stage]
        cpu = rec.cpu_s[stage]
        clock = np.zeros(n)  # each member's simulated time
        memory = np.full(n, float(plan.static_bytes))
        peak = memory.copy()
        routed_extra: dict[tuple[int, int], np.ndarray] = {}  # (chunk, microbatch) -> bytes beyond a balanced load
        grew = True
        # the collective whose groups may still run: (axis, task index, [(members, stage-local, end event)])
        running: tuple[str, int, list[tuple[np.ndarray, np.ndarray, simpy.Event]]] | None = None
        for step in range(self.steps):
            for i, task in enumerate(plan.program):
                if running is not None and (plan.streams[i] != COLLECTIVE_CODE or plan.async_deps[i]):
                    yield from self._settle(running, clock, end[step])
                    running = None
                # a collective after transfers (p2p only, not a ring): each group joins when its members' have landed
                # (_after_landing)
                after_landing = (
                    plan.streams[i] == COLLECTIVE_CODE
                    and bool(plan.async_deps[i])
                    and self.host.joins_as_transfers_land()
                    and all(plan.streams[d] == P2P_CODE for d in plan.async_deps[i])
                )
                for d in () if after_landing else plan.async_deps[i]:
                    ev = self._async_done[(lane_id, step, d)]
                    if not ev.triggered:  # blocked on a transfer: woken when it ends
                        yield ev
                        yield from self.host.woken(clock)
                    np.maximum(clock, ev.value, out=clock)  # type: ignore[arg-type]  # simpy's value: end times
                if plan.mem_at_start[i]:
                    memory += plan.mem_at_start[i]
                    grew = True
                if task.kind == TaskKind.FORWARD_EXPERT:
                    extra = self._routed_extra_bytes(lane, step, task)
                    key = (task.chunk, task.microbatch)
                    routed_extra[key] = routed_extra.get(key, 0.0) + extra
                    memory += extra
                    grew = True
                if grew:  # the peak can only have moved if memory grew since it was last taken
                    np.maximum(peak, memory, out=peak)
                    grew = False
                stream = plan.streams[i]
                if stream == COMPUTE_CODE:
                    seconds, f = self._compute_cost(lane, stage, step, i, task)
                    cpu[step, local, i] = seconds
                    flops[step, local, i] = f
                    yield from self.host.sync(clock)
                    start[step, local, i] = clock
                    if self.busy.holding(lane_id):  # beside an issued collective's kernels: on the units they leave
                        yield from self.busy.compute(lane_id, clock, seconds)
                    else:
                        yield from self.host.compute(lane_id, clock, seconds)
                    end[step, local, i] = clock
                elif stream == COLLECTIVE_CODE:
                    host = self.collectives.host_cost_s(task, tuple(self.mesh.group(rank, task.group_axis)))
                    cpu[step, local, i] = host
                    if running is not None and not self.host.chains_collectives():
                        yield from self._settle(running, clock, end[step])
                        running = None
                    if after_landing:
                        running = (
                            task.group_axis,
                            i,
                            self._after_landing(
                                lane, lane_id, step, i, task, nbytes[step], host, plan.async_deps[i], start[step], clock
                            ),
                        )
                    elif running is not None:  # right after another: its members arrive as their groups of it end
                        running = (
                            task.group_axis,
                            i,
                            self._chain(
                                lane, step, i, task, nbytes[step], host, running[2], start[step], end[step], clock
                            ),
                        )
                    else:
                        yield from self.host.sync(clock)
                        start[step, local, i] = clock
                        yield from self.host.host_work(lane_id, clock, host)  # the calls' host-side work
                        running = (task.group_axis, i, self._arrive(lane, step, i, task, nbytes[step], host, clock))
                elif stream == NONBLOCKING_CODE:  # issued: the program counter moves on
                    host = self.collectives.host_cost_s(task, tuple(self.mesh.group(rank, task.group_axis)))
                    cpu[step, local, i] = host
                    yield from self.host.host_work(lane_id, clock, host)  # its calls' host-side work, as issued
                    start[step, local, i] = clock
                    self._issue(lane, lane_id, step, i, task, nbytes[step], host, clock, end[step])
                else:
                    self._post_p2p(lane, lane_id, stage, local, step, i, task, clock)
                if plan.mem_at_end[i]:
                    memory += plan.mem_at_end[i]
                    grew = grew or plan.mem_at_end[i] > 0
                if plan.mem_at_end[i] < 0:  # the (chunk, microbatch) releases its activations
                    memory -= routed_extra.pop((task.chunk, task.microbatch), 0.0)
                self.tasks_done += n
                if self.guard is not None:
                    self.guard.check()
            if running is not None:
                yield from self._settle(running, clock, end[step])
                running = None
            if step == 0:
                rec.first_step_peak_memory_bytes[list(lane)] = peak
        rec.peak_memory_bytes[list(lane)] = peak

    def _wake(self, done: simpy.Event, calls: int) -> None:
        """End a collective: at once, or after its members' wait for a core (the host model's); the event's
        value is the time it ends."""
        wait = self.host.wake_wait_s(calls) if calls else 0.0
        if wait <= 0:
            done.succeed(self.env.now)
        else:
            self.env.timeout(wait).callbacks.append(lambda _ev: done.succeed(self.env.now))  # type: ignore[arg-type]  # value dropped
