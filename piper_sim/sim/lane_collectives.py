"""How a lane's members join collectives: each group of the lane at its last member's time.

Owns `LaneCollectives`, the collective half of piper_sim.sim.engine.Simulation (a mixin: it uses the
simulation's mesh, network runner, arrivals and clocks): a collective task's groups within a lane, their
arrivals, and the chains that keep groups whose collectives or transfers end apart at their own times
(collectives right after one another; a collective after transfers in flight). Must not import torch.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import simpy

from piper_sim.network import CollectiveRunner
from piper_sim.schedule.ir import Task
from piper_sim.sim.busy_units import BusyUnits
from piper_sim.sim.collective_tasks import CollectiveTasks
from piper_sim.sim.host import HostModel
from piper_sim.workload.mesh import Mesh


class LaneCollectives:
    """Collective arrivals of a lane's members (mixed into Simulation, whose state it reads)."""

    # what it reads of Simulation (set there)
    env: simpy.Environment
    mesh: Mesh
    per_stage: int
    placement: list[str]
    runner: CollectiveRunner
    host: HostModel
    collectives: CollectiveTasks
    busy: BusyUnits
    _arrivals: dict[tuple, list]
    _async_done: dict[tuple[int, int, int], simpy.Event]
    _landed: dict[tuple[int, int, int], list]
    _group_gpus: dict[tuple[int, ...], tuple[str, ...]]
    _lane_groups: dict[tuple[int, str], tuple[list, np.ndarray, np.ndarray]]
    _at: Callable[[float, Callable[[], object]], None]
    _check_on_time: Callable[[float, str | None], None]
    _wake: Callable[[simpy.Event, int], None]

    def _groups_of_lane(self, lane: tuple[int, ...], axis: str) -> list:
        """[(group, members' indices in the lane, in their stage, in the group)] of the lane's groups."""
        return self._lane_layout(lane, axis)[0]

    def _lane_layout(self, lane: tuple[int, ...], axis: str) -> tuple[list, np.ndarray, np.ndarray]:
        """The lane's groups (_groups_of_lane), the members' lane indices group after group, and where each group
        begins among them (np.maximum.reduceat's indices: every group's last member in one call)."""
        key = (lane[0], axis)
        hit = self._lane_groups.get(key)
        if hit is None:
            stage_base = self.mesh.stage_of(lane[0]) * self.per_stage
            by_group: dict[tuple[int, ...], list[int]] = {}
            for position, rank in enumerate(lane):
                by_group.setdefault(self.mesh.group(rank, axis), []).append(position)
            groups = [
                (
                    group,
                    np.array(at),
                    np.array([lane[p] for p in at]) - stage_base,
                    np.array([group.index(lane[p]) for p in at]),
                )
                for group, at in by_group.items()
            ]
            sizes = [len(at) for at in by_group.values()]
            order = np.concatenate([at for _, at, _, _ in groups])
            hit = self._lane_groups[key] = (groups, order, np.cumsum([0] + sizes[:-1]))
        return hit

    def _arrive(
        self, lane: tuple[int, ...], step: int, i: int, task: Task, nbytes: np.ndarray, host_s: float, clock: np.ndarray
    ) -> list[tuple[np.ndarray, np.ndarray, simpy.Event]]:
        """Join collective i with every member of the lane, each group at its last member's clock (host_s: its
        host work, the same in each of the lane's groups); returns (members' lane indices, end event) per
        group, the event's value the time the group's collective ends."""
        out = []
        joins: dict[float, list] = {}  # the groups' joins by arrival time: one event per distinct time
        groups, order, starts = self._lane_layout(lane, task.group_axis)
        arrivals = np.maximum.reduceat(clock[order], starts).tolist()
        for (group, at, stage_local, in_group), arrival in zip(groups, arrivals, strict=True):
            waiting = self._waiting(group, step, i, task)
            nbytes[stage_local, i] = waiting[3][in_group]
            joins.setdefault(arrival, []).append((group, waiting, len(at)))
            out.append((at, stage_local, waiting[1]))
        for arrival, joining in joins.items():  # (mypy cannot type a lambda with defaults, nor a list of None)
            self._at(
                arrival,
                lambda t=arrival, joining=joining: [
                    self._join(g, w, (step, g[0], i), m, t, task, host_s)  # type: ignore[misc, func-returns-value]
                    for g, w, m in joining
                ],
            )
        return out

    def _issue(
        self,
        lane: tuple[int, ...],
        lane_id: int,
        step: int,
        i: int,
        task: Task,
        nbytes: np.ndarray,
        host_s: float,
        clock: np.ndarray,
        end: np.ndarray,
    ) -> None:
        """Issue nonblocking collective i (ZeRO-3's): its groups join as _arrive says, and the task's done event
        (what a task that depends on it waits for) fires when every group has ended, its value each member's end
        time."""
        groups = self._arrive(lane, step, i, task, nbytes, host_s, clock)
        done = self._async_done[(lane_id, step, i)] = self.env.event()
        self.busy.hold(lane_id, done, self.collectives.unit_share(task))
        ends = np.full(len(lane), np.nan)
        left = [len(groups)]

        def ended(ev, at: np.ndarray, stage_local: np.ndarray) -> None:
            ends[at] = ev.value
            end[stage_local, i] = ev.value
            left[0] -= 1
            if not left[0]:
                done.succeed(ends)

        for at, stage_local, ev in groups:
            if ev.processed:
                ended(ev, at, stage_local)
            else:
                ev.callbacks.append(lambda e, at=at, sl=stage_local: ended(e, at, sl))  # type: ignore[misc]  # lambda with defaults

    @staticmethod
    def _settle(
        running: tuple[str, int, list[tuple[np.ndarray, np.ndarray, simpy.Event]]], clock: np.ndarray, end: np.ndarray
    ):
        """Wait for each group of the running collective to end: its members' clocks and end records."""
        _, i, groups = running
        for at, stage_local, ev in groups:
            if not ev.triggered:
                yield ev
            clock[at] = ev.value
            end[stage_local, i] = ev.value

    def _waiting(self, group: tuple[int, ...], step: int, i: int, task: Task) -> list:
        """The arrivals at collective i of this group: [members arrived, end event, phases, bytes sent, algorithm]."""
        key = (step, group[0], i)
        waiting = self._arrivals.get(key)
        if waiting is None:
            phases, sent, algo = self.collectives.phases(group[0], step, task, group)
            waiting = self._arrivals[key] = [0, self.env.event(), phases, sent, algo]
        return waiting

    def _after_landing(
        self,
        lane: tuple[int, ...],
        lane_id: int,
        step: int,
        i: int,
        task: Task,
        nbytes: np.ndarray,
        host_s: float,
        deps: tuple[int, ...],
        start: np.ndarray,
        clock: np.ndarray,
    ) -> list[tuple[np.ndarray, np.ndarray, simpy.Event]]:
        """Collective i waits for the lane's transfers `deps`: each member arrives at the later of its clock and
        its own transfers' landing, and each group joins when its members have (at its last member's time), not
        when the lane's last transfer lands (members' transfers land apart: routes of different latency)."""
        states = [self._landed[(lane_id, step, d)] for d in deps]
        waiting_for = np.zeros(len(lane), dtype=np.int64)  # each member's transfers not landed yet
        for landed, _ in states:
            np.maximum(clock, np.where(np.isnan(landed), -np.inf, landed), out=clock)
            waiting_for += np.isnan(landed)
        groups = self._groups_of_lane(lane, task.group_axis)
        waits = [self._waiting(group, step, i, task) for group, _, _, _ in groups]
        pending = []  # per group: its members still waiting for a transfer
        owner = np.empty(len(lane), dtype=np.int64)
        for k, (_, at, stage_local, in_group) in enumerate(groups):
            nbytes[stage_local, i] = waits[k][3][in_group]
            owner[at] = k
            pending.append(int((waiting_for[at] > 0).sum()))

        def join(k: int) -> None:
            group, at, stage_local, _ = groups[k]
            start[stage_local, i] = clock[at]
            arrival = float(clock[at].max())
            self._at(arrival, lambda: self._join(group, waits[k], (step, group[0], i), len(at), arrival, task, host_s))

        def watch(positions: np.ndarray, landed: np.ndarray) -> None:
            np.maximum.at(clock, positions, landed[positions])
            for p in positions.tolist():
                waiting_for[p] -= 1
                if waiting_for[p] == 0:
                    k = int(owner[p])
                    pending[k] -= 1
                    if pending[k] == 0:
                        join(k)

        for landed, watchers in states:
            watchers.append(lambda positions, landed=landed: watch(positions, landed))
        for k in range(len(groups)):
            if pending[k] == 0:
                join(k)
        return [(at, stage_local, w[1]) for (_, at, stage_local, _), w in zip(groups, waits, strict=True)]

    def _chain(
        self,
        lane: tuple[int, ...],
        step: int,
        i: int,
        task: Task,
        nbytes: np.ndarray,
        host_s: float,
        before: list[tuple[np.ndarray, np.ndarray, simpy.Event]],
        start: np.ndarray,
        end: np.ndarray,
        clock: np.ndarray,
    ) -> list[tuple[np.ndarray, np.ndarray, simpy.Event]]:
        """Collective i right after collective i - 1 (e.g. a step's gradient reduce-scatters, one group axis after
        another): each member arrives when its own group of i - 1 ends, and each group of i joins when its last
        member has, not when the lane's last group of i - 1 ends (groups' collectives may end apart: routes of
        different latency), so a lane of many groups stays exact."""
        owner = np.empty(len(lane), dtype=np.int64)  # lane position -> its group of collective i - 1
        for k, (at, stage_local, ended) in enumerate(before):
            owner[at] = k

            def ended_at(ev, at=at, sl=stage_local) -> None:
                clock[at] = ev.value
                end[sl, i - 1] = ev.value

            ended.callbacks.append(ended_at)
        out = []
        for group, at, stage_local, in_group in self._groups_of_lane(lane, task.group_axis):
            waiting = self._waiting(group, step, i, task)
            nbytes[stage_local, i] = waiting[3][in_group]
            needed = np.unique(owner[at]).tolist()
            left = [len(needed)]

            def arrive(_ev, g=group, w=waiting, at=at, sl=stage_local, left=left) -> None:
                left[0] -= 1
                if left[0] == 0:  # the group's last member has arrived: now
                    start[sl, i] = clock[at]
                    self._join(g, w, (step, g[0], i), len(at), float(clock[at].max()), task, host_s)

            for k in needed:
                before[k][2].callbacks.append(arrive)
            out.append((at, stage_local, waiting[1]))
        return out

    def _join(
        self,
        group: tuple[int, ...],
        waiting: list,
        key: tuple,
        members: int,
        arrival_s: float,
        task: Task,
        host_s: float,
    ) -> None:
        """`members` of the group arrive at arrival_s (now, or earlier when they start nothing); the last start
        the collective."""
        waiting[0] += members
        if waiting[0] < len(group):
            return
        self._check_on_time(arrival_s, task.group_axis)
        del self._arrivals[key]
        gpus = self._group_gpus.get(group)
        if gpus is None:
            gpus = self._group_gpus[group] = tuple(self.placement[r] for r in group)
        calls = self.host.blocking_calls(lambda: self.collectives.calls(task, group))
        run_key, delay_s = (gpus, waiting[4], task.role), self.host.flow_delay_s(host_s)
        if not calls:  # no wake-up to wait for: the group's end is the collective's (the runner fires it)
            self.runner.run(waiting[2], gpus, run_key, delay_s=delay_s, done=waiting[1])
            return
        done = self.runner.run(waiting[2], gpus, run_key, delay_s=delay_s)
        done.callbacks.append(lambda _ev, ev=waiting[1], calls=calls: self._wake(ev, calls))  # type: ignore[misc]  # lambda with defaults
