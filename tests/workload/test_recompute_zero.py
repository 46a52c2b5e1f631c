"""Activation recomputation and sharded optimizer state in the schedule, the memory model and the simulator,
against closed forms."""

from __future__ import annotations

import math

import pytest

from piper_sim.collectives.phases import all_reduce_ring
from piper_sim.collectives.sharded import all_gather_ring, reduce_scatter_ring
from piper_sim.config import load_config
from piper_sim.errors import ConfigError
from piper_sim.schedule.build import build_schedule
from piper_sim.schedule.validate import check_schedule, dry_run
from piper_sim.simulator import simulate
from piper_sim.workload.memory import activation_bytes, state_bytes_per_param
from piper_sim.workload.presets import load_model

BASE = "examples/small-moe.yaml"  # 8 layers, pp 2 x ep 4, 8 microbatches


def _kinds(schedule, stage=0):
    return [t.kind for t in schedule.stage_programs[stage]]


def test_zero_state_bytes_are_the_zero_paper_formulas():
    # Rajbhandari et al. 2020, section 5.1, mixed-precision Adam (K = 12): P_os 4 + K/Nd. fp32 models keep
    # 4 + 4 bytes of weight and gradient and K = 8 (Adam m and v; the weights are the master copy).
    assert state_bytes_per_param(0, 8) == 16 and state_bytes_per_param(0, 8, dtype_bytes=4) == 16
    assert state_bytes_per_param(1, 8) == pytest.approx(4 + 12 / 8)
    assert state_bytes_per_param(1, 8, dtype_bytes=4) == pytest.approx(8 + 8 / 8)
    # P_os+g: 2 + 14/Nd (fp32: 4 + 12/Nd); the full gradients of the chunk whose backward runs are the
    # stage plan's transient (test_zero2_reduce_scatters_each_chunk_and_micro_batch)
    assert state_bytes_per_param(2, 8) == pytest.approx(2 + 14 / 8)
    assert state_bytes_per_param(2, 8, dtype_bytes=4) == pytest.approx(4 + 12 / 8)
    assert state_bytes_per_param(2, 1) == 16  # one replica: nothing to shard


def test_zero_memory_per_rank_in_the_simulator():
    plain = simulate(load_config(BASE)).report
    cfg = load_config(BASE)
    from piper_sim.sim.stage_plans import build_stage_plans

    plan = build_stage_plans(build_schedule(cfg), cfg.model, cfg.parallel, True)[0]
    dense, expert = plan.params_dense, plan.params_expert
    for zero, bucket in ((1, 0.0), (2, 2 * (dense + expert))):  # ZeRO-2: one chunk's (here all) gradients alive
        sharded = simulate(load_config(BASE, [f"optimizer.zero={zero}"])).report
        saved = dense * (16 - state_bytes_per_param(zero, 4)) + expert * 0  # ep 4 x dp 1: experts have one replica
        assert saved == dense * (9 if zero == 1 else 10.5)  # 16 - (4 + 12/4); 16 - (2 + 14/4)
        assert plain.peak_memory_bytes[0] - sharded.peak_memory_bytes[0] == pytest.approx(saved - bucket, rel=1e-12)


def test_zero2_reduce_scatters_each_chunk_and_micro_batch():
    """ZeRO-2 (Rajbhandari et al. 2020, section 5.2): gradients reduce-scattered as the backward produces them; the
    lowered schedule does it after each chunk's backward (or weight pass) of each micro-batch, then only the
    parameters' all-gather follows the optimizer."""
    for schedule in ("1f1b", "zb-h1"):
        cfg = load_config(BASE, ["optimizer.zero=2", f"schedule={schedule}"])
        program = build_schedule(cfg).stage_programs[0]
        scatters = [t for t in program if t.kind == "reduce_scatter"]
        assert len(scatters) == cfg.parallel.num_microbatches and all(t.chunk == 0 for t in scatters)
        producer = "backward_weight" if schedule == "zb-h1" else "backward"
        index = {t.task_id: i for i, t in enumerate(program)}
        for t in scatters:
            assert program[index[t.deps[0]]].kind.value.startswith(producer)
        assert [t.kind for t in program[-2:]] == ["optimizer", "all_gather"]
        check_schedule(build_schedule(cfg))
        dry_run(build_schedule(cfg))


def test_reduce_scatter_plus_all_gather_move_what_one_all_reduce_moves():
    members = [f"g{i}" for i in range(8)]
    size = 1e9
    (ar,) = all_reduce_ring(size, members, None)
    (rs,) = reduce_scatter_ring(size, members, None)
    (ag,) = all_gather_ring(size, members, None)
    assert rs.sizes.sum() + ag.sizes.sum() == pytest.approx(ar.sizes.sum())
    assert rs.sizes[0] == pytest.approx(7 / 8 * size) and rs.messages + ag.messages == ar.messages


def test_zero_lowers_to_reduce_scatter_optimizer_all_gather():
    kinds = _kinds(build_schedule(load_config(BASE, ["optimizer.zero=1"])))
    tail = kinds[-3:]
    assert tail == ["reduce_scatter", "optimizer", "all_gather"] and "all_reduce" not in kinds


def test_recomputation_memory_is_the_published_rule():
    """Korthikanti et al. 2022 (Reducing Activation Recomputation in Large Transformer Models), sections 4.1 and
    5: selective recomputation keeps no attention score matrix; full recomputation keeps only each layer's
    input, 2 s b h bytes in 16-bit. Assumptions that differ from the paper's GPT: fused kernels and no dropout,
    so the scores are the only s^2 term (4 b H s^2 bytes, fp32) and no dropout masks are kept; the lowered
    schedule recomputes a chunk from the chunk's input, which is the paper's per-layer checkpoint when a chunk
    holds one layer (and one input per chunk otherwise)."""
    model = load_model("small-moe")
    b, s, h = 2, model.seq_len, model.d_model
    for layers in ((0,), (0, 1, 2, 3)):
        none = activation_bytes(model, layers, b, last=False, flash_attention=False)
        selective = activation_bytes(model, layers, b, last=False, flash_attention=False, recompute="selective")
        full = activation_bytes(
            model, layers, b, last=False, flash_attention=False, recompute="full", recomputed=len(layers)
        )
        assert none - selective == pytest.approx(len(layers) * 4 * b * model.num_heads * s * s, rel=0.02)
        assert full == pytest.approx(s * b * h * model.dtype_bytes, rel=0.02)  # one input per chunk


def test_full_recomputation_reruns_the_forward_and_its_all_to_alls():
    plain, full = build_schedule(load_config(BASE)), build_schedule(load_config(BASE, ["recompute=full"]))
    moe_layers_stage0 = sum(load_model("small-moe").is_moe_layer(layer) for layer in range(4))
    extra_a2a = _kinds(full).count("all_to_all") - _kinds(plain).count("all_to_all")
    assert extra_a2a == 2 * moe_layers_stage0 * 8  # dispatch and combine again, per MoE layer and microbatch
    first_backward = next(i for i, t in enumerate(full.stage_programs[0]) if t.kind.startswith("backward"))
    assert full.stage_programs[0][first_backward - 1].kind in ("recompute", "recompute_expert")
    for schedule in (full, build_schedule(load_config(BASE, ["recompute=selective", "schedule=zb-h1"]))):
        check_schedule(schedule)
        dry_run(schedule)


def test_mfu_excludes_recomputation_and_hfu_includes_it():
    plain = simulate(load_config(BASE)).report
    full = simulate(load_config(BASE, ["recompute=full"])).report
    assert plain.mfu == plain.hfu
    assert full.model_flops_per_step == pytest.approx(plain.model_flops_per_step, rel=1e-12)
    assert full.hfu > full.mfu and full.step_time_s > plain.step_time_s
    assert max(full.peak_memory_bytes) < max(plain.peak_memory_bytes)


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["optimizer.zero=1", "parallel.ep=1", "parallel.pp=1", "parallel.dp=1"], "optimizer.zero"),
        (["optimizer.zero=4"], "optimizer.zero"),
        (["optimizer.zero=3", "schedule=zb-h1"], "optimizer.zero"),
        (["recompute=some"], "recompute"),
        (["recompute_layers=2"], "recompute_layers"),
        (["recompute=full", "recompute_layers=0"], "recompute_layers"),
        (["optimizer.zero=2", "schedule=dualpipe", "parallel.vpp=2", "parallel.dp=2"], "optimizer.zero"),
    ],
)
def test_bad_plan_features_name_their_key(overrides, key):
    with pytest.raises(ConfigError) as err:
        load_config(BASE, overrides)
    assert err.value.key == key


def _gradient_traffic(result):
    """(step time, the largest per-rank reduce-scatter time, per-rank reduce-scatter bytes) of a run."""
    rs = result.trace[result.trace.kind == "reduce_scatter"]
    per_rank_s = (rs.end_s - rs.start_s).groupby(rs["rank"]).sum()
    return result.report.step_time_s, float(per_rank_s.max()), rs.groupby("rank").bytes.sum()


def test_zero2_interleaved_plan_finishes_within_what_zero1_allows():
    # a plan the planner proposes: a flow set joined a memoized isolated run at the instant it ended, where
    # now - t_start rounds below the finish offset; its flow kept a few ulps of bytes and a NaN finish time,
    # which stalled stages 0 and 1 (network/flow_set.py: settle)
    plan = {
        "model": "small-moe",
        "topology": "uniform",
        "schedule": "interleaved-1f1b",
        "optimizer": {"zero": 2},
        "parallel": {"pp": 4, "ep": 1, "dp": 2, "vpp": 2, "num_microbatches": 8, "micro_batch_size": 2},
    }
    zero2_s, rs2_s, bytes2 = _gradient_traffic(simulate(load_config(plan)))
    zero1_s, rs1_s, bytes1 = _gradient_traffic(simulate(load_config(plan, ["optimizer.zero=1"])))
    assert math.isfinite(zero2_s) and zero2_s > 0
    # ZeRO-2 reduce-scatters every micro-batch's gradients of each chunk: 8 micro-batches, 8 times ZeRO-1's bytes
    assert (bytes2 == 8 * bytes1).all()
    # the same compute and parameter all-gathers: it can hide at most the reduce-scatter ZeRO-1 ends with, and
    # at most add its own reduce-scatters' time on every stage of the critical path
    assert zero1_s - rs1_s <= zero2_s <= zero1_s + 4 * rs2_s
