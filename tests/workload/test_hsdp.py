"""HSDP (parallel.dp_shard: torchtitan's data_parallel_shard_degree x data_parallel_replicate_degree) under ZeRO-3:
the mesh's shard and replicate groups, the lowered collectives, memory, the config's errors, the planner's space and
the torchtitan importer (docs/sharding.md)."""

from __future__ import annotations

from collections import Counter

import pytest

from piper_sim.config import load_config
from piper_sim.errors import ConfigError
from piper_sim.importers.torchtitan import import_torchtitan
from piper_sim.planning.estimate import estimate_with_memory
from piper_sim.planning.plan_fixes import parse_fixes
from piper_sim.planning.planner import PlanRequest, candidates
from piper_sim.schedule.build import build_schedule
from piper_sim.schedule.io import schedule_from_json, schedule_to_json
from piper_sim.schedule.validate import check_schedule
from piper_sim.simulator import simulate
from piper_sim.workload.memory import param_shards, state_bytes_per_param
from piper_sim.workload.presets import load_model

MOE = "examples/small-moe.yaml"  # 8 layers, pp 2 x ep 4
HSDP = ["optimizer.zero=3", "parallel.dp=2", "parallel.dp_shard=4"]  # 8 dense replicas: 2 shards groups of 4


def test_shard_groups_are_a_replicate_block_and_replicas_the_same_place_in_the_others():
    mesh = load_config(MOE, HSDP).parallel.mesh  # a stage: dp 2 x ep 4; dp index outermost, one block each
    assert mesh.replicate == 2
    assert mesh.group(5, "ep_dp_shard") == (4, 5, 6, 7) and mesh.group(1, "ep_dp_shard") == (0, 1, 2, 3)
    assert mesh.group(5, "replicate") == (1, 5) and mesh.group(9, "replicate") == (9, 13)
    assert mesh.group(5, "dp_shard") == (5,)  # the experts' two replicas are the two blocks: held whole, all-reduced


def test_hsdp_gathers_within_the_shard_group_and_all_reduces_the_shards_across_replicas():
    schedule = build_schedule(load_config(MOE, HSDP))
    check_schedule(schedule)
    kinds = Counter((t.kind, t.role, t.group_axis) for t in schedule.stage_programs[0] if t.nonblocking)
    assert kinds[("all_gather", "param_dense", "ep_dp_shard")] > 0
    assert kinds[("reduce_scatter", "grad_dense", "ep_dp_shard")] > 0
    assert kinds[("all_reduce", "grad_dense", "replicate")] == kinds[("reduce_scatter", "grad_dense", "ep_dp_shard")]
    assert kinds[("all_reduce", "grad_expert", "replicate")] > 0  # experts: one rank per shard, summed across
    assert not any(axis in ("ep_dp", "dp") for _, _, axis in kinds)  # nothing spans every replica
    optimizer = schedule.stage_programs[0][-1]
    assert all(
        t.task_id in optimizer.deps for t in schedule.stage_programs[0] if t.kind == "all_reduce" and t.nonblocking
    )
    again = schedule_from_json(schedule_to_json(schedule))
    assert again.mesh.replicate == 2


def test_hsdp_memory_lies_between_zero3_over_every_replica_and_no_sharding():
    peaks = {}
    for name, overrides in (("all", HSDP[:2]), ("hsdp", HSDP), ("none", ["optimizer.zero=0", "parallel.dp=2"])):
        peaks[name] = estimate_with_memory(load_config(MOE, overrides))[1]
        assert simulate(load_config(MOE, overrides)).report.peak_memory_bytes == pytest.approx(peaks[name])
    for all_, hsdp, none in zip(peaks["all"], peaks["hsdp"], peaks["none"], strict=True):
        assert all_ < hsdp < none
    # the state: 16 bytes over the shard group's 4 ranks, as ZeRO-3 on those ranks alone
    shards = param_shards(zero=3, data_parallel=8, dp=2, stage_size=8, replicate=2)
    assert shards == {"dense": 4, "replicated": 4, "expert": 1}
    assert state_bytes_per_param(3, shards["dense"]) == 16 / 4


@pytest.mark.parametrize(
    "overrides,key",
    [
        (["optimizer.zero=3", "parallel.dp=2", "parallel.dp_shard=3"], "parallel.dp_shard"),
        (["optimizer.zero=3", "parallel.dp=2", "parallel.dp_shard=2"], "parallel.dp_shard"),  # 4 blocks: dp is 2
        (["optimizer.zero=3", "parallel.dp=2", "parallel.dp_shard=-1"], "parallel.dp_shard"),
        (["optimizer.zero=2", "parallel.dp=2", "parallel.dp_shard=4"], "optimizer.zero"),
    ],
)
def test_a_bad_shard_degree_names_its_key_and_the_values_allowed(overrides, key):
    with pytest.raises(ConfigError) as err:
        load_config(MOE, overrides)
    assert err.value.key == key
    if key == "parallel.dp_shard" and "=-1" not in overrides[-1]:
        assert "4, 8" in err.value.allowed


def test_the_planner_tries_one_node_per_shard_where_a_stage_spans_nodes():
    request = PlanRequest(
        model="small-moe",
        num_gpus=32,
        global_batch=64,
        topology="uniform",  # 8 GPUs a node
        fixed=parse_fixes(["optimizer.zero=3", "parallel.pp=1", "parallel.ep=4", "schedule=1f1b", "parallel.tp=1"]),
    )
    points = candidates(request, load_model("small-moe"))
    assert {p.dp_shard for p in points} == {0, 8}  # a stage of 32 over 8-GPU nodes: shards of 8, 4 replicas
    hsdp = next(p for p in points if p.dp_shard)
    assert hsdp.config_sections()["parallel"]["dp_shard"] == 8 and "hsdp8" in hsdp.label()
    assert load_config({"model": "small-moe", **hsdp.config_sections()}).parallel.dp_replicate == 4
    fixed = PlanRequest(
        model="small-moe",
        num_gpus=32,
        global_batch=64,
        topology=request.topology,
        fixed=parse_fixes(
            [
                "optimizer.zero=3",
                "parallel.pp=1",
                "parallel.ep=4",
                "schedule=1f1b",
                "parallel.tp=1",
                "parallel.dp_shard=16",
            ]
        ),
    )
    assert {p.dp_shard for p in candidates(fixed, load_model("small-moe"))} == {16}


TOML = """
[model]
name = "mixtral"
flavor = "8x7b"
[training]
local_batch_size = 2
global_batch_size = 64
seq_len = 4096
[parallelism]
data_parallel_replicate_degree = {rep}
data_parallel_shard_degree = {shard}
pipeline_parallel_degree = {pp}
expert_parallel_degree = 8
{reshard}
[activation_checkpoint]
mode = "none"
"""


@pytest.mark.parametrize(
    "rep,shard,pp,reshard,zero,dp_shard,keeps",
    [
        (2, 8, 1, "", 3, 8, False),  # HSDP 2 x 8; torchtitan's default reshards without PP
        (1, 8, 2, "", 3, 0, True),  # FSDP over 8; default with PP: no resharding
        (2, 8, 2, 'fsdp_reshard_after_forward = "always"', 3, 8, False),
        (8, 1, 1, "", 0, 0, False),  # DDP only: no ZeRO
    ],
)
def test_torchtitan_fsdp_degrees_import_as_zero3_and_hsdp(tmp_path, rep, shard, pp, reshard, zero, dp_shard, keeps):
    path = tmp_path / "job.toml"
    path.write_text(TOML.format(rep=rep, shard=shard, pp=pp, reshard=reshard))
    cfg = load_config(import_torchtitan(path, model="mixtral-8x7b").config)
    assert cfg.zero == zero and cfg.parallel.dp_shard == dp_shard
    assert cfg.parallel.dp_replicate == (rep if zero == 3 else 1)
    assert cfg.reshard_after_forward is not keeps


def test_a_bad_torchtitan_reshard_policy_names_the_key(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text(TOML.format(rep=1, shard=8, pp=1, reshard='fsdp_reshard_after_forward = "sometimes"'))
    with pytest.raises(ConfigError) as err:
        import_torchtitan(path, model="mixtral-8x7b")
    assert err.value.key.endswith("fsdp_reshard_after_forward")
