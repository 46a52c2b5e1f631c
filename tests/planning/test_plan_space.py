"""Every plan the planner can propose simulates: small models on small machines, across the whole plan space.

The space is the planner's own (planner.candidates: every schedule, ZeRO stage, recomputation, all-to-all, pp,
ep, dp, vpp, micro-batch size) with tensor parallelism's every form opened (etp 1 and tp, sequence parallelism
on and off, as --fix allows), for a small MoE and the same model dense, on a uniform cluster and on Frontier
(one and two nodes), 4 to 16 GPUs, with and without flash attention (selective recomputation needs it off).
Each plan must finish with a finite, positive step time. The quick test simulates a subset that holds every pair
of values of every two axes; the slow one simulates every plan of each case.
"""

from __future__ import annotations

import itertools
import math
import warnings
from functools import cache

import numpy as np
import pytest

from piper_sim.config import load_config
from piper_sim.planning.plan_point import PlanPoint
from piper_sim.planning.planner import PlanRequest, candidates
from piper_sim.simulator import simulate
from piper_sim.workload.presets import load_model

MODELS = {
    "small-moe": "small-moe",  # 8 layers, 8 experts
    "small-dense": {
        "preset": "small-moe",
        "name": "small-dense",
        "num_experts": 1,
        "top_k": 1,
        "num_dense_layers": 8,
        "dense_ffn_dim": 1024,
    },
}
TOPOLOGIES = ("uniform", "frontier")
GPUS = (4, 8, 16)
EVERY_TP_FORM = {"etp": (1, 2), "sp": (True, False)}  # the planner's default is etp 1 with sequence parallelism
AXES = (
    "pp",
    "ep",
    "dp",
    "tp",
    "etp",
    "sp",
    "vpp",
    "micro_batch_size",
    "num_microbatches",
    "schedule",
    "all_to_all",
    "recompute",
    "zero",
)
CASES = list(itertools.product(MODELS, TOPOLOGIES, GPUS))


@cache
def case_plans(model: str, topology: str, gpus: int, flash: bool) -> list[tuple[PlanRequest, PlanPoint]]:
    """The plans the planner enumerates for one case (a global batch of one sequence per GPU: few micro-batches)."""
    request = PlanRequest(
        model=MODELS[model],
        num_gpus=gpus,
        global_batch=gpus,
        topology=topology,
        flash_attention=flash,
        fixed=EVERY_TP_FORM,
    )
    return [(request, point) for point in candidates(request, load_model(MODELS[model]))]


def features(model: str, topology: str, gpus: int, flash: bool, point: PlanPoint) -> dict:
    return {
        "model": model,
        "topology": topology,
        "gpus": gpus,
        "flash": flash,
        **{axis: getattr(point, axis) for axis in AXES},
    }


def pairwise_cover(rows: list[dict]) -> list[int]:
    """Indices of rows that together hold every pair of values two axes take together in some row (greedy: each
    pick holds the most pairs not yet held, the first such row on ties, so the subset is the same every run)."""
    axes = list(rows[0])
    pairs = list(itertools.combinations(range(len(axes)), 2))
    ids: dict[tuple, int] = {}
    table = np.array([[ids.setdefault((a, row[axes[a]], b, row[axes[b]]), len(ids)) for a, b in pairs] for row in rows])
    held = np.zeros(len(ids), dtype=bool)
    chosen = []
    while not held.all():
        best = int(np.argmax((~held[table]).sum(axis=1)))
        chosen.append(best)
        held[table[best]] = True
    return chosen


def check_plan(request: PlanRequest, point: PlanPoint) -> None:
    """The plan simulates, without a numeric warning, to a finite, positive step time."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a NaN or overflow on the way is a failure here
        step_s = simulate(load_config(request.config(point))).report.step_time_s
    assert math.isfinite(step_s) and step_s > 0, f"{request.num_gpus} GPUs, {point.label()}: step {step_s}"


@cache
def quick_subset() -> list[tuple[PlanRequest, PlanPoint, dict]]:
    pool = [
        (request, point, features(model, topology, gpus, flash, point))
        for model, topology, gpus in CASES
        for flash in (True, False)
        for request, point in case_plans(model, topology, gpus, flash)
    ]
    return [pool[i] for i in pairwise_cover([row for _, _, row in pool])]


def test_the_quick_subset_holds_every_value_of_every_axis():
    subset = [row for _, _, row in quick_subset()]
    pool = [features(m, t, g, f, p) for m, t, g in CASES for f in (True, False) for _, p in case_plans(m, t, g, f)]
    for axis in subset[0]:
        assert {row[axis] for row in subset} == {row[axis] for row in pool}, axis
    # every pair too, for instance each schedule with each ZeRO stage it allows (ZeRO-2 under interleaved 1F1B once
    # stalled) and each GPU count with each tensor-parallel form
    for a, b in (("schedule", "zero"), ("gpus", "etp"), ("topology", "all_to_all"), ("model", "recompute")):
        assert {(row[a], row[b]) for row in subset} == {(row[a], row[b]) for row in pool}, (a, b)


def test_pairwise_cover_holds_every_pair_in_few_rows():
    rows = [{"a": a, "b": b, "c": c} for a, b, c in itertools.product(range(3), range(3), range(2))]
    chosen = pairwise_cover(rows)
    held = {(x, rows[i][x], y, rows[i][y]) for i in chosen for x, y in itertools.combinations("abc", 2)}
    assert len(held) == 9 + 6 + 6 and len(chosen) < len(rows) and chosen == pairwise_cover(rows)


def test_every_pair_of_plan_values_simulates():
    for request, point, _ in quick_subset():
        check_plan(request, point)


@pytest.mark.slow
@pytest.mark.parametrize(("model", "topology", "gpus"), CASES)
def test_every_plan_of_the_space_simulates(model, topology, gpus):
    """Without flash attention the planner also tries selective recomputation: the larger space of the two."""
    for request, point in case_plans(model, topology, gpus, False):
        check_plan(request, point)
