"""`piper-sim reproduce`: the Piper paper's experiments run on the simulator, and DIR/report.md written from them.

Owns EXPERIMENTS (network_experiments.py, training_experiments.py with throughput_experiments.py), reproduce() and
the report's Markdown. Every point is stored under DIR/points as it finishes (points.store), keyed by
points.keys.point_key (its payload, the files it reads, the code version), so an interrupted run resumes without
recomputing a finished point; the points of all the chosen experiments run together, in this process or on Dask
(points.dask_runner). Every number of the report comes from this run's points. Must not import torch.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pandas as pd

from piper_sim.analysis.band import Family, band_from, band_text, scored_families
from piper_sim.errors import ConfigError
from piper_sim.points.dask_runner import run_points
from piper_sim.points.keys import KeyedPoint, keyed_point
from piper_sim.points.store import ResultStore
from piper_sim.reproduce import network_experiments, training_experiments
from piper_sim.reproduce.claims import Claim, citation, load_claims, verdict
from piper_sim.reproduce.experiment import Experiment, Section
from piper_sim.reproduce.work import run_point

EXPERIMENTS: dict[str, Experiment] = {
    e.name: e for e in network_experiments.EXPERIMENTS + training_experiments.EXPERIMENTS
}


def reproduce(
    names: list[str],
    out: Path,
    *,
    quick: bool,
    scheduler: str | None = None,
    workers: int | None = None,
    progress: bool = True,
) -> Path:
    """Run the named experiments (all when empty) and write DIR/report.md; returns its path."""
    chosen = names or list(EXPERIMENTS)
    for name in chosen:
        if name not in EXPERIMENTS:
            raise ConfigError("EXPERIMENT", name, f"one of {', '.join(EXPERIMENTS)}")
    t0 = time.perf_counter()
    planned: dict[str, list[KeyedPoint]] = {}
    for name in chosen:
        planned[name] = []
        for payload in EXPERIMENTS[name].points(quick):
            point = keyed_point(payload)
            if payload["kind"] == "plan":  # the planner's own store for this point
                point = point._replace(payload={**payload, "out": str(out / "plans" / point.digest)})
            planned[name].append(point)
    everything = [point for points in planned.values() for point in points]
    results = run_points(
        run_point,
        everything,
        ResultStore(out),
        scheduler=scheduler,
        workers=workers,
        label="reproduce",
        progress=progress,
        priority=long_poles_first,
    )
    sections = {
        name: EXPERIMENTS[name].section([(p.payload, results[p.digest]) for p in points], out)
        for name, points in planned.items()
    }
    wall = {name: sum(results[p.digest].get("wall_s", 0.0) for p in points) for name, points in planned.items()}
    path = out / "report.md"
    path.write_text(_report(chosen, sections, wall, quick=quick, total_s=time.perf_counter() - t0))
    if progress:
        print(f"reproduce: wrote {path}", file=sys.stderr)
    return path


def long_poles_first(payload: dict) -> float:
    """A point's start priority (points.dask_runner.run_points): the planned points first, those on more GPUs and
    simulating more of their top plans before the others (a planned point's refinement simulates contended plans on
    hundreds of GCDs, minutes each; the other points take seconds), so the slowest do not start last."""
    if payload.get("kind") != "plan":
        return 0.0
    request = payload["request"]
    return float(request["num_gpus"]) * (1 + int(request.get("top_k", 0)))


def _report(
    names: list[str], sections: dict[str, Section], wall: dict[str, float], *, quick: bool, total_s: float
) -> str:
    mode = "--quick" if quick else "full"
    _, claims = load_claims()
    lines = [
        "# The Piper paper's experiments on piper-sim",
        "",
        f"Written by `piper-sim reproduce {' '.join(names)}{' --quick' if quick else ''}` ({mode} set). Every "
        "figure below comes from this run's points (stored under points/); nothing is tuned to the paper's "
        f"results. Claims are the paper's: {citation()}; each is checked on one figure of this run "
        "(piper_sim/reproduce/claims.yaml says where the paper makes it and how a worded claim is read).",
        "",
        f"Wall time of this invocation: {total_s:.0f} s (points reused from an earlier run cost nothing).",
        "",
        _how_sure(),
        "",
        *_verdict_table(names, sections, claims),
        "",
    ]
    for name in names:
        experiment, section = EXPERIMENTS[name], sections[name]
        lines += [f"## {name}: {experiment.title}", ""]
        lines += _claim_lines(claims.get(name), section)
        lines += [f"- **This run predicts**: {section.prediction}", f"- **Mechanism**: {section.mechanism}"]
        if section.notes:
            lines.append(f"- **Points**: {section.notes}")
        lines += [
            f"- Computing its points took {wall[name]:.0f} s.",
            "",
            markdown_table(section.table),
            "",
            f"![{name}]({section.plot})",
            "",
        ]
    return "\n".join(lines)


def _how_sure() -> str:
    """The error bands of the experiments' family (MoE on MI250X), from the published runs (analysis/band.py)."""
    bands = [band_from(Family("mi250x", True, ""), scored_families(tier), tier) for tier in ("des", "estimate")]
    said = "; ".join(band_text(b.to_dict()) for b in bands if b is not None)
    return (
        "How sure: every experiment predicts MoE training on Frontier's MI250X GCDs; the published runs of that "
        f"family give the expected error band {said}. A claim's verdict is only as firm as that band."
    )


def claim_verdicts(names: list[str], sections: dict[str, Section], claims: dict[str, Claim]) -> pd.DataFrame:
    """One row per experiment with a claim: the figure, the paper's range, this run's (min, max), the verdict."""
    rows = []
    for name in names:
        claim = claims.get(name)
        if claim is None:
            continue
        predicted = sections[name].figures.get(claim.figure, (float("nan"), float("nan")))
        rows.append(
            {
                "experiment": name,
                "figure": claim.figure,
                "paper": claim.range_text(),
                "this run": _span(predicted),
                "verdict": verdict(claim, predicted),
            }
        )
    return pd.DataFrame(rows, columns=["experiment", "figure", "paper", "this run", "verdict"])


def _verdict_table(names: list[str], sections: dict[str, Section], claims: dict[str, Claim]) -> list[str]:
    table = claim_verdicts(names, sections, claims)
    if table.empty:
        return []
    return ["## Against the paper", "", markdown_table(table), ""]


def _claim_lines(claim: Claim | None, section: Section) -> list[str]:
    if claim is None:
        return ["- **Paper's claim**: none; this experiment shows what the simulator predicts."]
    predicted = section.figures.get(claim.figure, (float("nan"), float("nan")))
    said = verdict(claim, predicted)
    lines = [
        f"- **Paper's claim** ({claim.where}): {claim.text}" + (f" Read as: {claim.reading}." if claim.reading else ""),
        f"- **Verdict**: {said} ({claim.figure}: this run {_span(predicted)}, the paper {claim.range_text()}).",
    ]
    if said != "agrees":
        lines.append(f"- **Why it differs**: {section.versus_paper or 'no mechanism named by this experiment.'}")
    return lines


def _span(values: tuple[float, float]) -> str:
    lo, hi = min(values), max(values)
    if lo != lo:
        return "not computed"
    return f"{lo:.3g}" if lo == hi else f"{lo:.3g} to {hi:.3g}"


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
