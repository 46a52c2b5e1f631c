"""PNG plots: a per-rank timeline (Gantt) and per-link utilization. matplotlib, Agg backend."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

KIND_COLOR = {
    "forward": "#4C72B0", "forward_expert": "#64B5CD", "backward": "#C44E52", "backward_expert": "#DD8452",
    "backward_input": "#C44E52", "backward_expert_input": "#DD8452", "backward_weight": "#8172B3",
    "optimizer": "#937860", "all_to_all": "#55A868", "all_reduce": "#CCB974", "send": "#8C8C8C",
    "recv": "#B0B0B0",
}
MAX_TIMELINE_RANKS = 64


def plot_timeline(df: pd.DataFrame, path: Path, title: str = "") -> None:
    """One row per rank (compute and collectives; p2p as thin bars below), first step only."""
    df = df[df["step"] == df["step"].min()]
    ranks = sorted(df["rank"].unique().tolist())
    if len(ranks) > MAX_TIMELINE_RANKS:  # show evenly spaced ranks
        ranks = ranks[:: max(1, len(ranks) // MAX_TIMELINE_RANKS)]
    height = max(3.0, 0.35 * len(ranks) + 1.5)
    fig, ax = plt.subplots(figsize=(14, height))
    for y, rank in enumerate(ranks):
        rows = df[df["rank"] == rank]
        for kind, group in rows.groupby("kind", observed=True):
            bars = list(zip(group["start_s"] * 1e3, (group["end_s"] - group["start_s"]) * 1e3, strict=True))
            thin = kind in ("send", "recv")
            ax.broken_barh(bars, (y + (0.3 if thin else -0.4), 0.1 if thin else 0.7),
                           facecolors=KIND_COLOR.get(str(kind), "black"))
    ax.set_yticks(range(len(ranks)), [f"r{r}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_ylabel("rank (step 0; p2p as thin bars)")
    ax.set_title(title or "timeline")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for k, c in KIND_COLOR.items() if k in set(df["kind"])]
    labels = [k for k in KIND_COLOR if k in set(df["kind"])]
    ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)  # beside the bars
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_link_utilization(links: pd.DataFrame, path: Path, top: int = 40) -> None:
    """Bar chart of the busiest links' mean utilization in percent (as the terminal summary gives it), colored by
    link kind."""
    busiest = links.sort_values("utilization", ascending=False).head(top)
    fig, ax = plt.subplots(figsize=(12, 4 + 0.1 * len(busiest)))
    kinds = sorted(busiest["link_kind"].unique())
    cmap = plt.get_cmap("tab10")
    colors = [cmap(kinds.index(k) % 10) for k in busiest["link_kind"]]
    ax.barh(np.arange(len(busiest)), busiest["utilization"] * 100, color=colors)
    ax.set_yticks(np.arange(len(busiest)), busiest["link"], fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("mean utilization over the run (%: bytes / (capacity x time))")
    ax.set_ylabel("link (direction src->dst)")
    ax.set_title(f"busiest {len(busiest)} of {len(links)} links")
    ax.legend([plt.Rectangle((0, 0), 1, 1, color=cmap(i % 10)) for i in range(len(kinds))], kinds, fontsize=7,
              loc="lower right")  # the shortest bars are at the bottom
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
