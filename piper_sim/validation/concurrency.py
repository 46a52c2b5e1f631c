"""How many ranks compute at once: the share of a run's time with k ranks inside a compute task.

On a host whose ranks share cores, this is how the cores were used. Ranks of a real run drift apart: the
kernel runs some while others wait, so the counts spread over 0, 1, 2, ... The simulator's processor
sharing runs identical ranks in lockstep: all of them compute together, then all of them wait together.
`validate` prints the two side by side and `--out` writes them per case (concurrency.csv).

The same difference shows inside the tasks: a compute task the kernel runs whole uses about as much CPU as
wall time, one that shares a core with others uses less (uninterrupted_share). Reads traces only: imports
the task kinds of the schedule and nothing else of piper-sim.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from piper_sim.workload.task_kinds import COMPUTE_KINDS


def compute_concurrency(trace: pd.DataFrame) -> pd.Series:
    """Fraction of the trace's span (first start to last end) with k ranks inside a compute task, indexed by
    k from 0 to the number of ranks. A task that ends when the next one starts is not counted twice."""
    ranks = int(trace["rank"].nunique())
    compute = trace[trace["kind"].astype(str).isin(COMPUTE_KINDS)]
    times = np.concatenate([compute["start_s"].to_numpy(), compute["end_s"].to_numpy()])
    steps = np.concatenate([np.ones(len(compute), int), -np.ones(len(compute), int)])
    order = np.lexsort((steps, times))  # at equal times, ends (-1) before starts (+1)
    times, counts = times[order], np.cumsum(steps[order])
    t0, t1 = float(trace["start_s"].min()), float(trace["end_s"].max())
    edges = np.concatenate([[t0], times, [t1]])
    levels = np.concatenate([[0], counts])
    spans = np.diff(edges)
    share = np.bincount(levels, weights=spans, minlength=ranks + 1) / (t1 - t0)
    return pd.Series(share[: ranks + 1], index=pd.RangeIndex(ranks + 1, name="ranks_computing"))


def mean_computing(share: pd.Series) -> float:
    """Time-weighted mean number of ranks inside a compute task."""
    return float((share.index.to_numpy() * share.to_numpy()).sum())


WHOLE_CPU_OVER_WALL = 0.9  # a compute task with at least this CPU per wall second had a core to itself


def uninterrupted_share(trace: pd.DataFrame) -> float:
    """Share of the trace's compute tasks that had a core to themselves: CPU (the trace's cpu_s) at least
    0.9 x the task's wall time. A real run's cpu_s is the CPU the rank's main thread used; a simulated one's
    is the work priced on one unshared core, so under processor sharing a task among n > cores busy ranks
    gets cores / n. NaN without cpu_s (runs measured before the column existed)."""
    compute = trace[trace["kind"].astype(str).isin(COMPUTE_KINDS)]
    wall = compute["end_s"] - compute["start_s"]
    keep = wall > 0
    if not keep.any() or compute["cpu_s"].isna().any():
        return float("nan")
    return float((compute["cpu_s"][keep] >= WHOLE_CPU_OVER_WALL * wall[keep]).mean())
