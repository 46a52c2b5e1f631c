"""Plots carry a title and axis labels with units (the check tests/conftest.py applies to every saved figure),
and link utilization is in percent, as the terminal summary gives it."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from conftest import plot_problems  # noqa: E402

from piper_sim.analysis.plots import plot_link_utilization  # noqa: E402


def test_the_check_finds_a_missing_title_or_label(tmp_path):
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 2])
    assert plot_problems(fig) == ["axes 0 has no title", "axes 0 has no x label", "axes 0 has no y label"]
    with pytest.raises(AssertionError, match="no title"):
        fig.savefig(tmp_path / "bare.png")
    ax.set_xlabel("time (ms)")
    ax.set_ylabel("rank")
    fig.suptitle("a figure title counts for its axes")
    assert plot_problems(fig) == []
    plt.close(fig)


def test_link_utilization_is_plotted_in_percent(tmp_path, monkeypatch):
    links = pd.DataFrame({"link": ["a->b", "b->a"], "link_kind": ["nic", "nic"], "utilization": [0.25, 0.5]})
    widths = []
    original = plt.Axes.barh
    monkeypatch.setattr(plt.Axes, "barh", lambda ax, y, w, **kw: widths.extend(list(w)) or original(ax, y, w, **kw))
    plot_link_utilization(links, tmp_path / "links.png")
    assert sorted(widths) == [25.0, 50.0]
