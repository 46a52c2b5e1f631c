"""An error budget's time side: one rank's step split into what fills it, from a run's trace (either backend).

Owns BUDGET_TERMS and trace_budget(). Every instant of the chosen rank's steps is given to one term: its compute
stream's task if one runs (compute, recomputation or the optimizer), else the communication running then, in the
order TP/SP, CP (the context-parallel K/V ring),
EP (MoE all-to-alls and expert migration), PP (pipeline sends and receives), DP (gradient reductions
and parameter gathers), else idle (the pipeline's bubble and waits). The terms sum to the rank's step time (its
steps' span over the number of steps). The rank is the one with the most compute (ties: the lowest), where the
critical path of a step runs. Must not import simpy or torch.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from piper_sim.workload.task_kinds import P2P_KINDS, RECOMPUTE_KINDS, Role, Stream, TaskKind

BUDGET_TERMS = ("compute", "recomputation", "optimizer", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm", "idle")
_COMM_ORDER = ("tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm")  # which one an instant goes to when several run


def term_of(kind: str, role: str, stream: str) -> str:
    """The budget term of one task."""
    if kind in RECOMPUTE_KINDS:
        return "recomputation"
    if kind == TaskKind.OPTIMIZER:
        return "optimizer"
    if role == Role.TP:
        return "tp_comm"
    if role == Role.CP:  # the context-parallel K/V ring beside each attention
        return "cp_comm"
    if stream == Stream.COMPUTE:
        return "compute"
    if kind in P2P_KINDS:
        return "pp_comm"
    if kind == TaskKind.ALL_TO_ALL:
        return "ep_comm"
    return "dp_comm"


def busiest_rank(df: pd.DataFrame) -> int:
    compute = df[df["stream"] == Stream.COMPUTE]
    busy = (compute["end_s"] - compute["start_s"]).groupby(compute["rank"], observed=True).sum()
    top = busy.max()
    return int(min(r for r, b in busy.items() if b == top))


def trace_budget(df: pd.DataFrame, rank: int | None = None) -> dict[str, float]:
    """Seconds per step of each BUDGET_TERMS on one rank (the busiest unless given); with "rank" and "step_s"."""
    rank = busiest_rank(df) if rank is None else rank
    num_steps = int(df["step"].nunique())
    return rank_budget(df[df["rank"] == rank], rank, num_steps, float(df["start_s"].min()), float(df["end_s"].max()))


def rank_budget(rows: pd.DataFrame, rank: int, num_steps: int, first: float, last: float) -> dict[str, float]:
    """trace_budget of one rank's rows (columns kind, role, stream, start_s, end_s) in a run of num_steps steps
    from first to last (its first start and last end, every rank's)."""
    terms = np.array(
        [term_of(str(k), str(r), str(s)) for k, r, s in zip(rows["kind"], rows["role"], rows["stream"], strict=True)]
    )
    starts, ends = rows["start_s"].to_numpy(float), rows["end_s"].to_numpy(float)
    edges = np.unique(np.concatenate([starts, ends, [first, last]]))
    widths = np.diff(edges)
    mids = (edges[:-1] + edges[1:]) / 2
    budget = dict.fromkeys(BUDGET_TERMS, 0.0)
    owner = np.full(len(mids), "", dtype=object)
    for term in ("compute", "recomputation", "optimizer", *_COMM_ORDER):  # first come, first served
        pick = terms == term
        if not pick.any():
            continue
        covered = _covered(mids, starts[pick], ends[pick]) & (owner == "")
        owner[covered] = term
    for term in BUDGET_TERMS[:-1]:
        budget[term] = float(widths[owner == term].sum()) / num_steps
    budget["idle"] = float(widths[owner == ""].sum()) / num_steps
    return {"rank": rank, "step_s": (last - first) / num_steps, **budget}


def _covered(points: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Whether each point lies inside any [start, end) interval."""
    order = np.argsort(starts, kind="stable")
    starts, reach = starts[order], np.maximum.accumulate(ends[order])
    at = np.searchsorted(starts, points, side="right") - 1
    return (at >= 0) & (reach[np.maximum(at, 0)] > points)
