"""ZeRO-3 / FSDP (optimizer.zero 3): the lowered schedule's gathers and reduce-scatters, the memory model's closed
forms, prefetch's overlap in the simulator and the estimator, the planner's space (docs/sharding.md)."""

from __future__ import annotations

import dataclasses
import math

import pytest
from conftest import one_gpu_nodes

from piper_sim.config import load_config
from piper_sim.errors import ConfigError
from piper_sim.planning.estimate import estimate_config
from piper_sim.planning.plan_fixes import parse_fixes
from piper_sim.planning.planner import PlanRequest, screen
from piper_sim.schedule.build import build_schedule
from piper_sim.schedule.io import schedule_from_csv, schedule_from_json, schedule_to_csv, schedule_to_json
from piper_sim.schedule.validate import check_schedule
from piper_sim.sim.stage_plans import build_stage_plans
from piper_sim.simulator import simulate
from piper_sim.workload.fsdp import delayed_by_reduce_s, exposed_backward_s, exposed_gather_s, unit_classes
from piper_sim.workload.fsdp_state import gathered_window_bytes, unit_params
from piper_sim.workload.memory import rank_params, state_bytes_per_param
from piper_sim.workload.parallel import TensorSplit
from piper_sim.workload.presets import load_model

MOE = "examples/small-moe.yaml"  # 8 layers, pp 2 x ep 4
DENSE = {"preset": "small-moe", "name": "small-dense", "num_layers": 4, "num_dense_layers": 4, "dense_ffn_dim": 1024}


def _two_nodes(nic_GBps: float) -> dict:
    """A dense 4-layer model on two GPUs, one per node, data-parallel: every gather crosses one NIC of nic_GBps."""
    return {
        "model": DENSE,
        "schedule": "1f1b",
        "optimizer": {"zero": 3},
        "cost": {"profile": "h100"},
        "parallel": {"pp": 1, "ep": 1, "dp": 2, "num_microbatches": 1, "micro_batch_size": 2},
        "topology": one_gpu_nodes(nic_GBps),
    }


def test_zero3_state_is_sixteen_bytes_over_the_replicas():
    # Rajbhandari et al. 2020, section 5.1: P_os+g+p = 16 / Nd (fp32 models: 4 + 4 + 8 over Nd)
    assert state_bytes_per_param(3, 8) == pytest.approx(16 / 8)
    assert state_bytes_per_param(3, 8, dtype_bytes=4) == pytest.approx(16 / 8)
    assert state_bytes_per_param(3, 1) == 16  # one replica: nothing to shard


def test_the_gathered_window_is_the_largest_two_units_twice():
    shards = {"dense": 4, "replicated": 1, "expert": 2}
    units = [
        {"dense": 10.0, "replicated": 5.0, "expert": 0.0},
        {"dense": 10.0, "replicated": 5.0, "expert": 100.0},
        {"dense": 30.0, "replicated": 5.0, "expert": 0.0},
    ]
    # gathered: the sharded classes only (10, 110, 30); the largest pair 140; parameters and gradients, 2 bytes each
    assert gathered_window_bytes(units, shards, 2) == 2 * 2 * 140
    assert gathered_window_bytes(units[:1], shards, 2) == 2 * 2 * 10


@pytest.mark.parametrize("tp", [1, 2])
def test_unit_classes_are_the_classes_a_unit_holds(tp):
    model = load_model("small-moe")
    split = TensorSplit(tp=tp, etp=1)
    for layers, first, last in (((0, 1), True, False), ((6, 7), False, True), ((), False, True), ((), True, False)):
        for unit, held in unit_params(model, layers, first=first, last=last, ep=2, split=split).items():
            positive = tuple(kind for kind in ("dense", "replicated", "expert") if held[kind] > 0)
            assert unit_classes(model, unit, last=last and unit == (layers[-1:] or (unit,))[0], tp=tp) == positive


def _program(overrides: list[str]):
    cfg = load_config(MOE, ["optimizer.zero=3", "parallel.dp=2", "parallel.num_microbatches=2", *overrides])
    schedule = build_schedule(cfg)
    check_schedule(schedule)
    return schedule


@pytest.mark.parametrize("overrides", [[], ["recompute=full"], ["schedule=interleaved-1f1b", "parallel.vpp=2"]])
def test_each_unit_is_gathered_before_its_forward_and_backward_and_reduced_after(overrides):
    schedule = _program(overrides)
    for program in schedule.stage_programs:
        at = {t.task_id: i for i, t in enumerate(program)}
        compute = [t for t in program if t.is_compute and t.kind != "optimizer"]
        units = {(t.chunk, t.microbatch, t.task_id[0], int(t.task_id.split(":")[3][1:])) for t in compute}
        for c, m, phase, u in units:
            gather = "F" if phase == "F" else "B"
            mine = [t for t in compute if t.task_id.startswith(f"{phase}:c{c}:m{m}:u{u}:")]
            gathers = [f"allgather:{gather}:param_{k}:c{c}:m{m}:u{u}" for k in ("dense", "expert")]
            assert all(program[at[g]].nonblocking for g in gathers)
            if phase != "R" and (phase == "F" or not any(t.startswith(f"R:c{c}:m{m}:u{u}:") for t in at)):
                assert set(gathers) <= set(mine[0].deps)  # the unit's first compute waits for its gathers
            assert max(at[g] for g in gathers) < at[mine[0].task_id]
            if phase == "B":  # its gradients reduce-scattered once its backward is done, deps on the last task
                for k, axis in (("dense", "ep_dp"), ("expert", "dp")):
                    rs = program[at[f"reducescatter:grad_{k}:c{c}:m{m}:u{u}"]]
                    assert rs.nonblocking and rs.group_axis == axis and rs.deps == (mine[-1].task_id,)
        # prefetch: unit k + 1's gather is issued after unit k's and before unit k's first compute task
        forward = sorted({u for c, m, ph, u in units if (c, m, ph) == (0, 0, "F")})
        for k, nxt in zip(forward, forward[1:], strict=False):
            g = program[at[f"allgather:F:param_dense:c0:m0:u{nxt}"]]
            assert f"allgather:F:param_dense:c0:m0:u{k}" in g.deps
            assert at[g.task_id] < at[f"F:c0:m0:u{k}:s0"]
        optimizer = program[at["optimizer"]]
        assert {t.task_id for t in program if t.kind == "reduce_scatter"} <= set(optimizer.deps)
        assert not [
            t
            for t in program
            if t.kind == "all_reduce"
            or (t.is_collective and t.role.startswith(("grad_", "param_")) and not t.nonblocking)
        ]  # no step-end reductions, no gather after the optimizer


def test_nonblocking_survives_the_schedule_files(tmp_path):
    schedule = _program([])
    assert schedule_from_json(schedule_to_json(schedule)) == schedule
    schedule_to_csv(schedule, tmp_path / "z3.csv")
    back = schedule_from_csv(
        tmp_path / "z3.csv",
        schedule.mesh,
        name=schedule.name,
        num_microbatches=schedule.num_microbatches,
        vpp=schedule.vpp,
        lowered=True,
    )
    assert back == dataclasses.replace(schedule, stage_layers=())
    assert sum(t.nonblocking for t in back.stage_programs[0]) > 0


def test_zero3_memory_in_the_simulator_is_the_closed_form():
    cfg = load_config(_two_nodes(12.5))
    params = rank_params(cfg.model, (0, 1, 2, 3), first=True, last=True, ep=1)["dense"]
    units = list(unit_params(cfg.model, (0, 1, 2, 3), first=True, last=True, ep=1).values())
    window = gathered_window_bytes(units, {"dense": 2, "replicated": 1, "expert": 1}, 2)
    assert window == 2 * 2 * max(sum(units[i]["dense"] for i in (k, k + 1)) for k in range(3))
    plan = build_stage_plans(build_schedule(cfg), cfg.model, cfg.parallel, True, zero=3)[0]
    assert plan.state_bytes == pytest.approx(params * 16 / 2) and plan.transient_bytes == pytest.approx(window)
    plain = simulate(load_config(_two_nodes(12.5) | {"optimizer": {"zero": 0}})).report.peak_memory_bytes[0]
    sharded = simulate(cfg).report.peak_memory_bytes[0]
    assert plain - sharded == pytest.approx(params * (16 - 8) - window, rel=1e-12)


def _forward(nic_GBps: float):
    result = simulate(load_config(_two_nodes(nic_GBps)))
    t = result.trace[result.trace["rank"] == 0].set_index("task_id")
    gathers = [t.loc[f"allgather:F:param_dense:c0:m0:u{u}"] for u in range(4)]
    computes = [t.loc[f"F:c0:m0:u{u}:s0"] for u in range(4)]
    return result, gathers, computes


def test_prefetch_hides_a_gather_shorter_than_the_unit_before_it():
    result, gathers, computes = _forward(12.5)  # a unit's gather (~90 us) under its forward (~100 us)
    assert math.isfinite(result.report.step_time_s)
    assert computes[0].start_s == pytest.approx(gathers[0].end_s)  # the first gather is exposed
    for k in range(1, 4):
        assert gathers[k].start_s == pytest.approx(max(gathers[k - 1].end_s, computes[k - 1].start_s))
        assert gathers[k].end_s < computes[k - 1].end_s  # hidden: the unit starts when the one before it ends
        assert computes[k].start_s == pytest.approx(computes[k - 1].end_s)


def test_a_gather_longer_than_the_unit_before_it_is_exposed_by_the_difference():
    _, gathers, computes = _forward(0.05)  # 2 MB at 50 MB/s: ~22 ms per gather, ~0.1 ms per unit
    for k in range(4):
        unit_bytes = gathers[k].bytes  # each member sends its half over its NIC: a ring all-gather of 2, (N-1)/N S
        assert gathers[k].end_s - gathers[k].start_s == pytest.approx(unit_bytes / 2 / 0.05e9, rel=1e-3)
        assert computes[k].start_s == pytest.approx(gathers[k].end_s)
    for k in range(1, 4):  # one gather stream: each starts when the one before it ends
        assert gathers[k].start_s == pytest.approx(gathers[k - 1].end_s)


def test_exposed_gather_closed_form():
    assert exposed_gather_s([5.0, 3.0, 9.0], [4.0, 4.0, 4.0]) == 5.0 + 0.0 + 5.0
    assert exposed_gather_s([], []) == 0.0


def test_exposed_backward_closed_form():
    """Unit k's gather moves beside unit k - 2's reduce-scatter (issued when that unit's backward ended); the
    second-to-last unit's reduce-scatter runs beside the last unit's compute."""
    # moving [5, 3, 9 + 1, 2 + 2] against computes [4, 4, 4]: 5 + 0 + 6 + 0; the tail 3 - 4 hides
    assert exposed_backward_s([5.0, 3.0, 9.0, 2.0], [1.0, 2.0, 3.0, 4.0], [4.0, 4.0, 4.0, 4.0]) == 11.0
    # a reduce-scatter of 8 beside a last compute of 2 leaves 6 more
    assert exposed_backward_s([5.0, 3.0, 9.0, 2.0], [1.0, 2.0, 8.0, 1.0], [4.0, 4.0, 4.0, 2.0]) == 17.0
    assert exposed_backward_s([0.0, 0.0], [3.0, 1.0], [2.0, 2.0]) == 1.0  # a backward that gathers nothing
    assert exposed_backward_s([], [], []) == 0.0


@pytest.mark.parametrize("microbatches", [1, 4])
@pytest.mark.parametrize("nic_GBps", [12.5, 0.5, 0.05])
def test_the_estimate_prices_what_prefetch_leaves_exposed(nic_GBps, microbatches):
    """Hidden (12.5 GB/s) or exposed (slower NICs: the backward's gathers and reduce-scatters share the NIC), within
    2%; with several micro-batches each forward's first gather also shares the NIC with the reduce-scatter the
    backward before it issued last (without that term the estimate is 3-7% fast)."""
    cfg = _two_nodes(nic_GBps)
    cfg["parallel"]["num_microbatches"] = microbatches
    estimate = estimate_config(load_config(cfg))[0].step_time_s
    simulated = simulate(load_config(cfg)).report.step_time_s
    assert estimate == pytest.approx(simulated, rel=0.02)


def test_a_reduce_scatter_delays_the_gather_it_starts_with_by_the_shorter():
    assert delayed_by_reduce_s(3.0, 5.0) == 3.0  # both at half rate: the gather ends at 6
    assert delayed_by_reduce_s(3.0, 1.0) == 1.0  # half rate for 2, then alone for 2: it ends at 4
    assert delayed_by_reduce_s(3.0, 0.0) == 0.0


def test_zero3_refusals_name_the_key():
    with pytest.raises(ConfigError) as err:
        load_config(MOE, ["optimizer.zero=3", "parallel.dp=2", "schedule=zb-h1"])
    assert err.value.key == "optimizer.zero"
    from piper_sim.measure import measure

    with pytest.raises(ConfigError) as err:  # a real run gathers no per-unit checkpoint to recompute from
        measure(load_config(MOE, ["optimizer.zero=3", "parallel.dp=2", "recompute=full"]), None)
    assert err.value.key == "recompute"


def test_the_planner_ranks_zero3_first_where_only_it_fits():
    request = PlanRequest(
        model=DENSE | {"num_layers": 8, "num_dense_layers": 8},
        num_gpus=8,
        global_batch=8,
        topology="uniform",
        profile="h100",
        fixed=parse_fixes(["parallel.pp=1", "parallel.tp=1"]),
    )
    _, table, hbm, _ = screen(request)
    assert set(table["zero"]) == {0, 1, 2, 3}
    least = table.groupby("zero")["peak_memory_bytes"].min()
    assert least[3] < least[[0, 1, 2]].min()
    squeezed = PlanRequest(**{**request.__dict__, "reserve_bytes": hbm - (least[3] + least[[0, 1, 2]].min()) / 2})
    _, table, _, _ = screen(squeezed)
    fits = table[table["fits"]].sort_values("est_step_time_s")
    assert len(fits) and set(fits["zero"]) == {3}


@pytest.mark.parametrize(("topology", "together"), [("frontier", 2.0), ("uniform", 1.0)])
def test_a_sharded_collective_runs_with_its_sibling_groups(topology, together):
    """Every rank of a stage gathers the same unit at once over its own replicas: with TP 2 on Frontier both GCDs of
    a package send their rings through the package's one NIC (twice one ring's bytes), on the uniform cluster each
    GPU has its own NIC (no slower than alone)."""
    from piper_sim.collectives.algorithms import ALL_REDUCE
    from piper_sim.collectives.sharded import ALL_GATHER
    from piper_sim.planning.estimate import config_estimator

    cfg = load_config(
        MOE,
        [
            f"topology={topology}",
            "parallel.pp=1",
            "parallel.ep=2",
            "parallel.dp=8",
            "parallel.tp=2",
            "optimizer.zero=3",
        ],
    )
    est, point = config_estimator(cfg)
    dense = est._replica_groups(point, 0)["dense"]
    siblings = est._siblings(tuple(dense))
    assert len(siblings) == 2 and set(siblings[1]) == {g for g in est.gpus[:32] if g not in dense}
    size = 2e9  # a large gather: the links' time, not the messages' overhead, decides
    alone = est.phases_s(ALL_GATHER.get(est.all_reduce, "")(size, list(dense), est.topo), tuple(dense))
    assert est._sharded_s(ALL_GATHER, size, dense) == pytest.approx(together * alone, rel=0.02)
    # the data-parallel all-reduce without ZeRO likewise; a group priced alone (DualPipe's mirror stages) is not
    all_reduce = ALL_REDUCE.get(est.all_reduce, "")
    alone = est.phases_s(all_reduce(size, list(dense), est.topo), tuple(dense))
    params = size / est.model.dtype_bytes
    assert est._reduce_group_s(params, dense, 0) == pytest.approx(together * alone, rel=0.02)
    assert est._reduce_group_s(params, dense, 0, alone=True) == alone
