"""DeepSpeed's ZeRO-1 gradient reduction simulated (`optimizer.gradient_reduce: deepspeed`; sim/collective_tasks.py):
each bucket's all-reduce moves its share of the gradients, after the backward on every rank, and the simulator and the
estimator price the same calls."""

from __future__ import annotations

import pytest

from piper_sim.config import load_config
from piper_sim.planning.estimate import estimate_config
from piper_sim.simulator import simulate
from piper_sim.workload.deepspeed_zero import reduce_buckets
from piper_sim.workload.memory import rank_params
from piper_sim.workload.task_kinds import BACKWARD_KINDS, Role, TaskKind

# X-MoE Small on one Frontier node, EP 8: the experts have one replica, the dense gradients (577M elements) are
# reduced over the node's 8 GCDs, one reduction group alone on the machine
NODE = {
    "model": "x-moe-small",
    "parallel": {"convention": "megatron", "ep": 8, "dp": 8, "num_microbatches": 1, "micro_batch_size": 1},
    "topology": "frontier",
    "collectives": {"all_to_all": "rccl", "all_reduce": "rccl"},
    "cost": {"profile": "mi250x-xmoe"},
}
GRAD_ROLES = (Role.GRAD_DENSE, Role.GRAD_EXPERT)


def run(gradient_reduce: str):
    cfg = load_config({**NODE, "optimizer": {"zero": 1, "gradient_reduce": gradient_reduce}})
    return cfg, simulate(cfg)


@pytest.fixture(scope="module")
def runs():
    return {name: run(name) for name in ("reduce-scatter", "deepspeed")}


def test_each_bucket_moves_its_share_after_the_backward_on_every_rank(runs):
    cfg, result = runs["deepspeed"]
    trace = result.trace
    params = rank_params(cfg.model, tuple(range(cfg.model.num_layers)), first=True, last=True, ep=8)
    pieces = reduce_buckets(params)["dense"]
    assert len(pieces) == 2
    for rank, rows in trace.groupby("rank"):
        reduces = rows[rows["role"].isin(GRAD_ROLES)].sort_values("start_s")
        assert list(reduces["kind"]) == [TaskKind.ALL_REDUCE] * 2
        assert list(reduces["bytes"]) == pytest.approx([2 * p for p in pieces], rel=1e-12)  # fp16 gradients
        assert reduces["peers"].iloc[0].startswith("ep_dp:") and reduces["peers"].iloc[0].endswith("+8")
        backward_end = rows[rows["kind"].isin(BACKWARD_KINDS)]["end_s"].max()
        assert reduces["start_s"].min() >= backward_end, rank  # stage 1: not overlapped with the backward


def test_the_tiers_price_the_same_calls(runs):
    """Alone on the node, the simulated reduction (all-reduces and the all-gather after the step) is the
    estimator's grad_reduce_s within 1%, with DeepSpeed's calls and with the reduce-scatter; DeepSpeed's is the
    longer in both, its all-reduces moving twice a reduce-scatter's bytes."""
    reduction = {}
    for name, (cfg, result) in runs.items():
        trace = result.trace[result.trace["rank"] == 0]
        moved = trace[trace["role"].isin((*GRAD_ROLES, Role.PARAM_DENSE, Role.PARAM_EXPERT))]
        des = float((moved["end_s"] - moved["start_s"]).sum())
        estimate, _ = estimate_config(cfg)
        assert des == pytest.approx(estimate.grad_reduce_s, rel=0.01), name
        reduction[name] = des
    assert reduction["deepspeed"] > 1.2 * reduction["reduce-scatter"]
