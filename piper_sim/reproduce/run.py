"""`piper-sim reproduce`: the Piper paper's experiments run on the simulator, and DIR/report.md written from them.

Owns EXPERIMENTS (network.py, training.py), reproduce() and the report's Markdown. Every point is stored by the
digest of its payload under DIR/points as it finishes (planning.store), so an interrupted run resumes without
recomputing a finished point; the points of all the chosen experiments run together, in this process or on
Dask (planning.engine). Every number of the report comes from this run's points. Must not import torch.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pandas as pd

from piper_sim.errors import ConfigError
from piper_sim.planning.engine import run_points
from piper_sim.planning.store import ResultStore, point_digest
from piper_sim.reproduce import network, training
from piper_sim.reproduce.experiment import Experiment, Section
from piper_sim.reproduce.work import run_point

EXPERIMENTS: dict[str, Experiment] = {e.name: e for e in network.EXPERIMENTS + training.EXPERIMENTS}


def reproduce(names: list[str], out: Path, *, quick: bool, scheduler: str | None = None, workers: int | None = None,
              progress: bool = True) -> Path:
    """Run the named experiments (all when empty) and write DIR/report.md; returns its path."""
    chosen = names or list(EXPERIMENTS)
    for name in chosen:
        if name not in EXPERIMENTS:
            raise ConfigError("EXPERIMENT", name, f"one of {', '.join(EXPERIMENTS)}")
    t0 = time.perf_counter()
    planned: dict[str, list[tuple[str, dict]]] = {}
    for name in chosen:
        planned[name] = []
        for payload in EXPERIMENTS[name].points(quick):
            digest = point_digest(payload)
            if payload["kind"] == "plan":  # the planner's own store for this point
                payload = {**payload, "out": str(out / "plans" / digest)}
            planned[name].append((digest, payload))
    everything = [point for points in planned.values() for point in points]
    results = run_points(run_point, everything, ResultStore(out), scheduler=scheduler, workers=workers,
                         label="reproduce", progress=progress)
    sections = {name: EXPERIMENTS[name].section([(p, results[d]) for d, p in points], out)
                for name, points in planned.items()}
    wall = {name: sum(results[d].get("wall_s", 0.0) for d, _ in points) for name, points in planned.items()}
    path = out / "report.md"
    path.write_text(_report(chosen, sections, wall, quick=quick, total_s=time.perf_counter() - t0))
    if progress:
        print(f"reproduce: wrote {path}", file=sys.stderr)
    return path


def _report(names: list[str], sections: dict[str, Section], wall: dict[str, float], *, quick: bool,
            total_s: float) -> str:
    mode = "--quick" if quick else "full"
    lines = ["# The Piper paper's experiments on piper-sim", "",
             f"Written by `piper-sim reproduce {' '.join(names)}{' --quick' if quick else ''}` ({mode} set). Every "
             "figure below comes from this run's points (stored under points/); nothing is tuned to the paper's "
             "results. Claims are the paper's as DESIGN.md states them (Dash and Wang 2026).", "",
             f"Wall time of this invocation: {total_s:.0f} s (points reused from an earlier run cost nothing).", ""]
    for name in names:
        experiment, section = EXPERIMENTS[name], sections[name]
        lines += [f"## {name}: {experiment.title}", ""]
        lines += [f"- **Paper's claim**: {experiment.claim or 'none stated in DESIGN.md.'}",
                  f"- **This run predicts**: {section.prediction}",
                  f"- **Mechanism**: {section.mechanism}"]
        if section.notes:
            lines.append(f"- **Points**: {section.notes}")
        lines += [f"- Computing its points took {wall[name]:.0f} s.", "", markdown_table(section.table), "",
                  f"![{name}]({section.plot})", ""]
    return "\n".join(lines)


def markdown_table(table: pd.DataFrame) -> str:
    """A DataFrame as a Markdown table, floats to 4 significant digits."""
    def cell(value: object) -> str:
        if isinstance(value, float):
            return "" if value != value else f"{value:.4g}"
        return str(value).replace("|", "/")

    header = "| " + " | ".join(map(str, table.columns)) + " |"
    rule = "|" + "|".join("---" for _ in table.columns) + "|"
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join([header, rule, *body])
