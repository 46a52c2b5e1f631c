"""RunResult: what either backend returns for one config (simulate.simulate and measure.measure).

Owns the record only; the report is analysis.run_report's, the files outputs.py's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from piper_sim.analysis.run_report import Report
from piper_sim.analysis.style import context
from piper_sim.analysis.task_arrays import TaskArrays
from piper_sim.config import Config
from piper_sim.schedule.ir import Schedule
from piper_sim.topology.graph import Topology


@dataclass(frozen=True, kw_only=True)
class RunResult:
    backend: str  # "sim" or "torch"
    config: Config
    schedule: Schedule  # the lowered schedule the backend ran
    report: Report
    # the RunTrace (`trace`: one row per executed task, piper_sim.trace.runtrace): a measured run's frame, or the
    # simulator's arrays, whose frame is built on the first ask (a report, the planner and validation need none)
    tasks: pd.DataFrame | TaskArrays
    steps: pd.DataFrame  # one row per step: step, step_time_s (and loss, on a measured run)
    topology: Topology | None = None
    placement: tuple[str, ...] = ()  # device of each rank
    links: pd.DataFrame | None = None  # per link that carried traffic (simulator): bytes, utilization
    stats: dict = field(default_factory=dict)  # the simulator's own counters (tasks, flows, lanes, phase times)

    @property
    def trace(self) -> pd.DataFrame:
        """The RunTrace frame."""
        return self.tasks if isinstance(self.tasks, pd.DataFrame) else self.tasks.frame

    @property
    def title(self) -> str:
        """The plan in words: schedule and mesh."""
        par = self.config.parallel
        return f"{self.config.schedule} pp{par.pp} ep{par.ep} dp{par.dp}" + (f" tp{par.tp}" if par.tp > 1 else "")

    @property
    def context(self) -> str:
        """The context line of its plots' titles: model, machine, tier (analysis/style.py)."""
        cfg = self.config
        name = self.topology.name if self.topology is not None else "this machine"
        return context(
            cfg.model.name, f"{name}, {cfg.parallel.num_gpus} GPUs", "des" if self.backend == "sim" else "measured"
        )


def steps_frame(report: Report) -> pd.DataFrame:
    """Per step records of a report: step time, and the loss where the run trained."""
    frame = pd.DataFrame({"step": range(report.num_steps), "step_time_s": report.step_times_s})
    if report.losses is not None:
        frame["loss"] = report.losses
    return frame
