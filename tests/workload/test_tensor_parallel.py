"""Tensor and sequence parallelism in the plan, the lowered schedule, the simulator and the memory model
(docs/tensor-parallel.md)."""

from __future__ import annotations

from collections import Counter

import pytest

from piper_sim.config import load_config
from piper_sim.errors import ConfigError
from piper_sim.schedule.build import build_schedule
from piper_sim.schedule.validate import check_schedule, dry_run
from piper_sim.simulator import simulate
from piper_sim.workload.memory import layer_activation_bytes, rank_params
from piper_sim.workload.parallel import TensorSplit
from piper_sim.workload.presets import load_model

BASE = "examples/small-moe.yaml"  # 8 layers, d 256, 8 heads, 8 experts; pp 2 x ep 4, 8 microbatches of 2
DENSE = ["model.num_dense_layers=8", "model.dense_ffn_dim=1024"]  # the same model with dense FFNs only
ONE_STAGE = ["parallel.pp=1", "parallel.ep=2", "parallel.tp=2", "parallel.num_microbatches=4"]


def _tp_tasks(schedule) -> Counter:
    return Counter(t.kind.value for program in schedule.stage_programs for t in program if t.role == "tp")


@pytest.mark.parametrize("sp", [False, True])
def test_tp_collectives_per_layer_are_megatrons(sp):
    """Megatron TP (Korthikanti et al. 2022, section 4.2.2): per transformer layer and micro-batch, two
    all-reduces in the forward and two in the backward, each of b x s x h elements; with sequence parallelism
    each becomes a reduce-scatter plus an all-gather of the same tensor. The vocabulary-parallel embedding and
    head add one region boundary each."""
    cfg = load_config(BASE, DENSE + ONE_STAGE + [f"parallel.sp={str(sp).lower()}"])
    schedule = build_schedule(cfg)
    layers, microbatches = cfg.model.num_layers, cfg.parallel.num_microbatches
    per_microbatch = 4 * layers + 2
    expected = (
        {"all_gather": per_microbatch, "reduce_scatter": per_microbatch} if sp else {"all_reduce": per_microbatch}
    )
    assert _tp_tasks(schedule) == {k: v * microbatches for k, v in expected.items()}
    trace = simulate(cfg, schedule).trace
    tp_rows = trace[trace["role"] == "tp"]
    element_bytes = cfg.parallel.micro_batch_size * cfg.model.seq_len * cfg.model.d_model * cfg.model.dtype_bytes
    assert len(tp_rows) == sum(expected.values()) * microbatches * cfg.parallel.num_gpus
    assert (tp_rows["bytes"] == element_bytes).all()


def test_sequence_parallelism_moves_what_the_all_reduces_move():
    """A reduce-scatter plus an all-gather move exactly one all-reduce's bytes over the links (ring halves)."""
    links = {}
    for sp in ("false", "true"):
        result = simulate(load_config(BASE, DENSE + ONE_STAGE + [f"parallel.sp={sp}"]))
        links[sp] = result.links["bytes"].sum()
    assert links["true"] == pytest.approx(links["false"], rel=1e-9)


@pytest.mark.parametrize(("etp", "sp"), [(1, False), (1, True), (2, False), (2, True)])
def test_moe_blocks_lower_validate_and_dry_run(etp, sp):
    cfg = load_config(BASE, ["parallel.tp=2", f"parallel.etp={etp}", f"parallel.sp={str(sp).lower()}"])
    schedule = build_schedule(cfg)
    check_schedule(schedule)
    dry_run(schedule)
    kinds = _tp_tasks(schedule)
    if etp == 1 and sp:  # the MoE block runs on the rank's sequence slice: only attention and the ends
        assert kinds["all_gather"] == kinds["reduce_scatter"] == (2 * 8 + 2) * 8
    elif etp == 1:  # each rank routes its slice; the block's output is gathered (forward), its input gradient too
        assert kinds["all_gather"] == 2 * 8 * 8 and kinds["all_reduce"] == (2 * 8 + 2) * 8
    else:  # experts split like a dense FFN
        key = "all_gather" if sp else "all_reduce"
        assert kinds[key] == (4 * 8 + 2) * 8


def test_etp1_ranks_route_their_slice_and_hold_different_experts():
    whole = simulate(load_config(BASE, ["parallel.tp=2", "parallel.etp=2"]))
    sliced = simulate(load_config(BASE, ["parallel.tp=2"]))
    a2a = lambda r: r.trace[(r.trace["kind"] == "all_to_all")]["bytes"].sum() / r.report.num_gpus  # noqa: E731
    assert a2a(sliced) == pytest.approx(a2a(whole) / 2, rel=1e-9)  # each rank routes half the tokens
    assert sliced.report.num_gpus == 8 and whole.report.num_gpus == 16


def test_megatron_form_is_the_same_plan():
    """Megatron-core: TP 2, PP 2, EP 4, DP 4 on 16 GPUs, experts carved out of the 8 (TP x DP) ranks of a stage:
    ETP 2 -> expert-dp 1; ETP 1 -> expert-dp 2."""
    for etp, dp in ((2, 1), (1, 2)):
        megatron = load_config(
            BASE,
            ["parallel.convention=megatron", "parallel.tp=2", "parallel.ep=4", "parallel.dp=4", f"parallel.etp={etp}"],
        )
        piper = load_config(BASE, ["parallel.tp=2", "parallel.ep=4", f"parallel.dp={dp}", f"parallel.etp={etp}"])
        assert megatron.parallel == piper.parallel
        assert megatron.parallel.num_gpus == 16  # pp 2 x tp 2 x dp 4
    default = load_config(BASE, ["parallel.convention=megatron", "parallel.tp=2", "parallel.ep=4", "parallel.dp=4"])
    assert default.parallel.etp == 2  # Megatron-core's default: the experts split like the dense layers


def test_activation_memory_follows_korthikanti():
    """Korthikanti et al. 2022, section 4.2: with tensor parallelism only the layer's norm inputs and outputs stay
    whole on each rank (their 10 s b h of 34 s b h also counts dropout masks; this model has no dropout, so the
    whole part is the two norms' inputs and outputs, 4 s b h elements); with sequence parallelism every term is
    divided by t. Checked per layer for a dense layer and for a MoE layer whose tensor-parallel ranks route their
    own slices of the tokens (etp 1: routed rows, combine rows, router probabilities and shared experts divide
    by t like the FFN's inner activations), with flash attention off so the score matrix counts."""
    dense = load_model({"preset": "small-moe", "num_dense_layers": 8, "dense_ffn_dim": 1024})
    moe = load_model({"preset": "small-moe", "num_shared_experts": 1})
    b = 2
    for model in (dense, moe):
        whole = layer_activation_bytes(model, 0, b, keep_scores=True)
        norms = 4 * b * model.seq_len * model.d_model * model.dtype_bytes
        for t in (2, 4, 8):
            tp = layer_activation_bytes(model, 0, b, keep_scores=True, split=TensorSplit(tp=t))
            sp = layer_activation_bytes(model, 0, b, keep_scores=True, split=TensorSplit(tp=t, sp=True))
            assert tp == pytest.approx(norms + (whole - norms) / t, rel=0.02), (model.name, t)
            assert sp == pytest.approx(whole / t, rel=0.02), (model.name, t)


def test_a_tp_group_holds_each_split_parameter_once():
    for name in ("small-moe", "deepseek-v3"):
        model = load_model(name)
        layers = tuple(range(min(model.num_layers, 6)))
        ends = {"first": True, "last": True, "ep": 8}
        one = rank_params(model, layers, **ends)
        for etp in (1, 2):
            two = rank_params(model, layers, **ends, split=TensorSplit(tp=2, etp=etp))
            assert 2 * two["dense"] + two["replicated"] == pytest.approx(one["dense"], rel=1e-12)
            assert two["expert"] * etp == pytest.approx(one["expert"], rel=1e-12)


def test_zero_shards_each_parameter_class_over_its_replicas():
    """ZeRO-1 (Rajbhandari et al. 2020): 2 + 2 + 12 / N bytes per parameter, N the replicas of that parameter:
    dense TP shards over dp x ep x etp / tp, the stage-replicated ones over the stage, experts over dp."""
    cfg = load_config(BASE, ["parallel.tp=2", "parallel.dp=2", "optimizer.zero=1"])
    result = simulate(cfg)
    plan_model = cfg.model
    layers = tuple(range(4))
    params = rank_params(plan_model, layers, first=True, last=False, ep=4, split=cfg.parallel.split)
    n_dense, n_stage, n_expert = 4, 8, 2  # dp 2 x ep 4 x etp 1 / tp 2; 8 ranks per stage; dp 2
    state = (
        params["dense"] * (4 + 12 / n_dense)
        + params["replicated"] * (4 + 12 / n_stage)
        + params["expert"] * (4 + 12 / n_expert)
    )
    from piper_sim.sim.stage_plans import build_stage_plans

    plans = build_stage_plans(build_schedule(cfg), cfg.model, cfg.parallel, True, zero=1)
    assert plans[0].state_bytes == pytest.approx(state, rel=1e-12)
    assert result.report.fits_memory


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["parallel.tp=3"], "parallel.tp"),  # 8 heads
        (["parallel.tp=2", "model.num_kv_heads=1"], "parallel.tp"),
        (["parallel.tp=2", "parallel.ep=4", "model.num_dense_layers=1", "model.dense_ffn_dim=1001"], "parallel.tp"),
        (["parallel.sp=true"], "parallel.sp"),
        (["parallel.tp=2", "parallel.etp=4"], "parallel.etp"),
        (["parallel.tp=8", "parallel.ep=4"], "parallel.tp"),  # etp 1: tp must divide ep
        (["parallel.tp=2", "parallel.etp=2", "parallel.ep=1", "parallel.pp=2"], None),  # valid
        (["parallel.tp=2", "parallel.ep=2", "parallel.pp=1", "optimizer.zero=1"], "optimizer.zero"),
        (["parallel.convention=nemo"], "parallel.convention"),
        (["parallel.convention=megatron", "parallel.tp=2", "parallel.ep=8", "parallel.dp=3"], "parallel.dp"),
    ],
)
def test_bad_tensor_plans_name_their_key(overrides, key):
    if key is None:
        load_config(BASE, overrides)
        return
    with pytest.raises(ConfigError) as err:
        load_config(BASE, overrides)
    assert err.value.key == key


def test_a_tp_group_split_over_nodes_is_refused():
    cfg = load_config(
        BASE,
        [
            "parallel.tp=8",
            "parallel.ep=8",
            "parallel.etp=8",
            "parallel.pp=1",
            "topology=fat-tree",
            "topology.params.gpus_per_node=4",
        ],
    )
    with pytest.raises(ConfigError) as err:
        simulate(cfg)
    assert err.value.key == "parallel.tp" and "inside one node" in str(err.value)


@pytest.mark.parametrize(("tp", "etp", "sp"), [(2, 1, True), (2, 1, False), (2, 2, True)])
def test_the_planner_prices_tensor_parallel_plans_as_the_simulator_does(tp, etp, sp):
    """The resource model equals the simulator's peak memory; the estimator is within 15% of the DES step."""
    from piper_sim.planning.estimate import Estimator
    from piper_sim.planning.plan_point import PlanPoint
    from piper_sim.planning.resource import stage_memory
    from piper_sim.topology.load import load_topology
    from piper_sim.topology.placement import place
    from piper_sim.workload.profile_load import load_profile

    model = load_model("small-moe")
    point = PlanPoint(
        pp=2,
        ep=4,
        dp=1,
        vpp=1,
        micro_batch_size=2,
        num_microbatches=8,
        schedule="1f1b",
        all_to_all="flat",
        tp=tp,
        etp=etp,
        sp=sp,
    )
    topo = load_topology("frontier", point.num_gpus)
    estimate = Estimator(model, topo, place(topo, point.num_gpus, "contiguous"), load_profile("mi250x")).estimate(point)
    result = simulate(load_config({"model": "small-moe", "topology": "frontier", **point.config_sections()}))
    assert max(m.peak_bytes for m in stage_memory(model, point)) == pytest.approx(
        max(result.report.peak_memory_bytes), rel=1e-9
    )
    assert estimate.step_time_s == pytest.approx(result.report.step_time_s, rel=0.15)
