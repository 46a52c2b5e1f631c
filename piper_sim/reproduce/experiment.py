"""What one experiment of `piper-sim reproduce` is: its points, and the report section made from their results.

Owns Experiment (name, title, points(quick) -> payloads, section(results, out) -> Section; the paper's claim of an
experiment is in reproduce/claims.yaml under its name), Section (a table, a plot, what the simulator predicts, the
mechanism behind it, the figures a claim is checked on) and figure (a plot saved under DIR/figures). Imports no
torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd


@dataclass(frozen=True, kw_only=True)
class Section:
    table: pd.DataFrame
    plot: str  # path relative to the report
    prediction: str  # the simulator's figures beside the claim, from this run
    mechanism: str  # why: the links, memory or compute terms behind the figures
    notes: str = ""  # what each point used (plans, machine sizes)
    figures: dict[str, tuple[float, float]] = field(default_factory=dict)  # name -> predicted (min, max)
    versus_paper: str = ""  # the mechanism behind a prediction outside the paper's claim, where it is


@dataclass(frozen=True, kw_only=True)
class Experiment:
    name: str
    title: str
    points: Callable[[bool], list[dict]]
    section: Callable[[list[tuple[dict, dict]], Path], Section]


def figure(out: Path, name: str, draw: Callable) -> str:
    """Draw on a fresh axes and save DIR/figures/NAME.png; the path relative to DIR."""
    import matplotlib  # matplotlib: heavy; only when an experiment's figure is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # once the backend is Agg (no display)

    fig, ax = plt.subplots(figsize=(7, 4.2))
    draw(ax)
    fig.tight_layout()
    (out / "figures").mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "figures" / f"{name}.png", dpi=120)
    plt.close(fig)
    return f"figures/{name}.png"
