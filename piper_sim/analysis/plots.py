"""PNG plots: a per-rank timeline (Gantt) and per-link utilization. matplotlib, Agg backend."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from piper_sim.analysis.style import color, legend_outside, seconds_scale, title  # noqa: E402
from piper_sim.workload.task_kinds import P2P_KINDS, TaskKind  # noqa: E402

MAX_TIMELINE_RANKS = 64


def plot_timeline(df: pd.DataFrame, path: Path, what: str = "", context_line: str = "", track: str = "rank") -> None:
    """timeline_figure saved to path."""
    fig = timeline_figure(df, what, context_line, track)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def timeline_figure(df: pd.DataFrame, what: str = "", context_line: str = "", track: str = "rank") -> plt.Figure:
    """One row per rank (compute and collectives; p2p as thin bars below), or per pipeline stage where track is
    "stage" (df's rows: each task's envelope over the stage's ranks, trace/tracks.py), first step only; every task
    kind in its own colour (analysis/style.py) and in the legend; time in the unit its range reads in (us, ms or s)."""
    df = df[df["step"] == df["step"].min()]
    ranks = sorted(df[track].unique().tolist())
    if len(ranks) > MAX_TIMELINE_RANKS:  # show evenly spaced ranks
        ranks = ranks[:: max(1, len(ranks) // MAX_TIMELINE_RANKS)]
    unit, factor = seconds_scale(float(df["end_s"].max()) if len(df) else 0.0)
    fig, ax = plt.subplots(figsize=(14, max(3.0, 0.35 * len(ranks) + 1.5)))
    for y, rank in enumerate(ranks):
        rows = df[df[track] == rank]
        for kind, group in rows.groupby("kind", observed=True):
            bars = list(zip(group["start_s"] * factor, (group["end_s"] - group["start_s"]) * factor, strict=True))
            thin = kind in P2P_KINDS  # p2p as thin bars
            ax.broken_barh(
                bars,
                (y + (0.3 if thin else -0.4), 0.1 if thin else 0.7),
                facecolors=color("kind", kind),
                label=str(kind),
            )
    ax.set_yticks(range(len(ranks)), [f"r{r}" if track == "rank" else f"s{r}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel(f"time ({unit})")
    ax.set_ylabel(f"{'rank' if track == 'rank' else 'stage (its ranks)'} (step 0; p2p as thin bars)")
    title(ax, what or "timeline", context_line)
    labels = timeline_kinds(df)
    legend_outside(ax, [plt.Rectangle((0, 0), 1, 1, color=color("kind", k)) for k in labels], labels)
    fig.tight_layout()
    return fig


def timeline_kinds(df: pd.DataFrame) -> list[str]:
    """The task kinds a trace holds, in the schedule IR's order (kinds it does not name after, by name)."""
    present = {str(k) for k in df["kind"].unique()}
    known = [k.value for k in TaskKind if k.value in present]
    return known + sorted(present - set(known))


def plot_link_utilization(links: pd.DataFrame, path: Path, top: int = 40, context_line: str = "") -> None:
    """Bar chart of the busiest links' mean utilization in percent (as the terminal summary gives it), colored by
    link kind."""
    busiest = links.sort_values("utilization", ascending=False).head(top)
    fig, ax = plt.subplots(figsize=(12, 4 + 0.1 * len(busiest)))
    kinds = sorted(busiest["link_kind"].unique())
    ax.barh(
        np.arange(len(busiest)), busiest["utilization"] * 100, color=[color("link", k) for k in busiest["link_kind"]]
    )
    ax.set_yticks(np.arange(len(busiest)), busiest["link"], fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("mean utilization over the run (%: bytes / (capacity x time))")
    ax.set_ylabel("link (direction src->dst)")
    title(ax, f"busiest {len(busiest)} of {len(links)} links", context_line)
    ax.legend(
        [plt.Rectangle((0, 0), 1, 1, color=color("link", k)) for k in kinds], kinds, fontsize=7, loc="lower right"
    )  # the shortest bars are at the bottom
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
