"""Lanes (one process for the interchangeable ranks of a stage) give exactly the per-rank result."""

from __future__ import annotations

import pandas as pd
import pytest

from piper_sim.config import load_config
from piper_sim.simulator import simulate

ZIPF = {"routing": {"kind": "zipf", "exponent": 1.0}}
DENSE = {
    "name": "dense-1b",
    "num_layers": 8,
    "d_model": 1024,
    "num_heads": 16,
    "vocab_size": 51200,
    "seq_len": 1024,
    "expert_ffn_dim": 4096,
    "num_experts": 1,
    "top_k": 1,
    "num_dense_layers": 8,
    "dense_ffn_dim": 4096,
    "dtype": "fp16",
}
CASES = {
    "uniform-cluster": {"model": "small-moe", "parallel": {"pp": 2, "ep": 4, "dp": 2, "num_microbatches": 4}},
    "interleaved-zb": {
        "model": "small-moe",
        "schedule": "zb-h1",
        "parallel": {"pp": 4, "ep": 2, "num_microbatches": 8},
    },
    "fat-tree-ecmp": {
        "model": "small-moe",
        "topology": "fat-tree",
        "parallel": {"pp": 2, "ep": 8, "dp": 4, "num_microbatches": 4},
    },
    "frontier-shared-nics": {
        "model": "small-moe",
        "topology": "frontier",
        "collectives": {"all_to_all": "halo"},
        "parallel": {"pp": 4, "ep": 8, "num_microbatches": 4},
    },
    "frontier-across-nodes": {
        "model": {"preset": "small-moe", "num_experts": 16},
        "topology": "frontier",
        "collectives": {"all_to_all": "halo"},
        "parallel": {"pp": 4, "ep": 16, "dp": 2, "num_microbatches": 4},
    },
    "zipf-dp2": {"model": "small-moe", **ZIPF, "parallel": {"pp": 2, "ep": 4, "dp": 2, "num_microbatches": 4}},
    "zipf-frontier": {
        "model": {"preset": "small-moe", "num_experts": 16},
        "topology": "frontier",
        **ZIPF,
        "collectives": {"all_to_all": "halo"},
        "parallel": {"pp": 2, "ep": 16, "num_microbatches": 4},
    },
    "drift-migration-steps": {
        "model": "small-moe",
        "routing": {"kind": "drift", "rate": 0.5},
        "migration": {"enabled": True, "policy": "greedy"},
        "sim": {"steps": 4},
        "parallel": {"pp": 2, "ep": 4, "dp": 2, "num_microbatches": 4},
    },
    "tp2-sp-zipf": {
        "model": "small-moe",
        **ZIPF,
        "parallel": {"pp": 2, "ep": 4, "tp": 2, "sp": True, "num_microbatches": 4},
    },
    "tp2-etp2-frontier": {
        "model": "small-moe",
        "topology": "frontier",
        "collectives": {"all_to_all": "halo"},
        "parallel": {"pp": 2, "ep": 4, "tp": 2, "etp": 2, "num_microbatches": 4},
    },
    "zipf-dualpipe-v": {
        "model": "small-moe",
        "schedule": "dualpipe-v",
        **ZIPF,
        "parallel": {"pp": 2, "ep": 4, "vpp": 2, "num_microbatches": 4},
    },
    # back-to-back gradient reduce-scatters over the ep x dp groups, then the expert dp groups, whose collectives
    # end apart (their members' routes differ in latency): each group joins the next when its own members have
    "frontier-chained-reduce-scatters": {
        "model": {"preset": "small-moe", "num_experts": 16},
        "topology": "frontier",
        "collectives": {"all_to_all": "halo"},
        "schedule": "zb-h1",
        "optimizer": {"zero": 1},
        "parallel": {"pp": 2, "ep": 16, "dp": 4, "tp": 2, "sp": True, "num_microbatches": 4},
    },
    # the last backward's gradient send, then the reduce-scatter that waits for it: members' transfers land apart
    # (after tensor-parallel reduce-scatters that ended apart); each group joins when its own members' have landed
    "frontier-collective-after-transfers": {
        "model": {"preset": "small-moe", "num_experts": 16},
        "topology": "frontier",
        "collectives": {"all_to_all": "halo"},
        "optimizer": {"zero": 1},
        "parallel": {"pp": 2, "ep": 8, "dp": 4, "tp": 2, "sp": True, "num_microbatches": 4},
    },
    # a dense Megatron-style pipeline whose stages' columns cross the fat tree on routes of two latencies: each
    # member's transfers land a little apart every micro-batch, more than a stage-wide lane can absorb
    "dense-pipeline-latency-classes": {
        "model": DENSE,
        "topology": "dgx-a100-superpod",
        "cost": {"profile": "a100"},
        "parallel": {"convention": "megatron", "tp": 8, "pp": 4, "dp": 8, "num_microbatches": 16},
    },
    # FSDP gathers over expert-data-parallel groups of four, one GPU of each of four EP groups on different nodes:
    # the groups' gathers contend differently with the EP groups' DeepEP all-to-alls and end apart
    "zero3-expert-groups-end-apart": {
        "model": {"preset": "small-moe", "num_experts": 64, "top_k": 8, "d_model": 1024, "seq_len": 1024},
        "topology": "dgx-h100-superpod",
        "cost": {"profile": "h100"},
        "collectives": {"all_to_all": "deepep", "all_reduce": "ring"},
        "optimizer": {"zero": 3, "reshard_after_forward": False},
        "parallel": {"convention": "megatron", "pp": 1, "ep": 8, "dp": 64, "num_microbatches": 8},
    },
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_lanes_match_one_process_per_rank(name):
    collapsed = simulate(load_config(CASES[name]))
    per_rank = simulate(load_config(CASES[name], ["sim.collapse=false"]))
    assert per_rank.stats["num_lanes"] == per_rank.report.num_gpus
    pd.testing.assert_frame_equal(collapsed.trace, per_rank.trace)
    assert collapsed.report.peak_memory_bytes == per_rank.report.peak_memory_bytes


def test_lanes_are_used_on_a_symmetric_cluster():
    result = simulate(load_config(CASES["uniform-cluster"]))
    assert result.stats["num_lanes"] == 2 and not result.stats["lanes_fell_back"]


def test_skewed_routing_uses_a_lane_per_expert_parallel_group():
    result = simulate(load_config(CASES["zipf-dp2"]))
    assert result.stats["num_lanes"] == 4 and not result.stats["lanes_fell_back"]  # pp 2 x dp 2 groups of 4


def test_lanes_do_not_fall_back_on_frontier():
    for name in (
        "frontier-shared-nics",
        "frontier-across-nodes",
        "zipf-frontier",
        "frontier-chained-reduce-scatters",
        "frontier-collective-after-transfers",
    ):
        result = simulate(load_config(CASES[name]))
        assert not result.stats["lanes_fell_back"], name
        assert result.stats["num_lanes"] < result.report.num_gpus, name


def test_lanes_split_by_route_latency_where_stage_lanes_diverge():
    result = simulate(load_config(CASES["dense-pipeline-latency-classes"]))
    assert result.stats["lanes_by_latency"] and not result.stats["lanes_fell_back"]
    assert result.stats["num_lanes"] == 8  # 4 stages x 2 latency classes of their 64 ranks' columns


@pytest.mark.parametrize("name", ["drift-migration-steps", "zipf-dualpipe-v"])
def test_skewed_all_to_alls_are_let_go_after_their_last_use(name, monkeypatch):
    """A skewed all-to-all's phases are built at its group's first member's ask and shared with the others; each is
    dropped at its last use, so nothing stays behind over many steps."""
    from piper_sim.sim.engine import Simulation

    runs = []
    run = Simulation.run
    monkeypatch.setattr(Simulation, "run", lambda self: runs.append(self) or run(self))
    simulate(load_config(CASES[name]))
    tasks = runs[-1].collectives
    assert not tasks.routing.is_uniform and tasks._a2a_uses
    assert not tasks._skewed and not tasks._skewed_uses


def test_lanes_split_by_the_groups_whose_collectives_end_apart():
    """The stage's lane gives up where the expert gathers' groups end apart; the run splits lanes by those groups
    (the dp axis: 8 lanes of 8) rather than one lane per rank, and keeps the per-rank trace (the case above)."""
    result = simulate(load_config(CASES["zero3-expert-groups-end-apart"]))
    assert result.stats["lanes_split_by"] == ["dp"] and not result.stats["lanes_fell_back"]
    assert result.stats["num_lanes"] == 8
