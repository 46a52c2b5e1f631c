"""The SimPy backend: processes walk the stage programs under the execution contract.

Owns the simulated run: compute durations from the cost model, collectives (their phases from
collective_tasks.py) and p2p transfers on the flow network, memory tracking, and the per-task records
that become the RunTrace.
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
did); the engine raises Asymmetry then, and the caller reruns with one lane per rank (see simulator.py). On
shared cores (the CPU testbed) the host model times compute per lane, so members must agree; lanes are used
there only when their compute is equal.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import simpy

from piper_sim.collectives.algorithms import Phase
from piper_sim.host_memory import MemoryGuard
from piper_sim.machine import Machine
from piper_sim.network import CollectiveRunner, FlowNetwork
from piper_sim.schedule.ir import Schedule, Task
from piper_sim.sim.collective_tasks import CollectiveTasks
from piper_sim.sim.experts import ExpertState
from piper_sim.sim.host import Asymmetry, host_model
from piper_sim.sim.lane_collectives import LaneCollectives
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
from piper_sim.workload.memory import routed_row_bytes
from piper_sim.workload.ops import parse_op
from piper_sim.workload.task_kinds import TaskKind


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
    num_reserved: int = 0  # collectives run as reservations (piper_sim.network.collective_runner)
    num_broken: int = 0  # of those, turned into their flow sets when other flows came onto their links
    num_mirrored: int = 0  # phase timelines taken from a mirror image solved before (piper_sim.network.mirror)


class Simulation(LaneCollectives):
    def __init__(
        self,
        schedule: Schedule,
        machine: Machine,
        settings: SimSettings,
        coster: TaskCoster,
        collapse: bool = False,
        by_latency: bool = False,
    ) -> None:
        """The run of schedule on machine under settings (sim/settings.py), compute priced by coster; collapse:
        one lane per stage (per EP group under skewed routing), split by route latency where by_latency; else
        one lane per rank."""
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
        self.lanes = self._lanes(collapse)
        if collapse and by_latency:
            self.lanes = self._by_latency(self.lanes)
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
        self._lane_groups: dict[tuple[int, str], list] = {}
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
        split: list[tuple[int, ...]] = []
        for lane in lanes:
            by_column: dict[tuple, list[int]] = {}
            for rank in lane:
                by_column.setdefault(column[rank % stage], []).append(rank)
            split.extend(tuple(members) for members in by_column.values())
        return split

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

    def _check_on_time(self, time_s: float) -> None:
        """Something starts on the network at time_s: if that has passed, it would have changed what the network
        already did (members of a lane fell apart), and the run needs one lane per rank."""
        if time_s < self.env.now - 1e-12 * max(self.env.now, 1e-9):
            raise Asymmetry(f"a lane member's network action at {time_s:.9g} s falls behind the simulated time")

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

    # ---- compute -------------------------------------------------------------------------------
    def _wake(self, done: simpy.Event, calls: int) -> None:
        """End a collective: at once, or after its members' wait for a core (the host model's); the event's
        value is the time it ends."""
        wait = self.host.wake_wait_s(calls) if calls else 0.0
        if wait <= 0:
            done.succeed(self.env.now)
        else:
            self.env.timeout(wait).callbacks.append(lambda _ev: done.succeed(self.env.now))  # type: ignore[arg-type]  # value dropped

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

    # ---- p2p -----------------------------------------------------------------------------------
    def _post_p2p(
        self,
        lane: tuple[int, ...],
        lane_id: int,
        stage: int,
        local: np.ndarray | slice,
        step: int,
        i: int,
        task: Task,
        clock: np.ndarray,
    ) -> None:
        """Post the members' sends (or receives) of task i at their clocks; a member's transfer starts when both
        its ends are posted. The task's done event's value: each member's end time."""
        done = self._async_done[(lane_id, step, i)] = self.env.event()
        landed_state = self._landed[(lane_id, step, i)] = [np.full(len(lane), np.nan), []]
        peer_lane = self._lane_of[self.mesh.peer(lane[0], task.peer_stage)]
        src, dst = (lane_id, peer_lane) if task.kind == TaskKind.SEND else (peer_lane, lane_id)
        key = (step, src, dst, task.tag)
        mine = (stage, local, i, done, clock.copy(), landed_state)
        other = self._p2p.pop(key, None)
        if other is None:
            self._p2p[key] = mine
            return
        sender, receiver = (mine, other) if task.kind == TaskKind.SEND else (other, mine)
        gpus, to_receiver, latency = self._p2p_route(src, dst)
        starts = np.maximum(sender[4], receiver[4][to_receiver])  # per sender member
        ends = np.full(starts.size, np.nan)
        size = self.p2p_bytes
        pending = [0]

        def finish() -> None:
            for (st, lo, idx, event, _, _), order in ((sender, slice(None)), (receiver, np.argsort(to_receiver))):
                self.records.start_s[st][step, lo, idx] = starts[order]
                self.records.end_s[st][step, lo, idx] = ends[order]
                self.records.bytes[st][step, lo, idx] = size
                event.succeed(ends[order])

        def launch(members: np.ndarray, start_s: float) -> None:
            self._check_on_time(start_s)
            n = len(gpus) // 2
            phase = Phase(src=members, dst=members + n, sizes=np.full(members.size, size), name="p2p")
            transfer = self.runner.run(
                [phase], gpus, (gpus, "p2p", ""), delay_s=self.coster.profile.p2p_overhead_s, finish_times=True
            )

            def landed(ev) -> None:
                ends[members] = ev.value
                for side, positions in ((sender[5], members), (receiver[5], to_receiver[members])):
                    side[0][positions] = ev.value
                    for watch in list(side[1]):
                        watch(positions)
                pending[0] -= 1
                if not pending[0]:
                    finish()

            transfer.callbacks.append(landed)

        # members whose transfers start together on routes of one latency share one flow set
        if np.ptp(starts) == 0 and np.ptp(latency) == 0:
            batches = [np.arange(starts.size)]
        else:
            _, batch = np.unique(np.stack([starts, latency]), axis=1, return_inverse=True)
            batches = [np.flatnonzero(batch.ravel() == b) for b in range(int(batch.max()) + 1)]
        pending[0] = len(batches)
        for members in sorted(batches, key=lambda m: starts[m[0]]):
            self._at(float(starts[members[0]]), lambda m=members: launch(m, float(starts[m[0]])))

    def _p2p_route(self, src: int, dst: int) -> tuple[tuple[str, ...], np.ndarray, np.ndarray]:
        """GPUs of a p2p between two lanes (senders, then their receivers in sender order), each sender's
        receiver's index in the receiving lane, and each member's path latency."""
        hit = self._p2p_routes.get((src, dst))
        if hit is None:
            senders, receivers = self.lanes[src], self.lanes[dst]
            peers = [self.mesh.peer(r, self.mesh.stage_of(receivers[0])) for r in senders]
            gpus, latency = self._p2p_latency_s(list(senders), peers)
            hit = self._p2p_routes[(src, dst)] = (gpus, np.array([receivers.index(p) for p in peers]), latency)
        return hit

    def _p2p_latency_s(self, senders: list[int], receivers: list[int]) -> tuple[tuple[str, ...], np.ndarray]:
        """GPUs of a p2p from these ranks to these (senders, then receivers) and each sender's path latency."""
        gpus = tuple(self.placement[r] for r in senders + receivers)
        n = len(senders)
        phase = Phase(src=np.arange(n), dst=np.arange(n, 2 * n), sizes=np.ones(n), name="p2p")
        return gpus, self.runner.flow_latency_s(phase, gpus, (gpus, "p2p", ""))
