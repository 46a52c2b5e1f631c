"""Error budgets: a predicted step split into its terms, on both tiers; the terms add up to the step they split."""

from __future__ import annotations

import pandas as pd
import pytest

from piper_sim.analysis.budget import BUDGET_TERMS, trace_budget
from piper_sim.config import load_config
from piper_sim.planning.estimate import config_estimator
from piper_sim.planning.estimate_budget import ESTIMATE_TERMS, estimate_budget
from piper_sim.simulator import simulate
from piper_sim.workload.cost import TaskCoster
from piper_sim.workload.profile_load import load_profile


@pytest.mark.parametrize("profile", ["mi250x", "mi250x-xmoe", "cpu-8rank"])  # roofline, measured MoE path, fixed costs
def test_a_tasks_cost_terms_add_up_to_its_cost(profile):
    cfg = load_config(
        {
            "model": "x-moe-small",
            "topology": "frontier",
            "cost": {"profile": profile, "allow_device_mismatch": True},
            "parallel": {"pp": 1, "ep": 8, "num_microbatches": 2},
        }
    )
    coster = TaskCoster(cfg.model, load_profile(profile), cfg.model.seq_len)
    rows = (700, 0, 312, 45)
    cases = [
        (kind, ("attn:1", "router:1"))
        for kind in ("forward", "backward", "backward_input", "backward_weight", "recompute")
    ]
    cases += [(kind, ("experts:1",)) for kind in ("forward_expert", "backward_expert", "recompute_expert")]
    cases += [("forward", ("moe_out:1", "head")), ("backward", ("embed", "attn:0"))]
    for kind, ops in cases:
        expert_rows = rows if ops == ("experts:1",) else ()
        seconds, _ = coster.cost(kind, ops, expert_rows)
        terms = coster.cost_terms(kind, ops, expert_rows)
        assert sum(terms.values()) == pytest.approx(seconds, rel=1e-12), (kind, ops)
        assert all(v >= 0 for v in terms.values())
    assert coster.cost_terms("forward", ("attn:1",))["attention"] > 0


PLANS = [
    {
        "model": "x-moe-small",
        "topology": "frontier",
        "collectives": {"all_to_all": "halo"},
        "parallel": {"pp": 2, "ep": 4, "num_microbatches": 8},
        "recompute": "full",
        "optimizer": {"zero": 2},
    },
    {
        "model": "x-moe-small",
        "topology": "frontier",
        "schedule": "zb-h1",
        "parallel": {"pp": 4, "ep": 2, "num_microbatches": 8, "tp": 1},
    },
    {
        "model": "mixtral-8x7b",
        "topology": "frontier",
        "schedule": "interleaved-1f1b",
        "parallel": {"pp": 4, "ep": 4, "tp": 2, "sp": True, "vpp": 2, "num_microbatches": 8},
    },
]


@pytest.mark.parametrize("plan", PLANS, ids=["zero2-recompute", "zb-h1", "tp-sp-interleaved"])
def test_the_estimate_budget_adds_up_to_the_estimated_step(plan):
    estimate, terms = estimate_budget(*config_estimator(load_config(plan)))
    assert set(terms) == {"stage", *ESTIMATE_TERMS}
    parts = {k: v for k, v in terms.items() if k != "stage"}
    assert sum(parts.values()) == pytest.approx(estimate.step_time_s, rel=1e-9)
    # the busiest stage's walk gives the estimator's own bubble: the terms were not made to add up
    assert parts["bubble"] == pytest.approx(estimate.bubble_s, rel=1e-9, abs=1e-12)
    assert parts["gemm"] > 0 and parts["ep_comm"] > 0 and parts["pp_comm"] == pytest.approx(estimate.p2p_s)
    if plan.get("recompute") == "full":
        assert parts["recomputation"] > 0 and parts["dp_comm"] > estimate.grad_reduce_s  # ZeRO-2 buckets
    if plan["parallel"].get("tp", 1) > 1:
        assert parts["tp_comm"] > 0


def _trace(rows: list[tuple]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["step", "rank", "kind", "role", "stream", "start_s", "end_s"])


def test_a_trace_budget_gives_every_instant_of_the_rank_to_one_term():
    df = _trace(
        [
            (0, 0, "forward", "", "compute", 0.0, 2.0),
            (0, 0, "all_to_all", "dispatch", "collective", 1.0, 3.0),  # 1 s hidden under compute, 1 s exposed
            (0, 0, "send", "act", "p2p", 2.5, 4.0),  # overlaps the all-to-all: EP first, then 1 s of PP
            (0, 0, "recompute", "", "compute", 5.0, 6.0),
            (0, 0, "all_reduce", "grad_dense", "collective", 6.0, 7.5),
            (0, 0, "optimizer", "", "compute", 7.5, 8.0),
            (0, 1, "forward", "", "compute", 0.0, 1.0),  # a lighter rank: not the one the budget takes
        ]
    )
    budget = trace_budget(df)
    assert budget["rank"] == 0 and budget["step_s"] == 8.0
    expected = {
        "compute": 2.0,
        "ep_comm": 1.0,
        "pp_comm": 1.0,
        "idle": 1.0,
        "recomputation": 1.0,
        "dp_comm": 1.5,
        "optimizer": 0.5,
        "tp_comm": 0.0,
        "cp_comm": 0.0,
    }
    assert {k: budget[k] for k in BUDGET_TERMS} == pytest.approx(expected)


def test_a_simulated_runs_budget_adds_up_to_its_step():
    result = simulate(load_config(PLANS[0]))
    budget = trace_budget(result.trace)
    assert sum(budget[k] for k in BUDGET_TERMS) == pytest.approx(budget["step_s"], rel=1e-9)
    assert budget["step_s"] == pytest.approx(result.report.step_time_s, rel=1e-9)
    assert budget["compute"] > 0 and budget["recomputation"] > 0 and budget["ep_comm"] > 0
