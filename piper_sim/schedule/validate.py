"""Schedule validation and deadlock dry runs. Pure Python.

Owns ScheduleError, the structural checks of coarse and lowered schedules and the dry runs that
execute the execution contract of ir.py with given task durations (default: 1 per compute task,
0 per send, recv and collective). A dry run's result is the makespan in those units, i.e. the
number of unit compute steps (rounds) the step takes. Must not import simpy, torch or numpy.
"""

from __future__ import annotations

from collections import Counter, defaultdict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import product
from typing import NoReturn

from piper_sim.errors import PiperError
from piper_sim.schedule import ir
from piper_sim.schedule.grid import render_timing
from piper_sim.schedule.ir import Schedule, Task, coarse_task_id

KNOWN_KINDS = ir.COMPUTE_KINDS | ir.P2P_KINDS | ir.COLLECTIVE_KINDS
Programs = Sequence[Sequence[Task]]
Durations = Mapping[str, float] | None
_CLASS = {"forward": "F", "backward": "B", "backward_input": "B", "backward_weight": "W"}
_MAX_PROBLEMS = 20
_MAX_GRID_ROWS = 32


class ScheduleError(PiperError):
    """An invalid or deadlocking schedule; the message shows the rank x step grid."""


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
    return 1 if kind in ir.COMPUTE_KINDS else 0


class _Board:
    """Completion times by key and the waiters of keys not yet done."""

    def __init__(self) -> None:
        self.done: dict[tuple, float] = {}
        self.waiters: dict[tuple, list] = defaultdict(list)

    def first_missing(self, keys: Sequence[tuple]) -> tuple | None:
        return next((k for k in keys if k not in self.done), None)

    def finish(self, key: tuple, end: float) -> list:
        self.done.setdefault(key, end)
        return self.waiters.pop(key, [])


# ---------------------------------------------------------------- coarse dry run


def _cross_key(task: Task, stage: int, pp: int, num_virtual: int) -> tuple | None:
    """The task of the neighbouring virtual stage whose data `task` needs (implicit send/recv)."""
    virtual = task.chunk * pp + stage
    if task.kind == "forward" and virtual > 0:
        return ("F", (virtual - 1) % pp, (virtual - 1) // pp, task.microbatch)
    if task.kind in ("backward", "backward_input") and virtual < num_virtual - 1:
        return ("B", (virtual + 1) % pp, (virtual + 1) // pp, task.microbatch)
    return None


def _describe(key: tuple) -> str:
    if key[0] == "id":
        return f"{key[2]} (same stage)"
    return f"{key[0]}:c{key[2]}:m{key[3]} on stage {key[1]}"


def coarse_timing(programs: Programs, *, vpp: int | None = None, durations: Durations = None) -> Timing:
    """Event-driven run of coarse programs, one blocking program counter per stage.

    Cross-stage data deps are implicit: F of virtual stage v needs F of v - 1 (same microbatch), B
    (or backward_input) of v needs B of v + 1; the last virtual stage's B needs only its own F.
    Never raises on deadlock: stuck stages get a `blocked` reason.
    """
    pp = len(programs)
    vpp = vpp or 1 + max((t.chunk for p in programs for t in p), default=0)
    board = _Board()
    starts = [[None] * len(p) for p in programs]
    ends = [[None] * len(p) for p in programs]
    pc, clock, blocked = [0] * pp, [0] * pp, [""] * pp
    ready = deque(range(pp))
    while ready:
        stage = ready.popleft()
        program = programs[stage]
        while pc[stage] < len(program):
            task = program[pc[stage]]
            needs = [("id", stage, dep) for dep in task.deps]
            cross = _cross_key(task, stage, pp, pp * vpp)
            needs += [cross] if cross else []
            missing = board.first_missing(needs)
            if missing is not None:
                board.waiters[missing].append(stage)
                blocked[stage] = f"{task.task_id} waits for {_describe(missing)}"
                break
            start = max([clock[stage]] + [board.done[k] for k in needs])
            end = start + duration(durations, task.kind)
            starts[stage][pc[stage]], ends[stage][pc[stage]] = start, end
            pc[stage], clock[stage], blocked[stage] = pc[stage] + 1, end, ""
            ready.extend(board.finish(("id", stage, task.task_id), end))
            cls = _CLASS.get(task.kind, task.kind)
            ready.extend(board.finish((cls, stage, task.chunk, task.microbatch), end))
    return Timing(starts=_freeze(starts), ends=_freeze(ends), blocked=tuple(blocked),
                  row_labels=tuple(f"stage {p}" for p in range(pp)))


def _freeze(rows: list[list]) -> tuple[tuple, ...]:
    return tuple(tuple(row) for row in rows)


def dry_run_coarse(programs: Programs, pp: int, vpp: int, num_microbatches: int, *,
                   durations: Durations = None) -> float:
    """Check coarse programs (check_coarse), run them and return the makespan.

    With the default unit durations the makespan is the number of steps (rounds); pass e.g.
    {"forward": 1, "backward": 2} for the papers' units. Raises ScheduleError on deadlock.
    """
    check_coarse(programs, pp, vpp, num_microbatches)
    timing = coarse_timing(programs, vpp=vpp, durations=durations)
    if timing.deadlocked:
        grid = render_timing(programs, timing)
        raise ScheduleError(f"deadlock: {len(timing.stuck_rows())} of {pp} stages are stuck\n{grid}")
    return timing.makespan


def max_in_flight(program: Sequence[Task]) -> int:
    """Peak number of forwards on a stage whose backward (or backward_input) has not run yet."""
    peak = current = 0
    for task in program:
        if task.kind == "forward":
            current += 1
            peak = max(peak, current)
        elif task.kind in ("backward", "backward_input"):
            current -= 1
    return peak


# ---------------------------------------------------------------- structural checks


def _fail(title: str, problems: list[str], render: Callable[[], str]) -> NoReturn:
    try:
        grid = render()
    except Exception as error:  # an invalid schedule must still produce its error message
        grid = f"(grid unavailable: {error})"
    shown = problems[:_MAX_PROBLEMS]
    more = f"\n  ... and {len(problems) - len(shown)} more" if len(problems) > len(shown) else ""
    raise ScheduleError(f"{title}:\n  " + "\n  ".join(shown) + more + f"\n{grid}")


def _program_problems(where: str, program: Sequence[Task], kinds: frozenset[str]) -> list[str]:
    """Unique ids, known kinds, deps that exist and come earlier in program order."""
    problems, position = [], {}
    for index, task in enumerate(program):
        if task.task_id in position:
            problems.append(f"{where}: task id {task.task_id!r} appears twice")
        position.setdefault(task.task_id, index)
        if task.kind not in kinds:
            problems.append(f"{where}: {task.task_id} has kind {task.kind!r}; allowed: {sorted(kinds)}")
    for index, task in enumerate(program):
        for dep in task.deps:
            if dep not in position:
                problems.append(f"{where}: {task.task_id} depends on unknown task {dep!r}")
            elif position[dep] >= index:
                problems.append(f"{where}: {task.task_id} (step {index}) depends on {dep} "
                                f"which comes later (step {position[dep]})")
    return problems


def _coarse_stage_problems(stage: int, program: Sequence[Task], vpp: int, num_microbatches: int,
                           backward_kinds: tuple[str, ...]) -> list[str]:
    where = f"stage {stage}"
    problems = _program_problems(where, program, ir.COARSE_KINDS)
    for task in (t for t in program if t.kind in ir.COARSE_KINDS):  # other kinds: reported above
        if not (0 <= task.chunk < vpp and 0 <= task.microbatch < num_microbatches):
            problems.append(f"{where}: {task.task_id} has chunk {task.chunk}, microbatch "
                            f"{task.microbatch}; allowed: chunk < {vpp}, microbatch < {num_microbatches}")
        elif task.task_id != coarse_task_id(task.kind, task.chunk, task.microbatch):
            problems.append(f"{where}: task id {task.task_id!r} does not match its kind, chunk, microbatch")
    counts = Counter((t.kind, t.chunk, t.microbatch) for t in program)
    problems += [f"{where}: {coarse_task_id(*key)} ({key[0]}) appears {counts[key]} times; expected once"
                 for key in product(("forward", *backward_kinds), range(vpp), range(num_microbatches))
                 if counts[key] != 1]
    return problems


def check_coarse(programs: Programs, pp: int, vpp: int, num_microbatches: int) -> None:
    """Every (kind, chunk, microbatch) once per stage; deps exist and come earlier.

    A schedule uses either backward or backward_input + backward_weight, decided by whether any
    stage has a split backward. Raises ScheduleError with the grid.
    """
    if len(programs) != pp:
        raise ScheduleError(f"expected {pp} stage programs, got {len(programs)}")
    split = any(t.kind in ("backward_input", "backward_weight") for p in programs for t in p)
    backward_kinds = ("backward_input", "backward_weight") if split else ("backward",)
    problems = [problem for stage, program in enumerate(programs)
                for problem in _coarse_stage_problems(stage, program, vpp, num_microbatches, backward_kinds)]
    if problems:
        _fail("invalid coarse schedule", problems,
              lambda: render_timing(programs, coarse_timing(programs, vpp=vpp)))


def _p2p_problems(schedule: Schedule) -> list[str]:
    """Every send has exactly one recv on its peer stage with the same tag, and vice versa."""
    pp, problems = schedule.pp, []
    ends: Counter = Counter()
    for stage, program in enumerate(schedule.stage_programs):
        for task in program:
            if task.kind not in ir.P2P_KINDS:
                continue
            if not (0 <= task.peer_stage < pp) or task.peer_stage == stage:
                problems.append(f"stage {stage}: {task.task_id} has peer_stage {task.peer_stage}")
                continue
            src, dst = (stage, task.peer_stage) if task.kind == "send" else (task.peer_stage, stage)
            ends[(task.kind, src, dst, task.tag)] += 1
    for (kind, src, dst, tag), count in sorted(ends.items()):
        other = ends[("recv" if kind == "send" else "send", src, dst, tag)]
        if count != 1 or other != 1:
            problems.append(f"{kind} from stage {src} to stage {dst} tag {tag!r}: {count} {kind}(s), "
                            f"{other} matching; expected exactly one of each")
    return problems


def _collective_problems(schedule: Schedule) -> list[str]:
    return [f"stage {stage}: {task.task_id} has group_axis {task.group_axis!r}; allowed: {ir.GROUP_AXES}"
            for stage, program in enumerate(schedule.stage_programs) for task in program
            if task.is_collective and task.group_axis not in ir.GROUP_AXES]


def check_lowered(schedule: Schedule) -> None:
    """Lowered schedule: every task once per program, deps earlier in program order (hence acyclic),
    send/recv pairs match by peer stage and tag, collectives name a valid group axis."""
    if len(schedule.stage_programs) != schedule.pp:
        raise ScheduleError(f"expected {schedule.pp} stage programs, got {len(schedule.stage_programs)}")
    problems = [problem for stage, program in enumerate(schedule.stage_programs)
                for problem in _program_problems(f"stage {stage}", program, KNOWN_KINDS)]
    problems += _p2p_problems(schedule) + _collective_problems(schedule)
    if problems:
        _fail(f"invalid lowered schedule {schedule.name!r}", problems,
              lambda: _lowered_grid(schedule, lowered_timing(schedule)))


def check_schedule(schedule: Schedule) -> None:
    """check_lowered for a lowered schedule, check_coarse otherwise."""
    if schedule.lowered:
        check_lowered(schedule)
    else:
        check_coarse(schedule.stage_programs, schedule.pp, schedule.vpp, schedule.num_microbatches)


# ---------------------------------------------------------------- lowered dry run


class _LoweredRun:
    """Event-driven execution of the contract over all ranks of a lowered schedule."""

    def __init__(self, schedule: Schedule, durations: Durations) -> None:
        self.mesh, self.durations = schedule.mesh, durations
        self.programs = [schedule.program(rank) for rank in range(self.mesh.num_ranks)]
        num_ranks = len(self.programs)
        self.starts = [[None] * len(p) for p in self.programs]
        self.ends = [[None] * len(p) for p in self.programs]
        self.pc, self.clock = [0] * num_ranks, [0] * num_ranks
        self.blocked, self.arrived = [""] * num_ranks, [False] * num_ranks
        self.board = _Board()
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
        return Timing(starts=_freeze(self.starts), ends=_freeze(self.ends), blocked=tuple(self.blocked),
                      row_labels=tuple(f"rank {r}" for r in range(len(self.programs))))

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
            if task.kind in ir.P2P_KINDS:
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
            self._finish(rank, index, at, at + duration(self.durations, task.kind))
            self.pc[rank], self.clock[rank], self.blocked[rank] = index + 1, self.ends[rank][index], ""

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
        link = (rank, peer, task.tag) if task.kind == "send" else (peer, rank, task.tag)
        other = self.p2p[(link, "recv" if task.kind == "send" else "send")]
        if not other:
            self.p2p[(link, task.kind)].append((rank, index, at))
            return
        peer_rank, peer_index, peer_at = other.popleft()
        start = max(at, peer_at)
        end = start + max(duration(self.durations, "send"), duration(self.durations, "recv"))
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


def _lowered_grid(schedule: Schedule, timing: Timing) -> str:
    stuck = timing.stuck_rows()
    firsts = {schedule.mesh.stage_ranks(p)[0] for p in range(schedule.pp)}
    rows = sorted(firsts | set(stuck[:_MAX_GRID_ROWS]))[:_MAX_GRID_ROWS + schedule.pp]
    programs = [schedule.program(rank) for rank in range(schedule.mesh.num_ranks)]
    return render_timing(programs, timing, rows=rows)


def dry_run(schedule: Schedule, durations: Durations = None) -> float:
    """Execute the execution contract with zero-cost communication and return the makespan.

    With the default durations (1 per compute task, 0 per send, recv and collective) the result is
    the number of steps (rounds). A coarse (not lowered) schedule goes to dry_run_coarse. Raises
    ScheduleError naming where each stuck rank waits, with the grid, on deadlock.
    """
    if not schedule.lowered:
        return dry_run_coarse(schedule.stage_programs, schedule.pp, schedule.vpp,
                              schedule.num_microbatches, durations=durations)
    timing = lowered_timing(schedule, durations)
    if timing.deadlocked:
        stuck = timing.stuck_rows()
        raise ScheduleError(f"deadlock in schedule {schedule.name!r}: {len(stuck)} of "
                            f"{schedule.mesh.num_ranks} ranks are stuck\n{_lowered_grid(schedule, timing)}")
    return timing.makespan
