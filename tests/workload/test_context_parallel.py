"""Context parallelism (parallel.cp; docs/context-parallel.md): the plan's checks, the CP groups, the K/V ring in the
lowered schedule, memory and time against cp in both tiers, the planner's space and the importers."""

from __future__ import annotations

import pytest

from piper_sim.config import load_config
from piper_sim.errors import ConfigError
from piper_sim.importers.megatron import import_megatron
from piper_sim.planning.estimate import estimate_config, estimate_with_memory
from piper_sim.planning.plan_fixes import parse_fixes
from piper_sim.planning.space import enumerate_plans
from piper_sim.schedule.build import build_schedule
from piper_sim.simulator import simulate
from piper_sim.workload.context_parallel import chunk_order, kv_chunk_bytes
from piper_sim.workload.mesh import Mesh
from piper_sim.workload.presets import model_from_mapping

# a small dense GQA model at a long sequence: 4 layers, d 512, 8 heads of 64, 2 key/value heads
MODEL = {
    "name": "long",
    "num_layers": 4,
    "d_model": 512,
    "num_heads": 8,
    "num_kv_heads": 2,
    "vocab_size": 1024,
    "seq_len": 32768,
    "expert_ffn_dim": 1024,
    "num_experts": 1,
    "top_k": 1,
    "num_dense_layers": 4,
    "dense_ffn_dim": 2048,
}


def config(cp: int, **parallel):
    """pp 2 over 16 H100s, the global batch fixed at 16 sequences whatever cp (micro-batches x cp)."""
    section = {"pp": 2, "dp": 8, "cp": cp, "num_microbatches": 2 * cp, **parallel}
    return load_config({"model": MODEL, "parallel": section, "topology": "dgx-h100-superpod", "cost": "h100"})


@pytest.mark.parametrize(
    "parallel, key",
    [
        ({"cp": 0}, "parallel.cp"),
        ({"cp": 3}, "parallel.cp"),  # does not divide the stage's 8 dense replicas
        ({"cp": True}, "parallel.cp"),
    ],
)
def test_bad_cp_is_a_config_error_naming_the_key(parallel, key):
    with pytest.raises(ConfigError) as info:
        load_config({"model": MODEL, "parallel": {"pp": 2, "dp": 8, **parallel}})
    assert info.value.key == key


def test_cp_needs_chunks_of_the_sequence_and_flash_attention():
    with pytest.raises(ConfigError) as info:  # 2 x 8 chunks do not divide 1000 tokens
        load_config({"model": {**MODEL, "seq_len": 1000}, "parallel": {"dp": 8, "cp": 8}})
    assert info.value.key == "parallel.cp" and "2 x cp" in info.value.allowed
    with pytest.raises(ConfigError) as info:
        load_config({"model": MODEL, "parallel": {"dp": 8, "cp": 2}, "cost": {"flash_attention": False}})
    assert info.value.key == "parallel.cp" and "flash" in info.value.allowed


def test_cp_groups_follow_megatrons_tp_cp_order_and_join_the_dense_gradient_group():
    mesh = Mesh(pp=2, dp=8, tp=2, etp=2, cp=2)  # a stage: 16 ranks = tp 2 x cp 2 x 4 dense replicas
    assert mesh.group(0, "cp") == (0, 2) and mesh.group(3, "cp") == (1, 3) and mesh.group(21, "cp") == (21, 23)
    assert mesh.group(0, "tp") == (0, 1)
    assert set(mesh.group(0, "cp")) <= set(mesh.group(0, "ep_dp"))  # dense gradients reduced over DP x CP
    assert mesh.data_parallel == 8 and mesh.batch_parallel == 4
    assert [mesh.coords(r)["cp"] for r in range(4)] == [0, 0, 1, 1]


def test_megatron_convention_counts_world_as_tp_cp_dp_pp():
    cfg = load_config(
        {
            "model": MODEL,
            "parallel": {"convention": "megatron", "tp": 2, "cp": 4, "pp": 2, "dp": 2, "num_microbatches": 2},
        }
    )
    assert cfg.parallel.num_gpus == 2 * 4 * 2 * 2
    assert cfg.parallel.sequences_per_step == 2 * 2  # DP 2 x 2 micro-batches: the CP ranks share each sequence
    assert chunk_order(4) == [(0, 7), (1, 6), (2, 5), (3, 4)]


def test_each_attention_has_its_ring_beside_it():
    schedule = build_schedule(config(2))
    program = schedule.stage_programs[0]
    ring = [t for t in program if t.role == "cp"]
    forward = [t for t in ring if t.in_forward]
    backward = [t for t in ring if not t.in_forward]
    layers = len(schedule.stage_layers[0])
    microbatches = schedule.num_microbatches
    assert {t.kind for t in forward} == {"all_gather"} and len(forward) == layers * microbatches
    assert [t.kind for t in backward].count("all_gather") == layers * microbatches  # K/V again
    assert [t.kind for t in backward].count("reduce_scatter") == layers * microbatches  # dK/dV back
    assert all(t.nonblocking and t.group_axis == "cp" for t in ring)
    by_id = {t.task_id: t for t in program}
    for task in forward:  # issued with the attention (same deps), waited for by the task after it
        attention = by_id[task.task_id.rpartition(":cp_")[0]]
        assert attention.deps == task.deps and attention.ops[0].startswith("attn:")
        assert any(task.task_id in t.deps for t in program)


def test_activation_memory_falls_as_one_over_cp():
    """The training state is the same at every cp (zero 0): what a halving of cp takes off the peak is the
    activations' share, a/2 from cp 1 to 2 and a/4 from cp 2 to 4 (the ring's buffers are a few MiB)."""
    peaks = {cp: estimate_with_memory(config(cp, num_microbatches=2))[1][0] for cp in (1, 2, 4)}
    assert peaks[1] > peaks[2] > peaks[4]
    assert peaks[1] - peaks[2] == pytest.approx(2 * (peaks[2] - peaks[4]), rel=0.05)


def test_step_time_falls_with_cp_at_a_fixed_global_batch_in_both_tiers():
    times = {}
    for cp in (1, 2, 4):
        cfg = config(cp)
        assert cfg.parallel.sequences_per_step == 16
        times[cp] = (estimate_config(cfg)[0].step_time_s, simulate(cfg).report.step_time_s)
    for tier in (0, 1):
        assert times[1][tier] > times[2][tier] > times[4][tier]
    for cp in (2, 4):  # the estimator's ring beside the attention agrees with the simulator's
        assert times[cp][0] == pytest.approx(times[cp][1], rel=0.05)


def test_ring_moves_each_ranks_kv_chunk_cp_minus_one_times():
    cfg = config(4)
    model, par = cfg.model, cfg.parallel
    chunk = kv_chunk_bytes(model, par)  # 8192 tokens x (2 x 2 heads x 64) x 2 bytes
    assert chunk == 32768 // 4 * 2 * 2 * 64 * 2
    trace = simulate(cfg).trace
    ring = trace[trace["role"] == "cp"]
    assert set(ring["bytes"]) == {4 * chunk}  # each collective's buffer: the sequence's K/V, cp chunks
    layers_per_stage, microbatches = 2, par.num_microbatches
    per_rank = ring.groupby(["rank", "kind"], observed=True).size()
    assert per_rank.xs("all_gather", level="kind").eq(2 * layers_per_stage * microbatches).all()
    assert per_rank.xs("reduce_scatter", level="kind").eq(layers_per_stage * microbatches).all()


def test_planner_space_tries_cp_for_long_sequences_only():
    long = model_from_mapping(MODEL)
    plans = enumerate_plans(long, 16, 16, domain_gpus=16, node_gpus=8)
    assert {p.cp for p in plans} == {1, 2, 4}  # 32768 / 4 = 8192 tokens a rank at most
    short = model_from_mapping({**MODEL, "seq_len": 4096})
    assert {p.cp for p in enumerate_plans(short, 16, 16, domain_gpus=16, node_gpus=8)} == {1}
    fixed = enumerate_plans(long, 16, 16, domain_gpus=16, node_gpus=8, fixed=parse_fixes(["parallel.cp=2"]))
    assert fixed and {p.cp for p in fixed} == {2}
    point = fixed[0]
    assert point.parallel.cp == 2 and "cp2" in point.label() and point.config_sections()["parallel"]["cp"] == 2


def test_megatron_import_maps_context_parallel_size():
    flags = (
        "--num-layers 4 --hidden-size 512 --num-attention-heads 8 --group-query-attention --num-query-groups 2 "
        "--seq-length 32768 --max-position-embeddings 32768 --vocab-size 1024 --ffn-hidden-size 2048 --bf16 "
        "--tensor-model-parallel-size 2 --context-parallel-size 4 --pipeline-model-parallel-size 2 "
        "--micro-batch-size 1 --global-batch-size 8 --use-flash-attn"
    ).split()
    imported = import_megatron(flags, world_size=32)
    assert imported.config["parallel"]["cp"] == 4 and imported.config["parallel"]["dp"] == 2
    cfg = load_config(imported.config)
    assert cfg.parallel.cp == 4 and cfg.parallel.num_gpus == 32 and cfg.parallel.sequences_per_step == 8
