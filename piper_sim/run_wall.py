"""The wall time a simulate run takes on this machine: estimated before it starts from what drives it, said, and
refused beyond a limit the user can raise (`simulate --max-wall-minutes`, DEFAULT_MAX_WALL_MINUTES by default).

The estimate is a sum of measured per-unit costs (docs/performance.md, "Wall time", gives the figures and how they
were measured): every rank task (its lane's event, its member's clock, its records, its trace row), and under skewed
routing every EP group's all-to-all per member (the routed rows sampled, the dispatch, a timeline of its own). It is
a guide, not a bound: contended networks (many flow sets sharing links, each end a solve of their component) and runs
whose lanes fall back to one per rank take longer, and a run past its estimate goes on (its progress line shows the
estimate). Pure arithmetic over the lowered schedule; imports nothing that runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from piper_sim.errors import ConfigError
from piper_sim.schedule.ir import Schedule
from piper_sim.workload.task_kinds import TaskKind

# measured with the simulator on 2 shared cores (docs/performance.md, "Wall time"):
RANK_TASK_S = 9e-6  # a rank task under uniform routing: 5.9-11.9 us (small-moe DP 256 uniform, Frontier; DP 1,024)
# a skewed all-to-all, per member, beyond its tasks: 44-84 us (bench_sim.py's W2Z and W1Z, 8-rank groups; small-moe
# DP 64 under zipf routing, 4-rank groups)
SKEWED_ALL_TO_ALL_S_PER_MEMBER = 80e-6
DEFAULT_MAX_WALL_MINUTES = 30.0  # a run expected to take longer is refused unless --max-wall-minutes says more
MAX_WALL_FLAG = "--max-wall-minutes"


@dataclass(frozen=True)
class RunWork:
    """What drives a run's wall time: its rank tasks over all steps, and the members of its skewed all-to-alls
    (0 under uniform routing: one lane per stage, and an all-to-all's matrix is shared by its groups)."""

    rank_tasks: int
    skewed_all_to_all_members: int

    @property
    def wall_s(self) -> float:
        """The expected wall time of the run (the event loop, the trace and the report), in seconds."""
        return self.rank_tasks * RANK_TASK_S + self.skewed_all_to_all_members * SKEWED_ALL_TO_ALL_S_PER_MEMBER

    def text(self) -> str:
        """'about 4 min (2,383,872 rank tasks)': the estimate and what drives it."""
        skewed = (
            f", {self.skewed_all_to_all_members:,} all-to-all members under skewed routing"
            if self.skewed_all_to_all_members
            else ""
        )
        return f"about {duration_text(self.wall_s)} ({self.rank_tasks:,} rank tasks{skewed})"


def run_work(schedule: Schedule, steps: int, skewed: bool) -> RunWork:
    """The work of simulating `steps` steps of the schedule; skewed: routing other than uniform."""
    per_stage = schedule.mesh.num_ranks // schedule.mesh.pp
    tasks = sum(len(program) for program in schedule.stage_programs)
    all_to_alls = sum(task.kind == TaskKind.ALL_TO_ALL for program in schedule.stage_programs for task in program)
    return RunWork(
        rank_tasks=steps * per_stage * tasks, skewed_all_to_all_members=steps * per_stage * all_to_alls if skewed else 0
    )


def duration_text(seconds: float) -> str:
    """'40 s', '12 min', '3.5 h'."""
    if seconds < 90:
        return f"{max(seconds, 1):.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:,.1f} h"


def check_run_wall(work: RunWork, max_wall_minutes: float | None) -> None:
    """Refuse a run expected to take longer than max_wall_minutes (None: no limit), naming the flag that raises the
    limit and what to lower."""
    if max_wall_minutes is None or work.wall_s <= max_wall_minutes * 60:
        return
    raise ConfigError(
        MAX_WALL_FLAG,
        max_wall_minutes,
        f"at least {work.wall_s / 60:,.0f} minutes for this run, expected to take {work.text()} on this "
        "machine (docs/performance.md, Wall time); or fewer micro-batches, steps, layers or GPUs, or "
        "--tier estimate (the analytic estimator: seconds at any scale)",
    )
