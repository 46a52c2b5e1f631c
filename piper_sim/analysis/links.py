"""Per-link load table: bytes carried, mean utilization over the run, link kind."""

from __future__ import annotations

import numpy as np
import pandas as pd

from piper_sim.topology.graph import Topology


def link_table(topo: Topology, link_bytes: np.ndarray, duration_s: float) -> pd.DataFrame:
    """One row per link that carried traffic, busiest first."""
    used = np.nonzero(link_bytes > 0)[0]
    cap = topo.capacity_bytes_per_s[used]
    table = pd.DataFrame(
        {
            "link": [f"{topo.links[i][0]}->{topo.links[i][1]}" for i in used],
            "link_kind": [topo.link_kinds[i] for i in used],
            "capacity_bytes_per_s": cap,
            "bytes": link_bytes[used],
        }
    )
    return with_utilization(table, duration_s)


def with_utilization(table: pd.DataFrame, duration_s: float) -> pd.DataFrame:
    """The links table's utilization over a run of duration_s (its bytes over what its capacity carries then),
    busiest first."""
    util = table["bytes"] / (table["capacity_bytes_per_s"] * duration_s) if duration_s > 0 else 0.0
    return (
        table.assign(utilization=util).sort_values("utilization", ascending=False, kind="stable").reset_index(drop=True)
    )


def link_kind_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per link kind: links used, bytes, mean and max utilization."""
    return (
        table.groupby("link_kind")
        .agg(
            links=("link", "size"),
            bytes=("bytes", "sum"),
            mean_utilization=("utilization", "mean"),
            max_utilization=("utilization", "max"),
        )
        .reset_index()
    )
