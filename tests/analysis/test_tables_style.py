"""The table style (analysis/tables.py) and the plot style (analysis/style.py): known values format exactly, a name
has one colour in every plot, every task kind of the schedule IR has a colour and shows in the timeline's legend,
and log axes label their ticks in plain digits."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.colors as mcolors  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from piper_sim.analysis import style  # noqa: E402
from piper_sim.analysis.plots import timeline_figure  # noqa: E402
from piper_sim.analysis.tables import Col, fixed, percent, render  # noqa: E402
from piper_sim.collectives.algorithms import ALL_REDUCE, ALL_TO_ALL  # noqa: E402  (every algorithm registered)
from piper_sim.migration.policies import POLICIES  # noqa: E402
from piper_sim.workload.task_kinds import TaskKind  # noqa: E402


def _cells(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines()]


def test_negative_zero_and_signs():
    assert fixed(-0.0, 1) == "0.0"
    assert fixed(-0.00004, 2) == "0.00"
    assert fixed(-0.5, 1) == "-0.5"
    assert percent(-5.865524e-16) == "0.0 %"
    assert percent(0.409409, 2) == "40.94 %"
    assert fixed(1234567.891, 1) == "1,234,567.9"


def test_columns_take_the_unit_their_values_read_in():
    rows = [
        {
            "work": 5.215642e10,
            "step": 0.065066,
            "big": 52.5,
            "mem": 188157952.0,
            "bw": 1.972772e10,
            "mfu": 0.409409,
            "bubble": -5.865524e-16,
            "ok": np.bool_(True),
            "gpus": np.int64(1024),
        }
    ]
    cols = [
        Col("work", "work", "si", si_symbol="FLOP"),
        Col("step", "step", "time"),
        Col("big", "long", "time"),
        Col("mem", "peak", "bytes"),
        Col("bw", "all-to-all", "GB/s"),
        Col("mfu", "MFU", "%"),
        Col("bubble", "bubble", "%"),
        Col("ok", "fits", "yes/no"),
        Col("gpus", "GPUs", "count"),
    ]
    header, rule, row = render(rows, cols).splitlines()
    for label in (
        "work (GFLOP)",
        "step (ms)",
        "long (s)",
        "peak (MiB)",
        "all-to-all (GB/s)",
        "MFU (%)",
        "bubble (%)",
        "GPUs",
    ):
        assert label in header
    assert row.split() == ["52.16", "65.07", "52.50", "179.4", "19.7", "40.9", "0.0", "yes", "1,024"]
    assert "e+" not in row and "e-" not in row


def test_missing_values_text_and_absent_columns():
    rows = [{"plan": "pp2 ep4", "t": float("nan")}, {"plan": "pp4 ep2", "t": 2.0}]
    text = render(rows, [Col("plan", "plan"), Col("t", "step", "time"), Col("absent", "not there", "time")])
    assert "not there" not in text
    assert _cells(text)[2:] == [["pp2", "ep4", "-"], ["pp4", "ep2", "2.000"]]


def test_every_name_has_one_colour_in_every_family():
    for name in ALL_TO_ALL.names() + ALL_REDUCE.names():
        assert name in style.ALGORITHM_COLORS, name
    for name in POLICIES.names():
        assert name in style.POLICY_COLORS, name
    for kind in TaskKind:
        assert kind.value in style.KIND_COLORS, kind
    for family, colors in style.FAMILIES.items():
        assert len(set(colors.values())) == len(colors), f"two {family} names share a colour"
        for name, own in colors.items():
            assert style.color(family, str(name)) == own
    # a name a family does not list gets the same colour each time (not black, not by order of appearance)
    assert style.color("algorithm", "mystery") == style.color("algorithm", "mystery") != "black"


def _trace(kinds: list[str], end_s: float) -> pd.DataFrame:
    n = len(kinds)
    start = np.linspace(0, end_s, n, endpoint=False)
    return pd.DataFrame(
        {"step": 0, "rank": 0, "kind": pd.Categorical(kinds), "start_s": start, "end_s": start + end_s / n}
    )


def test_timeline_colours_and_names_every_task_kind():
    kinds = [k.value for k in TaskKind]
    fig = timeline_figure(_trace(kinds, 0.5), "timeline", "m | machine | simulated")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == kinds
    for bars in ax.collections:  # each kind's bars in its own colour, none black
        face = mcolors.to_hex(bars.get_facecolor()[0])
        assert face == style.KIND_COLORS[bars.get_label()] != "#000000"
    assert ax.get_xlabel() == "time (ms)"
    plt.close(fig)


def test_timeline_switches_to_seconds_on_long_steps():
    fig = timeline_figure(_trace(["forward", "backward"], 50.0))
    assert fig.axes[0].get_xlabel() == "time (s)"
    assert fig.axes[0].get_xlim()[1] < 100
    plt.close(fig)


def test_log_axes_label_in_plain_digits():
    fig, ax = plt.subplots()
    ax.plot([0.9, 3, 40], [0.9, 3, 40])
    ax.set_xscale("log")
    style.plain_log_axis(ax.xaxis)
    fig.canvas.draw()
    low, high = ax.get_xlim()
    labels = [
        t.get_text() for t in ax.get_xticklabels(which="both") if t.get_text() and low <= t.get_position()[0] <= high
    ]
    assert all("10^" not in t and "\\times" not in t and "$" not in t for t in labels)
    assert sorted(labels, key=float) == ["1", "2", "5", "10", "20"]  # under two decades: 2 and 5 of each too
    assert style.plain_number(0.9) == "0.9" and style.plain_number(0.05) == "0.05"
    assert style.plain_number(2000) == "2,000"
    plt.close(fig)


def test_a2a_levels_draws_grouped_bars_in_the_algorithms_colours():
    from piper_sim.reproduce.network_experiments import _bars

    table = pd.DataFrame(
        [
            {"level": level, "gpus": n, "size per GPU": "1MiB", "algorithm": alg, "busbw GB/s per GPU": bw}
            for level, n in (("node", 8), ("switch", 32))
            for alg, bw in (("rccl", 10.0), ("halo", 20.0))
        ]
    )
    fig, ax = plt.subplots()
    _bars(ax, table)
    assert len(ax.lines) == 0  # categories are not joined by lines
    assert [mcolors.to_hex(p.get_facecolor()) for p in ax.patches] == [style.ALGORITHM_COLORS["rccl"]] * 2 + [
        style.ALGORITHM_COLORS["halo"]
    ] * 2
    assert [p.get_height() for p in ax.patches] == [10.0, 10.0, 20.0, 20.0]
    plt.close(fig)
