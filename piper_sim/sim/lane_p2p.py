"""A lane's point-to-point transfers: each member's half posted at its clock, the pair's transfer on the network.

Owns `LaneP2P`, the p2p half of piper_sim.sim.engine.Simulation (a mixin: it uses the simulation's network runner,
lanes, records and clocks): a send met with its receive across two lanes, the members' transfers started as both
their ends are posted (those that start together on routes of one latency as one flow set), their landing times
for the tasks that wait on them, and the routes and latencies between two lanes. Must not import torch.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import simpy

from piper_sim.collectives.algorithms import Phase
from piper_sim.network import CollectiveRunner
from piper_sim.schedule.ir import Task
from piper_sim.sim.run_records import SimRecords
from piper_sim.workload.cost import TaskCoster
from piper_sim.workload.mesh import Mesh
from piper_sim.workload.task_kinds import TaskKind


class LaneP2P:
    """Point-to-point transfers of a lane's members (mixed into Simulation, whose state it reads)."""

    # what it reads of Simulation (set there)
    env: simpy.Environment
    mesh: Mesh
    placement: list[str]
    lanes: list[tuple[int, ...]]
    runner: CollectiveRunner
    coster: TaskCoster
    records: SimRecords
    p2p_bytes: float
    _async_done: dict[tuple[int, int, int], simpy.Event]
    _landed: dict[tuple[int, int, int], list]
    _lane_of: dict[int, int]
    _p2p: dict[tuple, tuple]
    _p2p_routes: dict[tuple[int, int], tuple]
    _at: Callable[[float, Callable[[], object]], None]
    _check_on_time: Callable[[float, str | None], None]

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
            self._check_on_time(start_s, None)
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
            self._at(float(starts[members[0]]), lambda m=members: launch(m, float(starts[m[0]])))  # type: ignore[misc]  # lambda with a default

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
