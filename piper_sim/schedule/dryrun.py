"""Dry runs of a schedule: the execution contract of ir.py run with given task durations (default: 1 per
compute task, 0 per send, recv and collective), event by event, with no simulator.

Owns Timing (start and end of every task of every row, and where stuck rows wait), coarse_order and replay (the
walk that no durations change, and its times), coarse_timing (one blocking program counter per stage; cross-stage
data deps implicit) and lowered_timing (every rank of the mesh; send/recv and collectives as the contract says).
Never raises on deadlock: validate.py turns a stuck Timing into a ScheduleError with the grid (grid.py renders a
Timing). Must not import simpy, torch or numpy.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from piper_sim.schedule.ir import Layout, Schedule, Task, VirtualStages
from piper_sim.workload.task_kinds import COMPUTE_KINDS, P2P_KINDS, TaskKind

Programs = Sequence[Sequence[Task]]
Durations = Mapping[str, float] | None
_CLASS = {TaskKind.FORWARD: "F", TaskKind.BACKWARD: "B", TaskKind.BACKWARD_INPUT: "B", TaskKind.BACKWARD_WEIGHT: "W"}


@dataclass(frozen=True, kw_only=True)
class Timing:
    """Start and end of every task of every row (a stage or a rank), in program order.

    None: the task never ran. blocked[row]: what the row waits for ("" when it finished).
    """

    starts: tuple[tuple[float | None, ...], ...]
    ends: tuple[tuple[float | None, ...], ...]
    blocked: tuple[str, ...]
    row_labels: tuple[str, ...]

    @property
    def makespan(self) -> float:
        return max((e for row in self.ends for e in row if e is not None), default=0)

    @property
    def deadlocked(self) -> bool:
        return any(self.blocked)

    def stuck_rows(self) -> list[int]:
        return [row for row, why in enumerate(self.blocked) if why]


def duration(durations: Durations, kind: str) -> float:
    """Duration of a task kind: durations[kind], else 1 for compute and 0 for communication."""
    if durations is not None and kind in durations:
        return durations[kind]
    return 1 if kind in COMPUTE_KINDS else 0


_Done = TypeVar("_Done", int, float)  # what a key's completion is: a step's index, or an end time


class _Board(Generic[_Done]):
    """Completion times by key and the waiters of keys not yet done."""

    def __init__(self) -> None:
        self.done: dict[tuple, _Done] = {}
        self.waiters: dict[tuple, list] = defaultdict(list)

    def first_missing(self, keys: Sequence[tuple]) -> tuple | None:
        return next((k for k in keys if k not in self.done), None)

    def finish(self, key: tuple, end: _Done) -> list:
        self.done.setdefault(key, end)
        return self.waiters.pop(key, [])


def _cross_key(task: Task, stage: int, stages: VirtualStages) -> tuple | None:
    """The task of the neighbouring virtual stage whose data `task` needs (implicit send/recv)."""
    virtual = stages.of(stage, task.chunk)
    if task.kind == TaskKind.FORWARD:
        other, cls = stages.previous(virtual), "F"
    elif task.kind in (TaskKind.BACKWARD, TaskKind.BACKWARD_INPUT):
        other, cls = stages.next(virtual), "B"
    else:
        return None
    return None if other is None else (cls, *stages.where(other), task.microbatch)


def _describe(key: tuple) -> str:
    if key[0] == "id":
        return f"{key[2]} (same stage)"
    return f"{key[0]}:c{key[2]}:m{key[3]} on stage {key[1]}"


@dataclass(frozen=True, kw_only=True)
class CoarseOrder:
    """The order in which a coarse dry run runs its tasks, which no durations change (a task waits for the tasks its
    deps name and its cross-stage data, never for a time): coarse_timing replays it with durations, so a caller
    that prices one schedule shape with many durations walks it once (coarse_order).

    steps[i]: (stage, position in the stage's program, task kind, the earlier steps whose ends it waits for).
    """

    steps: tuple[tuple[int, int, str, tuple[int, ...]], ...]
    blocked: tuple[str, ...]
    lengths: tuple[int, ...]  # tasks per stage program


def coarse_order(programs: Programs, *, vpp: int | None = None, layout: Layout = Layout.INTERLEAVED) -> CoarseOrder:
    """The event-driven walk of coarse programs, one blocking program counter per stage.

    Cross-stage data deps are implicit: F of virtual stage v needs F of the virtual stage before it in
    its pipeline (same microbatch), B (or backward_input) of v needs B of the one after it; a
    pipeline's last virtual stage's B needs only its own F. Never raises on deadlock: stuck stages get
    a `blocked` reason.
    """
    pp = len(programs)
    vpp = vpp or 1 + max((t.chunk for p in programs for t in p), default=0)
    stages = VirtualStages(layout, pp, vpp)
    board = _Board[int]()  # key -> the step that finished it first
    steps: list[tuple[int, int, str, tuple[int, ...]]] = []
    pc = [0] * pp
    waiting: list[tuple[str, tuple] | None] = [None] * pp  # a stuck stage's task and the key it waits for
    ready = deque(range(pp))
    neighbours: dict[tuple, tuple | None] = {}  # (stage, chunk, kind) -> the neighbour's (class, stage, chunk)
    done = board.done
    while ready:
        stage = ready.popleft()
        program = programs[stage]
        while pc[stage] < len(program):
            task = program[pc[stage]]
            needs = [("id", stage, dep) for dep in task.deps]
            where = (stage, task.chunk, task.kind)
            if where not in neighbours:
                cross = _cross_key(task, stage, stages)
                neighbours[where] = None if cross is None else cross[:3]
            if (other := neighbours[where]) is not None:
                needs.append((*other, task.microbatch))
            missing = board.first_missing(needs)
            if missing is not None:
                board.waiters[missing].append(stage)
                waiting[stage] = (task.task_id, missing)
                break
            step = len(steps)
            steps.append((stage, pc[stage], task.kind, tuple(done[k] for k in needs)))
            pc[stage], waiting[stage] = pc[stage] + 1, None
            ready.extend(board.finish(("id", stage, task.task_id), step))
            ready.extend(board.finish((_CLASS.get(task.kind, task.kind), stage, task.chunk, task.microbatch), step))
    blocked = tuple("" if w is None else f"{w[0]} waits for {_describe(w[1])}" for w in waiting)
    return CoarseOrder(steps=tuple(steps), blocked=blocked, lengths=tuple(len(p) for p in programs))


def replay(order: CoarseOrder, durations: Durations = None) -> tuple[list[float], list[float]]:
    """(starts, ends) of the walk's steps: a step starts when its stage's previous task and the steps it waits for
    have ended."""
    times = {kind: duration(durations, kind) for kind in {kind for _, _, kind, _ in order.steps}}
    clock: list[float] = [0] * len(order.lengths)
    starts: list[float] = []
    ends: list[float] = []
    for stage, _, kind, needs in order.steps:
        start = max([clock[stage]] + [ends[i] for i in needs])
        clock[stage] = start + times[kind]
        starts.append(start)
        ends.append(clock[stage])
    return starts, ends


def coarse_timing(
    programs: Programs, *, vpp: int | None = None, durations: Durations = None, layout: Layout = Layout.INTERLEAVED
) -> Timing:
    """Dry run of coarse programs with durations (coarse_order's walk, replayed)."""
    order = coarse_order(programs, vpp=vpp, layout=layout)
    starts: list[list] = [[None] * n for n in order.lengths]
    ends: list[list] = [[None] * n for n in order.lengths]
    for (stage, position, _, _), start, end in zip(order.steps, *replay(order, durations), strict=True):
        starts[stage][position], ends[stage][position] = start, end
    return Timing(
        starts=_freeze(starts),
        ends=_freeze(ends),
        blocked=order.blocked,
        row_labels=tuple(f"stage {p}" for p in range(len(order.lengths))),
    )


def _freeze(rows: list[list]) -> tuple[tuple, ...]:
    return tuple(tuple(row) for row in rows)


class _LoweredRun:
    """Event-driven execution of the contract over all ranks of a lowered schedule."""

    def __init__(self, schedule: Schedule, durations: Durations) -> None:
        self.mesh, self.durations = schedule.mesh, durations
        self.programs = [schedule.program(rank) for rank in range(self.mesh.num_ranks)]
        num_ranks = len(self.programs)
        self.starts: list[list[float | None]] = [[None] * len(p) for p in self.programs]
        self.ends: list[list[float | None]] = [[None] * len(p) for p in self.programs]
        self.pc: list[int] = [0] * num_ranks
        self.clock: list[float] = [0] * num_ranks
        self.blocked, self.arrived = [""] * num_ranks, [False] * num_ranks
        self.board = _Board[float]()
        self.p2p: dict[tuple, deque] = defaultdict(deque)
        self.collectives: dict[tuple, list] = defaultdict(list)
        self.queue: deque[tuple] = deque(("rank", rank) for rank in range(num_ranks))

    def run(self) -> Timing:
        while self.queue:
            item = self.queue.popleft()
            if item[0] == "rank":
                self._step(item[1])
            else:
                self._issue(*item[1:])
        for rank, row in enumerate(self.ends):
            index = next((i for i, end in enumerate(row) if end is None), None)
            if index is None:
                self.blocked[rank] = ""
            elif not self.blocked[rank] or self.pc[rank] >= len(row):
                task = self.programs[rank][index]
                self.blocked[rank] = f"{task.task_id} ({task.kind}) never completed"
        return Timing(
            starts=_freeze(self.starts),
            ends=_freeze(self.ends),
            blocked=tuple(self.blocked),
            row_labels=tuple(f"rank {r}" for r in range(len(self.programs))),
        )

    def _deps_ready(self, rank: int, task: Task, waiter: tuple) -> float | None:
        """Time when all deps are done, or None after registering `waiter` on a missing one."""
        keys = [(rank, dep) for dep in task.deps]
        missing = self.board.first_missing(keys)
        if missing is not None:
            self.board.waiters[missing].append(waiter)
            self.blocked[rank] = f"{task.task_id} waits for {missing[1]}"
            return None
        return max((self.board.done[k] for k in keys), default=0)

    def _step(self, rank: int) -> None:
        program = self.programs[rank]
        while self.pc[rank] < len(program) and not self.arrived[rank]:
            index, task = self.pc[rank], program[self.pc[rank]]
            if task.kind in P2P_KINDS:
                self.queue.append(("issue", rank, index, self.clock[rank]))
                self.pc[rank] += 1
                continue
            deps_at = self._deps_ready(rank, task, ("rank", rank))
            if deps_at is None:
                return
            at = max(self.clock[rank], deps_at)
            if task.is_collective:
                self._arrive(rank, index, at)
                continue
            end = at + duration(self.durations, task.kind)
            self._finish(rank, index, at, end)
            self.pc[rank], self.clock[rank], self.blocked[rank] = index + 1, end, ""

    def _arrive(self, rank: int, index: int, at: float) -> None:
        task = self.programs[rank][index]
        self.arrived[rank] = True
        self.blocked[rank] = f"{task.task_id} ({task.kind}) waits for its {task.group_axis!r} group"
        try:
            group = self.mesh.group(rank, task.group_axis)
        except ValueError:
            return
        arrivals = self.collectives[(group, task.task_id)]
        arrivals.append((rank, index, at))
        if len(arrivals) < len(group):
            return
        start = max(a[2] for a in arrivals)
        end = start + duration(self.durations, task.kind)
        del self.collectives[(group, task.task_id)]
        for member, member_index, _ in arrivals:
            self._finish(member, member_index, start, end)
            self.pc[member], self.clock[member] = member_index + 1, end
            self.arrived[member], self.blocked[member] = False, ""
            if member != rank:
                self.queue.append(("rank", member))

    def _issue(self, rank: int, index: int, pc_at: float) -> None:
        task = self.programs[rank][index]
        deps_at = self._deps_ready(rank, task, ("issue", rank, index, pc_at))
        if deps_at is None or not 0 <= task.peer_stage < self.mesh.pp:
            return
        at = max(pc_at, deps_at)
        peer = self.mesh.peer(rank, task.peer_stage)
        link = (rank, peer, task.tag) if task.kind == TaskKind.SEND else (peer, rank, task.tag)
        other = self.p2p[(link, TaskKind.RECV if task.kind == TaskKind.SEND else TaskKind.SEND)]
        if not other:
            self.p2p[(link, task.kind)].append((rank, index, at))
            return
        peer_rank, peer_index, peer_at = other.popleft()
        start = max(at, peer_at)
        end = start + max(duration(self.durations, TaskKind.SEND), duration(self.durations, TaskKind.RECV))
        self._finish(rank, index, start, end)
        self._finish(peer_rank, peer_index, start, end)

    def _finish(self, rank: int, index: int, start: float, end: float) -> None:
        self.starts[rank][index], self.ends[rank][index] = start, end
        self.queue.extend(self.board.finish((rank, self.programs[rank][index].task_id), end))


def lowered_timing(schedule: Schedule, durations: Durations = None) -> Timing:
    """Run a lowered schedule on every rank of its mesh (rows are ranks); never raises on deadlock.

    Compute and collective tasks block the program counter; send/recv are issued asynchronously
    and a pair (matched by the two ranks and the tag, first issued first matched) completes when
    both sides are issued; a collective starts when its whole group (Mesh.group) reached it.
    """
    return _LoweredRun(schedule, durations).run()
