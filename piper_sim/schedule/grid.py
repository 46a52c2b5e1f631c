"""Text grid of a schedule: one row per pipeline stage (or rank), one column per compute time unit.

Owns the rank x step picture used by `piper-sim schedule show` and by every ScheduleError. Cells
are "F3" / "B3" / "W3" (forward, backward or backward_input, backward_weight of microbatch 3),
"F3.1" for chunk 1 when a schedule has several chunks, "O" for the optimizer; "." is a bubble.
Positions come from a dry run (unit-time tasks unless durations are given; a task of duration d
fills d columns, times are rounded to whole columns). Communication tasks take no column.
Must not import simpy, torch or numpy.
"""

from __future__ import annotations

from collections.abc import Sequence

from piper_sim.schedule.dryrun import Durations, Timing, coarse_timing, lowered_timing
from piper_sim.schedule.ir import Layout, Schedule, Task
from piper_sim.workload.task_kinds import TaskKind

LETTERS = {
    TaskKind.FORWARD: "F",
    TaskKind.FORWARD_EXPERT: "F",
    TaskKind.BACKWARD: "B",
    TaskKind.BACKWARD_INPUT: "B",
    TaskKind.BACKWARD_EXPERT: "B",
    TaskKind.BACKWARD_EXPERT_INPUT: "B",
    TaskKind.BACKWARD_WEIGHT: "W",
    TaskKind.OPTIMIZER: "O",
}
BUBBLE = "."
ELLIPSIS = "..."


def cell_label(task: Task, show_chunk: bool) -> str:
    """ "F3", "B3.1" (chunk 1), "W3", or the bare letter for a task without microbatch."""
    label = LETTERS.get(task.kind, task.kind[:1].upper())
    if task.microbatch >= 0:
        label += str(task.microbatch)
        if show_chunk and task.chunk >= 0:
            label += f".{task.chunk}"
    return label


def _row_cells(program: Sequence[Task], starts: Sequence, ends: Sequence, show_chunk: bool) -> dict[int, str]:
    cells: dict[int, str] = {}
    for task, start, end in zip(program, starts, ends, strict=True):
        if start is None or end is None or not task.is_compute:
            continue
        first = round(start)
        for column in range(first, max(round(end), first + 1)):
            cells[column] = cell_label(task, show_chunk)
    return cells


def render_timing(
    programs: Sequence[Sequence[Task]],
    timing: Timing,
    *,
    max_width: int = 120,
    rows: Sequence[int] | None = None,
    labels: Sequence[str] | None = None,
) -> str:
    """Render the rows of a dry-run timing; rows that could not finish get a "stuck" line below.

    programs[row] is the program of timing row `row`; `rows` selects and orders the rows shown,
    `labels` overrides timing.row_labels. Lines longer than max_width are cut at a cell and end in
    "...".
    """
    rows = list(range(len(programs))) if rows is None else list(rows)
    labels = list(timing.row_labels) if labels is None else list(labels)
    show_chunk = any(t.chunk > 0 for row in rows for t in programs[row])
    cells = {row: _row_cells(programs[row], timing.starts[row], timing.ends[row], show_chunk) for row in rows}
    num_columns = 1 + max((c for row_cells in cells.values() for c in row_cells), default=-1)
    width = max((len(label) for row_cells in cells.values() for label in row_cells.values()), default=1)
    label_width = max((len(labels[row]) for row in rows), default=0)
    shown = num_columns
    if grid_width(num_columns, width, label_width) > max_width:
        shown = max(1, (max_width - label_width - 3 - len(ELLIPSIS)) // (width + 1))
    lines = []
    for row in rows:
        text = " ".join(cells[row].get(c, BUBBLE).ljust(width) for c in range(shown))
        text = text + " " + ELLIPSIS if shown < num_columns else text
        lines.append(f"{labels[row]:<{label_width}} | {text}".rstrip())
    lines += [f"{labels[row]} stuck: {timing.blocked[row]}" for row in rows if timing.blocked[row]]
    return "\n".join(lines)


def render_grid(
    programs: Sequence[Sequence[Task]] | Schedule,
    *,
    max_width: int = 120,
    durations: Durations = None,
    vpp: int | None = None,
) -> str:
    """Grid of coarse stage programs (interleaved layout), or of a Schedule (coarse, or lowered: first rank
    of each stage; its layout).

    Bubbles come from the dry run with unit-time tasks unless `durations` (kind -> time) is given.
    """
    if isinstance(programs, Schedule) and programs.lowered:
        schedule = programs
        timing = lowered_timing(schedule, durations)
        rows = [schedule.mesh.stage_ranks(p)[0] for p in range(schedule.pp)]
        rank_programs = [schedule.program(rank) for rank in range(schedule.mesh.num_ranks)]
        labels = [f"stage {schedule.mesh.stage_of(r)}" for r in range(schedule.mesh.num_ranks)]
        return render_timing(rank_programs, timing, max_width=max_width, rows=rows, labels=labels)
    layout = Layout.INTERLEAVED
    if isinstance(programs, Schedule):
        vpp, layout, programs = programs.vpp, programs.layout, programs.stage_programs
    timing = coarse_timing(programs, vpp=vpp, durations=durations, layout=layout)
    return render_timing(programs, timing, max_width=max_width)


def grid_width(num_columns: int, cell_width: int, label_width: int) -> int:
    """Characters of one untruncated grid line."""
    return label_width + 3 + max(0, num_columns * (cell_width + 1) - 1)
