"""Schedule validation and deadlock checks. Pure Python.

Owns ScheduleError, the structural checks of coarse and lowered schedules, and the dry runs that fail
with the rank x step grid: dry_run and dry_run_coarse run the execution contract (dryrun.py's timings)
and return the makespan, i.e. the number of unit compute steps (rounds) the step takes with the default
durations. Must not import simpy, torch or numpy.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from itertools import product
from typing import NoReturn

from piper_sim.errors import PiperError
from piper_sim.schedule.dryrun import Durations, Programs, Timing, coarse_timing, lowered_timing
from piper_sim.schedule.grid import render_timing
from piper_sim.schedule.ir import Layout, Schedule, Task, VirtualStages, coarse_task_id
from piper_sim.workload.mesh import GROUP_AXES
from piper_sim.workload.task_kinds import COARSE_KINDS, COLLECTIVE_KINDS, COMPUTE_KINDS, P2P_KINDS, TaskKind

KNOWN_KINDS = COMPUTE_KINDS | P2P_KINDS | COLLECTIVE_KINDS
_MAX_PROBLEMS = 20
_MAX_GRID_ROWS = 32


class ScheduleError(PiperError):
    """An invalid or deadlocking schedule; the message shows the rank x step grid."""


def dry_run_coarse(
    programs: Programs,
    pp: int,
    vpp: int,
    num_microbatches: int,
    *,
    durations: Durations = None,
    layout: Layout = Layout.INTERLEAVED,
) -> float:
    """Check coarse programs (check_coarse), run them and return the makespan.

    With the default unit durations the makespan is the number of steps (rounds); pass e.g.
    {"forward": 1, "backward": 2} for the papers' units. layout: the schedule's (ir.Layout). Raises
    ScheduleError on deadlock.
    """
    check_coarse(programs, pp, vpp, num_microbatches, layout=layout)
    timing = coarse_timing(programs, vpp=vpp, durations=durations, layout=layout)
    if timing.deadlocked:
        grid = render_timing(programs, timing)
        raise ScheduleError(f"deadlock: {len(timing.stuck_rows())} of {pp} stages are stuck\n{grid}")
    return timing.makespan


def max_in_flight(program: Sequence[Task]) -> int:
    """Peak number of forwards on a stage whose backward (or backward_input) has not run yet."""
    peak = current = 0
    for task in program:
        if task.kind == TaskKind.FORWARD:
            current += 1
            peak = max(peak, current)
        elif task.kind in (TaskKind.BACKWARD, TaskKind.BACKWARD_INPUT):
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
    problems: list[str] = []
    position: dict[str, int] = {}
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
                problems.append(
                    f"{where}: {task.task_id} (step {index}) depends on {dep} which comes later (step {position[dep]})"
                )
    return problems


def _coarse_stage_problems(
    stage: int,
    program: Sequence[Task],
    stages: VirtualStages,
    num_microbatches: int,
    backward_kinds: tuple[TaskKind, ...],
) -> list[str]:
    vpp = stages.vpp
    where = f"stage {stage}"
    problems = _program_problems(where, program, COARSE_KINDS)
    for task in (t for t in program if t.kind in COARSE_KINDS):  # other kinds: reported above
        if not (0 <= task.chunk < vpp and 0 <= task.microbatch < num_microbatches):
            problems.append(
                f"{where}: {task.task_id} has chunk {task.chunk}, microbatch "
                f"{task.microbatch}; allowed: chunk < {vpp}, microbatch < {num_microbatches}"
            )
        elif task.task_id != coarse_task_id(task.kind, task.chunk, task.microbatch):
            problems.append(f"{where}: task id {task.task_id!r} does not match its kind, chunk, microbatch")
    counts = Counter((t.kind, t.chunk, t.microbatch) for t in program)
    problems += [
        f"{where}: {coarse_task_id(*key)} ({key[0]}) appears {counts[key]} times; expected once"
        for key in product((TaskKind.FORWARD, *backward_kinds), range(vpp), range(num_microbatches))
        if stages.runs(stage, key[1], key[2], num_microbatches) and counts[key] != 1
    ]
    problems += [
        f"{where}: {coarse_task_id(*key)} runs microbatch {key[2]} on a chunk of another pipeline"
        for key in counts
        if not stages.runs(stage, key[1], key[2], num_microbatches)
        and 0 <= key[1] < vpp
        and 0 <= key[2] < num_microbatches
    ]
    return problems


def check_coarse(
    programs: Programs, pp: int, vpp: int, num_microbatches: int, *, layout: Layout = Layout.INTERLEAVED
) -> None:
    """Every (kind, chunk, microbatch) once per stage (the chunks of the microbatch's pipeline, under a
    bidirectional layout); deps exist and come earlier.

    A schedule uses either backward or backward_input + backward_weight, decided by whether any
    stage has a split backward. Raises ScheduleError with the grid.
    """
    if len(programs) != pp:
        raise ScheduleError(f"expected {pp} stage programs, got {len(programs)}")
    split = any(t.kind in (TaskKind.BACKWARD_INPUT, TaskKind.BACKWARD_WEIGHT) for p in programs for t in p)
    backward_kinds = (TaskKind.BACKWARD_INPUT, TaskKind.BACKWARD_WEIGHT) if split else (TaskKind.BACKWARD,)
    stages = VirtualStages(layout, pp, vpp)
    problems = [
        problem
        for stage, program in enumerate(programs)
        for problem in _coarse_stage_problems(stage, program, stages, num_microbatches, backward_kinds)
    ]
    if problems:
        _fail(
            "invalid coarse schedule",
            problems,
            lambda: render_timing(programs, coarse_timing(programs, vpp=vpp, layout=layout)),
        )


def _p2p_problems(schedule: Schedule) -> list[str]:
    """Every send has exactly one recv on its peer stage with the same tag, and vice versa."""
    pp, problems = schedule.pp, []
    ends: Counter = Counter()
    for stage, program in enumerate(schedule.stage_programs):
        for task in program:
            if task.kind not in P2P_KINDS:
                continue
            if not (0 <= task.peer_stage < pp) or task.peer_stage == stage:
                problems.append(f"stage {stage}: {task.task_id} has peer_stage {task.peer_stage}")
                continue
            src, dst = (stage, task.peer_stage) if task.kind == TaskKind.SEND else (task.peer_stage, stage)
            ends[(task.kind, src, dst, task.tag)] += 1
    for (kind, src, dst, tag), count in sorted(ends.items()):
        other = ends[(TaskKind.RECV if kind == TaskKind.SEND else TaskKind.SEND, src, dst, tag)]
        if count != 1 or other != 1:
            problems.append(
                f"{kind} from stage {src} to stage {dst} tag {tag!r}: {count} {kind}(s), "
                f"{other} matching; expected exactly one of each"
            )
    return problems


def _collective_problems(schedule: Schedule) -> list[str]:
    return [
        f"stage {stage}: {task.task_id} has group_axis {task.group_axis!r}; allowed: {GROUP_AXES}"
        for stage, program in enumerate(schedule.stage_programs)
        for task in program
        if task.is_collective and task.group_axis not in GROUP_AXES
    ]


def check_lowered(schedule: Schedule) -> None:
    """Lowered schedule: every task once per program, deps earlier in program order (hence acyclic),
    send/recv pairs match by peer stage and tag, collectives name a valid group axis."""
    if len(schedule.stage_programs) != schedule.pp:
        raise ScheduleError(f"expected {schedule.pp} stage programs, got {len(schedule.stage_programs)}")
    problems = [
        problem
        for stage, program in enumerate(schedule.stage_programs)
        for problem in _program_problems(f"stage {stage}", program, KNOWN_KINDS)
    ]
    problems += _p2p_problems(schedule) + _collective_problems(schedule)
    if problems:
        _fail(
            f"invalid lowered schedule {schedule.name!r}",
            problems,
            lambda: _lowered_grid(schedule, lowered_timing(schedule)),
        )


def check_schedule(schedule: Schedule) -> None:
    """check_lowered for a lowered schedule, check_coarse otherwise."""
    if schedule.lowered:
        check_lowered(schedule)
    else:
        check_coarse(
            schedule.stage_programs, schedule.pp, schedule.vpp, schedule.num_microbatches, layout=schedule.layout
        )


def _lowered_grid(schedule: Schedule, timing: Timing) -> str:
    stuck = timing.stuck_rows()
    firsts = {schedule.mesh.stage_ranks(p)[0] for p in range(schedule.pp)}
    rows = sorted(firsts | set(stuck[:_MAX_GRID_ROWS]))[: _MAX_GRID_ROWS + schedule.pp]
    programs = [schedule.program(rank) for rank in range(schedule.mesh.num_ranks)]
    return render_timing(programs, timing, rows=rows)


def dry_run(schedule: Schedule, durations: Durations = None) -> float:
    """Execute the execution contract with zero-cost communication and return the makespan.

    With the default durations (1 per compute task, 0 per send, recv and collective) the result is
    the number of steps (rounds). A coarse (not lowered) schedule goes to dry_run_coarse. Raises
    ScheduleError naming where each stuck rank waits, with the grid, on deadlock.
    """
    if not schedule.lowered:
        return dry_run_coarse(
            schedule.stage_programs,
            schedule.pp,
            schedule.vpp,
            schedule.num_microbatches,
            durations=durations,
            layout=schedule.layout,
        )
    timing = lowered_timing(schedule, durations)
    if timing.deadlocked:
        stuck = timing.stuck_rows()
        raise ScheduleError(
            f"deadlock in schedule {schedule.name!r}: {len(stuck)} of "
            f"{schedule.mesh.num_ranks} ranks are stuck\n{_lowered_grid(schedule, timing)}"
        )
    return timing.makespan
