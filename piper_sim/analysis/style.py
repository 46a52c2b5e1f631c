"""The one style of piper-sim's plots: a fixed colour per name in each family (collective algorithm, migration
policy, task kind, link kind), so a name has the same colour in every plot; a context line under every title
(model, machine, tier); plain tick labels on log axes (0.9, 2, 50, not 9x10^-1); and the time unit of an axis
chosen by its range (the table rule of analysis/tables.py: us, ms or s).

Pure data and small helpers on matplotlib axes; no plot of its own. A name a family does not list gets a colour
from a fixed palette by a hash of the name, the same in every plot and every run.
"""

from __future__ import annotations

import math
import zlib
from pathlib import Path

import numpy as np
from matplotlib.ticker import Formatter, LogLocator, NullLocator

from piper_sim.analysis.tables import time_unit
from piper_sim.workload.task_kinds import TaskKind

# all-to-all and all-reduce algorithms (collectives/: the registries ALL_TO_ALL, ALL_REDUCE)
ALGORITHM_COLORS = {
    "flat": "#1f77b4",
    "halo": "#2ca02c",
    "rccl": "#ff7f0e",
    "nccl": "#d62728",
    "2dh": "#9467bd",
    "pairwise": "#8c564b",
    "bruck": "#e377c2",
    "ring": "#7f7f7f",
    "tree": "#bcbd22",
    "hierarchical": "#17becf",
    "deepep": "#aec7e8",
}
# migration policies (migration/policies.py: POLICIES)
POLICY_COLORS = {"none": "#555555", "greedy": "#e66100", "lpt": "#5d3a9b"}
# every TaskKind of the schedule IR: compute in blues (forward) and reds (backward), communication apart
KIND_COLORS = {
    TaskKind.FORWARD: "#4c72b0",
    TaskKind.FORWARD_EXPERT: "#64b5cd",
    TaskKind.RECOMPUTE: "#1f3a68",
    TaskKind.RECOMPUTE_EXPERT: "#2e7c8f",
    TaskKind.BACKWARD: "#c44e52",
    TaskKind.BACKWARD_EXPERT: "#dd8452",
    TaskKind.BACKWARD_INPUT: "#e8747a",
    TaskKind.BACKWARD_EXPERT_INPUT: "#f2b077",
    TaskKind.BACKWARD_WEIGHT: "#8172b3",
    TaskKind.OPTIMIZER: "#937860",
    TaskKind.ALL_TO_ALL: "#55a868",
    TaskKind.ALL_REDUCE: "#ccb974",
    TaskKind.REDUCE_SCATTER: "#b8860b",
    TaskKind.ALL_GATHER: "#da8bc3",
    TaskKind.SEND: "#8c8c8c",
    TaskKind.RECV: "#b0b0b0",
}
# link kinds of the topology builders (topology/build_*.py)
LINK_KIND_COLORS = {
    "xgmi": "#1b9e77",
    "nvlink": "#66a61e",
    "intra": "#a6761d",
    "cpu": "#7570b3",
    "gpu_nic": "#e7298a",
    "nic": "#d95f02",
    "local": "#e6ab02",
    "global": "#666666",
    "up": "#1f78b4",
    "down": "#a6cee3",
}
LINE_STYLES = ("-", "--", ":", "-.")  # a second dimension (message size, routing) where colour is the first
FAMILIES = {"algorithm": ALGORITHM_COLORS, "policy": POLICY_COLORS, "kind": KIND_COLORS, "link": LINK_KIND_COLORS}
FALLBACK = (
    "#393b79",
    "#637939",
    "#8c6d31",
    "#843c39",
    "#7b4173",
    "#3182bd",
    "#31a354",
    "#756bb1",
    "#636363",
    "#e6550d",
)
TIER_WORDS = {
    "des": "simulated (discrete-event)",
    "estimate": "estimated (the planner's analytic model)",
    "measured": "measured",
}
TIER_MARKERS = {"des": "o", "estimate": "^", "measured": "s"}


def color(family: str, name: object) -> str:
    """The colour of `name` in a family ("algorithm", "policy", "kind", "link"): its own, else a fixed one."""
    key = str(name)
    own = FAMILIES[family].get(key)
    return own if own is not None else FALLBACK[zlib.crc32(key.encode()) % len(FALLBACK)]


def context(model: str | None = None, machine: str | None = None, tier: str | None = None, *extra: str) -> str:
    """The context line of a title: model, machine, tier (its words), then anything else, joined by " | "."""
    parts = [model, machine, TIER_WORDS.get(tier, tier) if tier else None, *extra]
    return " | ".join(str(p) for p in parts if p)


def machine_label(topology: str | dict, gpus: int | None = None) -> str:
    """A topology spec's name (the preset, builder or file it names), with the GPUs of the job where given."""
    if isinstance(topology, dict):
        name = str(topology.get("preset") or topology.get("builder") or "custom topology")
    else:
        name = Path(topology).stem if str(topology).endswith((".yaml", ".yml")) else str(topology)
    return f"{name}, {gpus:,} GPUs" if gpus else name


def title(ax, what: str, line: str) -> None:
    """An axes title: what it shows, and the context line below it in a smaller size."""
    ax.set_title(f"{what}\n{line}" if line else what, fontsize=10)


def suptitle(fig, what: str, line: str) -> None:
    fig.suptitle(f"{what}\n{line}" if line else what, fontsize=11)


def plain_number(value: float) -> str:
    """A tick label in plain digits: 0.05, 0.9, 2, 50, 1,000 (no powers of ten)."""
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else ""
    if abs(value) >= 1:
        return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"
    digits = max(1, math.ceil(-math.log10(abs(value))))
    return f"{value:.{digits + 1}f}".rstrip("0").rstrip(".")


def plain_log_axis(axis) -> None:
    """A log axis (ax.xaxis or ax.yaxis) labelled in plain digits: every decade, and inside a range of under two
    decades also 2 and 5 of each (under one decade 2, 3 and 5; under 0.7 every minor tick), so a short range still
    reads."""
    axis.set_major_locator(LogLocator(base=10))
    axis.set_minor_locator(LogLocator(base=10, subs=tuple(range(2, 10))))
    axis.set_major_formatter(_PlainLog(minor=False))
    axis.set_minor_formatter(_PlainLog(minor=True))


def _minor_labelled(value: float, low: float, high: float) -> bool:
    """Whether a minor tick of a log axis over [low, high] gets a label (plain_log_axis)."""
    decades = math.log10(high / low) if low > 0 and high > low else 0.0
    mantissa = round(value / 10 ** math.floor(math.log10(value)))
    return decades <= 2 and mantissa in ((2, 5) if decades > 1 else (2, 3, 5) if decades > 0.7 else range(2, 10))


class _PlainLog(Formatter):
    """The tick formatter of plain_log_axis."""

    def __init__(self, minor: bool) -> None:
        self.minor = minor

    def __call__(self, value: float, pos: int | None = None) -> str:
        if value <= 0:
            return ""
        if self.minor and not _minor_labelled(value, *sorted(self.axis.get_view_interval())):
            return ""
        return plain_number(value)


def count_axis(ax, values: list[int]) -> None:
    """A log-2 x axis of counts (nodes, GPUs) labelled at the data's own values in plain digits."""
    ticks = sorted({int(v) for v in values})
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [f"{t:,}" for t in ticks])
    ax.xaxis.set_minor_locator(NullLocator())


def from_zero(ax, headroom: float = 1.12) -> None:
    """The y axis from 0 to a little above the highest point the axes' lines draw (no cut-off axis)."""
    tops = [float(np.nanmax(line.get_ydata())) for line in ax.lines if len(line.get_ydata())]
    top = max(tops, default=0.0)
    ax.set_ylim(0, top * headroom if top > 0 else 1.0)


def seconds_scale(largest_s: float) -> tuple[str, float]:
    """(unit, factor) to show times up to largest_s: seconds x factor reads in unit (us, ms or s)."""
    unit, size = time_unit(largest_s)
    return unit, 1.0 / size


def legend_outside(ax, handles=None, labels=None, **kwargs) -> None:
    """The legend beside the axes (right), so it covers no data."""
    args = () if handles is None else (handles, labels)
    ax.legend(*args, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, **kwargs)
