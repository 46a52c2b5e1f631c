"""Calibration: fits recover known numbers from synthetic times; a quick measured calibration writes a
profile that the cost model loads, with increasing curves and efficiencies in (0, 1]."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
import yaml

from piper_sim.calibrate import fit
from piper_sim.calibrate.record_fits import core_sharing_summary
from piper_sim.calibrate.records_to_profile import aggregate, build_profile
from piper_sim.errors import ConfigError
from piper_sim.paths import data_dir
from piper_sim.workload.profile_load import load_host_profile, load_profile, load_profiles

SIZES = [2**p for p in range(10, 25, 2)]  # 1 KiB .. 16 MiB


def test_overhead_and_bandwidth_are_recovered_exactly_from_a_linear_model():
    times = [3e-6 + s / 20e9 for s in SIZES]
    f = fit.fit_overhead_bandwidth(SIZES, times)
    assert f.overhead_s == pytest.approx(3e-6, rel=1e-9)
    assert f.bandwidth_per_s == pytest.approx(20e9, rel=1e-9)
    assert f.rms_relative_error < 1e-9
    assert f.time_s(1e6) == pytest.approx(3e-6 + 1e6 / 20e9)


def test_overhead_and_bandwidth_survive_noise():
    rng = np.random.default_rng(0)
    times = [(40e-6 + s / 2.5e9) * rng.uniform(0.97, 1.03) for s in SIZES]
    f = fit.fit_overhead_bandwidth(SIZES, times)
    assert f.overhead_s == pytest.approx(40e-6, rel=0.1)
    assert f.bandwidth_per_s == pytest.approx(2.5e9, rel=0.05)


def test_a_negative_term_is_dropped_not_fitted():
    # times fall with size: the best non-negative model is a constant (no bandwidth term)
    f = fit.fit_overhead_bandwidth([1, 2, 4], [4e-6, 3e-6, 2e-6])
    assert f.bandwidth_per_s == math.inf
    assert f.overhead_s > 0


def _gemm_points(peak: float, launch: float, curve: dict[int, float]) -> list[tuple[int, int, int, float, float]]:
    """(rows, k, n, flops, time) of GEMMs that run at exactly curve[rows] x peak after a fixed launch."""
    points = []
    for k, n in ((64, 128), (256, 512), (512, 256)):
        for rows, eff in curve.items():
            flops = 2.0 * rows * k * n
            points.append((rows, k, n, flops, launch + flops / (peak * eff)))
    return points


def test_peak_and_efficiency_curve_are_recovered_net_of_the_launch_overhead():
    peak, launch = 80e9, 2e-6
    curve = {1: 0.1, 16: 0.5, 256: 0.9, 4096: 1.0}
    points = _gemm_points(peak, launch, curve)
    rows, _, _, flops, times = zip(*points, strict=True)
    assert fit.peak_rate(flops, times, launch) == pytest.approx(peak)
    xs, eff = fit.efficiency_curve(rows, flops, times, peak, launch)
    assert xs == sorted(curve)
    assert eff == pytest.approx([curve[r] for r in xs])


def test_optimizer_fit_recovers_per_tensor_and_per_parameter_costs():
    params = [p for p in (16384, 262144, 4194304) for _ in (1, 16, 64)]
    tensors = [t for _ in (16384, 262144, 4194304) for t in (1, 16, 64)]
    times = [5e-6 + 12e-6 * t + 1.5e-9 * p for p, t in zip(params, tensors, strict=True)]
    fixed, per_tensor, per_param, rms = fit.fit_optimizer(params, tensors, times)
    assert (fixed, per_tensor, per_param) == pytest.approx((5e-6, 12e-6, 1.5e-9))
    assert rms < 1e-9
    assert fit.optimizer_bytes_per_param(per_param, 40e9) == pytest.approx(60.0)


MACHINE = {
    "platform": "test",
    "processor": "synthetic",
    "cpu_count": 4,
    "ranks": 2,
    "threads_per_rank": 2,
    "dtype": "float32",
    "memory_GiB": 16.0,
}


def _synthetic_records(rank_scale: float) -> list[dict]:
    """Records a machine with launch 2 us, peak 80 GFLOP/s, 40 GB/s and Adam at 1.5 ns/param would give."""
    launch, peak, bw = 2e-6, 80e9, 40e9
    recs: list[dict] = []
    for grad in (False, True):
        recs += [
            {"bench": "tiny", "op": op, "autograd": grad, "time_s": launch * rank_scale}
            for op in ("add", "mul", "softmax", "linear")
        ]
    for rows, k, n, flops, t in _gemm_points(peak, launch, {1: 0.1, 16: 0.5, 256: 0.9, 4096: 1.0}):
        recs.append(
            {
                "bench": "gemm",
                "rows": rows,
                "k": k,
                "n": n,
                "label": f"{k}x{n}",
                "flops": flops,
                "time_s": t * rank_scale,
            }
        )
    for seq, eff in ((64, 0.2), (256, 0.4)):
        flops = 2.0 * 2 * seq * seq * 4 * 16
        recs.append(
            {
                "bench": "attention",
                "seq_len": seq,
                "batch": 2,
                "heads": 4,
                "head_dim": 16,
                "label": "a",
                "flops": flops,
                "time_s": (launch + flops / (peak * eff)) * rank_scale,
            }
        )
    for size in SIZES[:6]:
        for op in ("add", "mul"):
            recs.append(
                {
                    "bench": "elementwise",
                    "op": op,
                    "tensor_bytes": size,
                    "bytes": 3 * size,
                    "time_s": (launch + 3 * size / bw) * rank_scale,
                }
            )
    for p, t in ((16384, 1), (16384, 16), (4194304, 1), (4194304, 16)):
        recs.append({"bench": "optimizer", "params": p, "tensors": t, "time_s": (12e-6 * t + 1.5e-9 * p) * rank_scale})
    for op, kernels, views in (("embed", 1, 0), ("attn:0", 43, 31), ("router:0", 22, 6), ("head", 10, 8)):
        for direction, per_op, per_aten in (("fwd", 10e-6, 3e-6), ("bwd", 20e-6, 2e-6)):
            for tokens in (8, 256):  # index work grows with the tokens: 0.1 us per token
                t = (per_op + per_aten * (kernels + views) + 1e-7 * tokens) * rank_scale
                recs.append(
                    {
                        "bench": "framework",
                        "op": op,
                        "pass": direction,
                        "kernels": kernels,
                        "views": views,
                        "tokens": tokens,
                        "time_s": t,
                    }
                )
                if direction == "bwd":  # the zero-bubble split: 90% in the input pass, 20% in the weight pass
                    recs += [
                        {
                            "bench": "framework",
                            "op": op,
                            "pass": split,
                            "kernels": 0,
                            "views": 0,
                            "tokens": tokens,
                            "time_s": share * t,
                        }
                        for split, share in (("bwd_input", 0.9), ("bwd_weight", 0.2))
                    ]
    # the experts op (10 ATen ops) with 2, 4 and 8 experts: on the per-op law at 4 experts, 5 us per expert
    for direction, per_op, per_aten in (("fwd", 10e-6, 3e-6), ("bwd", 20e-6, 2e-6)):
        for experts in (2, 4, 8):
            for tokens in (8, 256):
                recs.append(
                    {
                        "bench": "framework",
                        "op": "experts:0",
                        "pass": direction,
                        "kernels": 10,
                        "views": 0,
                        "tokens": tokens,
                        "num_experts": experts,
                        "time_s": (per_op + per_aten * 10 + 5e-6 * (experts - 4) + 1e-7 * tokens) * rank_scale,
                    }
                )
    if rank_scale == 1.0:  # rank 0 only, as the benchmark records it
        # a blocking exchange: 0.7 ms back to back, 1.3 and 2.3 ms at 0.7 and 1.3 ranks computing per core
        recs += [
            {
                "bench": "blocking_wait",
                "preset": "tiny-moe",
                "ranks_per_core": k,
                "cores": 4,
                "processes": 4 * k,
                "computing_per_core": load,
                "time_s": t,
                "median_s": t,
                "window_means_s": [t],
                "exchanges": 50,
                "calls_per_exchange": 2,
                "hot_s": 700e-6,
                "hot_median_s": 600e-6,
                "count_bytes": 16,
                "row_bytes": 99984,
            }
            for k, load, t in ((1, 0.7, 1.3e-3), (2, 1.3, 2.3e-3))
        ]
        recs.append({"bench": "scheduler_slice", "time_s": 4e-3})
        recs += [
            {
                "bench": "core_sharing",
                "ranks_per_core": k,
                "cores": 4,
                "preset": "tiny-moe",
                "time_s": t,
                "window_means_s": [t],
                "cores_used": 3.98,
                "window_s": 2.0,
            }
            for k, t in ((1, 4e-3), (2, 4.6e-3), (4, 5.2e-3))
        ]
    for size in SIZES:
        recs.append(
            {"bench": "p2p", "level": "local", "pairs": 1, "bytes": size, "time_s": (30e-6 + size / 2e9) * rank_scale}
        )
        recs.append(
            {
                "bench": "all_to_all",
                "level": "local",
                "group_size": 2,
                "groups": 1,
                "bytes": size,
                "time_s": 100e-6 + size / 1e9,
            }
        )
    return recs


def test_profile_from_synthetic_records_has_the_machine_numbers_and_loads():
    per_rank = [{"rank": r, "machine": MACHINE, "records": _synthetic_records(s)} for r, s in enumerate((1.0, 1.0))]
    profile = build_profile(
        name="synthetic",
        per_rank=per_rank,
        testbed_per_rank=None,
        quick=True,
        command="test",
        versions={"torch": "x"},
        wall_s=1.0,
    )
    assert profile["kernel_launch_us"] == pytest.approx(2.0)
    assert profile["device_kind"] == "cpu"  # it matches the CPU testbeds' device_profile (profile_choice)
    assert profile["peak_bf16_TFLOPS"] == pytest.approx(0.08)
    assert profile["hbm_bandwidth_GBps"] == pytest.approx(40.0, rel=1e-3)
    assert profile["optimizer_bytes_per_param"] == pytest.approx(1.5e-9 * 40e9, rel=1e-3)
    assert profile["gemm_efficiency"] == {"rows": [1, 16, 256, 4096], "efficiency": [0.1, 0.5, 0.9, 1.0]}
    assert profile["attention_efficiency"]["efficiency"] == pytest.approx([0.2, 0.4], rel=1e-3)
    p2p = profile["measurements"]["network"]["local"]["p2p"]["pairs_1"]["fit"]
    assert p2p["overhead_us"] == pytest.approx(30.0, rel=1e-3)
    assert p2p["bandwidth_GBps"] == pytest.approx(2.0, rel=1e-3)
    framework = profile["measurements"]["framework_overhead"]
    assert (framework["forward"]["per_op_us"], framework["forward"]["per_aten_op_us"]) == pytest.approx(
        (10.8, 3), rel=1e-3
    )  # fitted at the fewest tokens (8: 0.8 us of index work in every op)
    assert (framework["backward"]["per_op_us"], framework["backward"]["per_aten_op_us"]) == pytest.approx(
        (20.8, 2), rel=1e-3
    )
    router = framework["forward"]["ops"]["router:0"]
    assert router["tokens"] == [8, 256]
    assert router["time_us_by_tokens"] == pytest.approx([10 + 3 * 28 + 0.8, 10 + 3 * 28 + 25.6])
    wait = profile["measurements"]["blocking_wait"]
    # priced: two calls of 100 us + bytes at 1 GB/s (16 + 99984 bytes) = 300 us; the rest is the extra, per call
    assert wait["priced_us"] == pytest.approx(300.0, rel=1e-3)
    assert wait["computing_per_core"] == [0.0, 0.7, 1.3]
    assert wait["extra_per_call_us"] == pytest.approx([200, 500, 1000], rel=1e-3)
    assert wait["scheduler_slice_us"] == pytest.approx(4000)
    sharing = profile["measurements"]["core_sharing"]
    assert sharing["ranks_per_core"] == [1, 2, 4] and sharing["cpu_time_factor"] == pytest.approx([1.0, 1.15, 1.3])
    cost, host = load_profiles(profile)
    assert host.core_sharing_factor(1) == 1.0 and host.core_sharing_factor(0.5) == 1.0
    assert host.core_sharing_factor(3) == pytest.approx(1.225)  # interpolated between the levels measured
    assert host.core_sharing_factor(8) == pytest.approx(1.3)  # flat beyond the last level
    assert host.scheduler_slice_s == pytest.approx(4e-3)
    assert host.blocking_wait_s(0) == pytest.approx(200e-6, rel=1e-3)
    assert host.blocking_wait_s(0.35) == pytest.approx(350e-6, rel=1e-3)  # interpolated in the load
    assert host.blocking_wait_s(5) == pytest.approx(1000e-6, rel=1e-3)  # flat beyond the last level
    assert cost.kernel_launch_s == pytest.approx(2e-6)
    assert cost.hbm_bytes == pytest.approx(8 * 2**30)  # memory per rank


def test_core_sharing_factor_is_the_median_of_each_rounds_ratio_to_one_process_per_core():
    # the machine ran twice as slow in round 2: the ratio of the means (7.0 / 6.0 ms at 2 per core) would mix
    # that drift into the factor; each round's ratio is 1.1 or 1.2, and a third round's outlier does not move it
    def level(k: int, means_ms: list[float]) -> dict:
        return {
            "bench": "core_sharing",
            "ranks_per_core": k,
            "cores": 2,
            "preset": "tiny-moe",
            "time_s": sum(means_ms) / len(means_ms) * 1e-3,
            "window_means_s": [m * 1e-3 for m in means_ms],
            "cores_used": 2.0,
            "window_s": 1.0,
        }

    summary = core_sharing_summary([level(2, [4.4, 9.6, 6.0]), level(1, [4.0, 8.0, 4.0])])
    assert summary["ranks_per_core"] == [1, 2]
    assert summary["factor_by_round"] == [[1.0, 1.0, 1.0], [1.1, 1.2, 1.5]]
    assert summary["cpu_time_factor"] == pytest.approx([1.0, 1.2])
    # the machine's reference speed is one process per core's median round
    raw = yaml.safe_load((data_dir("traces/profiles") / "cpu-2rank.yaml").read_text())
    raw["measurements"]["core_sharing"] = summary
    host = load_host_profile(raw)
    assert host.reference_cpu_s == pytest.approx(4e-3) and host.reference_preset == "tiny-moe"
    summary["window_means_us"][0] = ["slow"]
    with pytest.raises(ConfigError, match="core_sharing"):
        load_profile(raw)


def test_calibrations_merge_into_the_median_of_each_measured_number(tmp_path):
    from piper_sim.calibrate.calibration import merge_calibrations, refit_profile
    from piper_sim.errors import PiperError

    def raw(scale: float, rounds: list[float]) -> dict:
        per_rank = [
            {
                "rank": r,
                "machine": MACHINE,
                "records": [dict(rec, time_s=rec["time_s"] * scale) for rec in _synthetic_records(s)],
                "compute_cpu_share": 0.9,
            }
            for r, s in enumerate((1.0, 0.5))
        ]
        for rec in per_rank[0]["records"]:
            if rec["bench"] == "core_sharing":
                rec["window_means_s"] = [t * rec["time_s"] for t in rounds]
        return {
            "per_rank": per_rank,
            "testbed_per_rank": None,
            "quick": True,
            "command": f"calibrate x{scale}",
            "versions": {"torch": "x"},
            "wall_s": 60.0,
        }

    # three calibrations, the machine 1x, 3x and 1.5x as slow: each number is the middle one
    raws = [raw(1.0, [1.0]), raw(3.0, [2.0, 2.0]), raw(1.5, [1.0])]
    merged = merge_calibrations(raws, ["a", "b", "c"])
    for got, *each in zip(merged["per_rank"][1]["records"], *(r["per_rank"][1]["records"] for r in raws), strict=True):
        assert got["time_s"] == pytest.approx(sorted(e["time_s"] for e in each)[1])
    sharing = [r for r in merged["per_rank"][0]["records"] if r["bench"] == "core_sharing"]
    assert all(len(r["window_means_s"]) == 4 for r in sharing)  # the rounds of all three, in order
    assert merged["wall_s"] == 180.0 and merged["command"].startswith("median of 3 calibrations")
    paths = []
    for i, r in enumerate(raws):
        paths.append(tmp_path / f"r{i}.json")
        paths[-1].write_text(json.dumps(r))
    profile = refit_profile(paths, tmp_path / "merged.yaml")
    alone = refit_profile(paths[2], tmp_path / "middle.yaml")  # the 1.5x calibration is the median everywhere
    assert profile["kernel_launch_us"] == pytest.approx(alone["kernel_launch_us"])
    assert load_profile(tmp_path / "merged.yaml").name == "merged"
    (tmp_path / "bad.json").write_text(json.dumps({"per_rank": 3}))
    with pytest.raises(PiperError, match="not the records calibrate --records writes"):
        refit_profile(tmp_path / "bad.json", tmp_path / "bad.yaml")
    raws[1]["per_rank"][0]["records"].pop()
    with pytest.raises(PiperError, match="different numbers of benchmark records"):
        merge_calibrations(raws, ["a", "b", "c"])
    raws[1]["per_rank"].pop()
    with pytest.raises(PiperError, match="different numbers of ranks"):
        merge_calibrations(raws, ["a", "b", "c"])


def test_framework_cost_follows_the_tokens_net_of_the_micro_models_own_work():
    from piper_sim.workload.cost import TaskCoster
    from piper_sim.workload.presets import load_model

    per_rank = [{"rank": r, "machine": MACHINE, "records": _synthetic_records(1.0)} for r in range(2)]
    profile = build_profile(
        name="synthetic",
        per_rank=per_rank,
        testbed_per_rank=None,
        quick=True,
        command="test",
        versions={"torch": "x"},
        wall_s=1.0,
    )
    cost = load_profile(profile)
    (op, series) = cost.framework_s[("forward", "router")]
    assert op == "router:0" and [t for t, _ in series] == [8, 256]
    raw_us = profile["measurements"]["framework_overhead"]["forward"]["ops"]["router:0"]["time_us_by_tokens"]
    assert all(0 <= net <= raw * 1e-6 for (_, net), raw in zip(series, raw_us, strict=True))
    model = load_model("tiny-moe")
    at = {
        tokens: TaskCoster(model, cost, tokens)._framework_s("forward", "router:0", ())
        for tokens in (8, 132, 256, 4096)
    }
    assert at[132] == pytest.approx((at[8] + at[256]) / 2)  # linear between the measured token counts
    assert at[4096] == pytest.approx(at[256])  # flat beyond them
    assert at[256] > at[8]


def test_experts_framework_cost_is_a_fixed_part_plus_a_part_per_expert_with_rows():
    from piper_sim.workload.cost import TaskCoster
    from piper_sim.workload.presets import load_model

    per_rank = [{"rank": r, "machine": MACHINE, "records": _synthetic_records(1.0)} for r in range(2)]
    profile = build_profile(
        name="synthetic",
        per_rank=per_rank,
        testbed_per_rank=None,
        quick=True,
        command="test",
        versions={"torch": "x"},
        wall_s=1.0,
    )
    fit = profile["measurements"]["framework_overhead"]["forward"]["ops"]["experts:0"]["by_experts"]
    assert fit["experts"] == [2, 4, 8]
    # forward: 10 + 3 x 10 us at 4 experts, 5 us per expert, 0.1 us per token (8 and 256 tokens)
    assert fit["time_us_by_tokens"] == [
        pytest.approx([30.8, 55.6]),
        pytest.approx([40.8, 65.6]),
        pytest.approx([60.8, 85.6]),
    ]
    coster = TaskCoster(load_model("tiny-moe"), load_profile(profile), 8)
    one, five = (coster._framework_s("forward_expert", "experts:0", (64,) * n + (0,) * (8 - n)) for n in (1, 5))
    # at 8 tokens: 20.8 us fixed + 5 us per expert with rows (the micro model's own GEMM work, netted out, is
    # nanoseconds at d 8)
    assert five - one == pytest.approx(4 * 5e-6, rel=0.02)
    assert one == pytest.approx(25.8e-6, rel=0.02)


def _layer_records(layer: dict) -> list[dict]:
    """Framework records of one preset layer run at its own dimensions, at 8 x 1 and 128 x 2 tokens: ops
    of 300-800 us (their arithmetic included), the experts op 400 us + 50 us per expert (forward)."""
    import json

    recs = []
    tag = {"model": layer["name"], "layer": json.dumps(layer, sort_keys=True)}
    for seq, batch in ((8, 1), (128, 2)):
        tokens = seq * batch
        shape = {**tag, "seq_len": seq, "micro_batch_size": batch, "tokens": tokens, "kernels": 20, "views": 5}
        for direction, scale in (("fwd", 1.0), ("bwd", 2.0)):
            for op, us in (("attn:0", 800.0), ("router:0", 300.0)):
                recs.append(
                    {
                        **shape,
                        "bench": "framework",
                        "op": op,
                        "pass": direction,
                        "num_experts": 8,
                        "time_s": scale * (us + tokens) * 1e-6,
                    }
                )
            for experts in (2, 4, 8):
                recs.append(
                    {
                        **shape,
                        "bench": "framework",
                        "op": "experts:0",
                        "pass": direction,
                        "num_experts": experts,
                        "time_s": scale * (400.0 + 50.0 * experts + tokens) * 1e-6,
                    }
                )
    return recs


def test_a_layer_calibrated_at_its_own_dimensions_prices_that_model_at_the_measured_times():
    from piper_sim.calibrate.sweep import model_layer
    from piper_sim.workload.cost import TaskCoster
    from piper_sim.workload.presets import load_model

    layer = model_layer(load_model("tiny-moe"))
    records = _synthetic_records(1.0) + _layer_records(layer)
    per_rank = [{"rank": r, "machine": MACHINE, "records": records} for r in range(2)]
    profile = build_profile(
        name="synthetic",
        per_rank=per_rank,
        testbed_per_rank=None,
        quick=True,
        command="test",
        versions={"torch": "x"},
        wall_s=1.0,
    )
    entry = profile["measurements"]["framework_overhead_by_model"]["tiny-moe"]
    assert entry["layer"] == layer and entry["shapes"] == [[8, 1], [128, 2]]
    assert entry["forward"]["ops"]["experts:0"]["by_experts"]["experts"] == [2, 4, 8]
    cost = load_profile(profile)
    # the validation cases' model: tiny-moe's layer, 8 layers at seq 128; 256 tokens is a measured shape,
    # so each op costs what was measured (its own arithmetic netted out of the table and priced back)
    model = load_model({"preset": "tiny-moe", "num_layers": 8, "seq_len": 128})
    coster = TaskCoster(model, cost, 256)
    assert coster.cost("forward", ("router:0",))[0] == pytest.approx(556e-6, rel=1e-6)
    assert coster.cost("backward", ("attn:0",))[0] == pytest.approx(2 * 1056e-6, rel=1e-6)
    # the experts op with the router's 512 rows spread over all 8 experts, as measured (within 1%: the line
    # over 2, 4 and 8 experts is fitted net of their GEMMs, whose rows per expert differ)
    assert coster.cost("forward_expert", ("experts:0",), (64,) * 8)[0] == pytest.approx(1056e-6, rel=0.01)
    # another model's layer (other dimensions) keeps the micro model's tables
    other = TaskCoster(load_model("small-moe"), cost, 256)
    assert other.profile.framework_s == cost.framework_s != coster.profile.framework_s
    del profile["measurements"]["framework_overhead_by_model"]["tiny-moe"]["layer"]
    with pytest.raises(ConfigError, match="framework_overhead_by_model.tiny-moe"):
        load_profile(profile)


def test_the_layer_benchmark_runs_only_layers_the_cpu_backend_can_build_at_their_size():
    from piper_sim.calibrate.sweep import LAYER_BENCH_MAX_PARAMS, make_sweep, model_layer
    from piper_sim.workload.presets import load_model

    sweep = make_sweep(False, ("tiny-moe", "mixtral-8x7b", "deepseek-v2", "small-moe"))
    # mixtral's layer is 1.45G parameters; deepseek-v2 uses MLA, which the torch backend does not build
    assert [layer["name"] for layer in sweep.layers] == ["tiny-moe", "small-moe"]
    assert model_layer(load_model("mixtral-8x7b")) is None and model_layer(load_model("deepseek-v2")) is None
    tiny = load_model(model_layer(load_model("tiny-moe")))
    assert tiny.num_layers == 1 and tiny.d_model == 64 and tiny.layer_params(0) < LAYER_BENCH_MAX_PARAMS
    assert [layer["name"] for layer in make_sweep(True).layers] == ["tiny-moe"]


def test_split_backward_passes_take_their_measured_share_of_the_backward():
    from piper_sim.workload.cost import TaskCoster
    from piper_sim.workload.presets import load_model

    per_rank = [{"rank": r, "machine": MACHINE, "records": _synthetic_records(1.0)} for r in range(2)]
    profile = build_profile(
        name="synthetic",
        per_rank=per_rank,
        testbed_per_rank=None,
        quick=True,
        command="test",
        versions={"torch": "x"},
        wall_s=1.0,
    )
    attn = profile["measurements"]["framework_overhead"]["backward"]["ops"]["attn:0"]
    assert attn["input_pass_us_by_tokens"] == pytest.approx([0.9 * t for t in attn["time_us_by_tokens"]], abs=0.1)
    coster = TaskCoster(load_model("tiny-moe"), load_profile(profile), 100)
    fused = coster._framework_s("backward", "attn:0", ())
    assert coster._framework_s("backward_input", "attn:0", ()) == pytest.approx(0.9 * fused, rel=1e-3)
    assert coster._framework_s("backward_weight", "attn:0", ()) == pytest.approx(0.2 * fused, rel=1e-3)
    # an op without a measured split (experts here): the input pass takes all, the weight pass its GEMMs
    rows = (64,) * 8
    assert coster._framework_s("backward_expert_input", "experts:0", rows) == pytest.approx(
        coster._framework_s("backward_expert", "experts:0", rows)
    )


def test_a_backward_timed_at_zero_drops_its_split_at_that_token_count_too():
    # on a busy machine forward + backward - forward can come out at 0; the profile must still load
    records = _synthetic_records(1.0)
    for r in records:
        if r["bench"] == "framework" and r["op"] == "attn:0" and r["pass"] == "bwd" and r["tokens"] == 256:
            r["time_s"] = 0.0
    per_rank = [{"rank": r, "machine": MACHINE, "records": records} for r in range(2)]
    profile = build_profile(
        name="synthetic",
        per_rank=per_rank,
        testbed_per_rank=None,
        quick=True,
        command="test",
        versions={"torch": "x"},
        wall_s=1.0,
    )
    attn = profile["measurements"]["framework_overhead"]["backward"]["ops"]["attn:0"]
    assert attn["tokens"] == [8] and len(attn["input_pass_us_by_tokens"]) == len(attn["weight_pass_us_by_tokens"]) == 1
    assert load_profile(profile).framework_split["attn"][0][0] == 8


def test_an_ops_samples_pool_over_rounds_before_the_medians_are_taken():
    from piper_sim.torch_backend.bench.stage_ops import op_times, pool_samples

    counts = {"fwd_kernels": 5, "fwd_views": 2, "bwd_kernels": 9, "bwd_views": 3}

    def samples(scale: float) -> dict:  # seconds of single calls, one round of the framework benchmark
        return {
            "counts": counts,
            "fwd": [1.0 * scale, 1.2 * scale],
            "all": [3.0 * scale, 3.4 * scale],
            "split_fwd": [1.1 * scale],
            "split_input": [2.5 * scale],
            "split_weight": [0.4 * scale],
        }

    # a round on a machine 3x slower: pooled, the medians sit between the rounds
    pooled = pool_samples(pool_samples(None, samples(1.0)), samples(3.0))
    assert pooled["fwd"] == pytest.approx([1.0, 1.2, 3.0, 3.6]) and pooled["counts"] == counts
    times = op_times(pooled)
    assert times["fwd_s"] == pytest.approx(2.1) and times["bwd_s"] == pytest.approx(6.2 - 2.1)
    assert times["bwd_input_s"] == pytest.approx(5.0 - 2.2) and times["bwd_weight_s"] == pytest.approx(0.8)
    assert times["bwd_kernels"] == 9


def test_cold_calls_time_each_call_after_flushing_the_caches():
    from piper_sim.torch_backend.bench.calibration_inputs import TimingPlan
    from piper_sim.torch_backend.bench.timing import COLD_CALLS_PER_SAMPLE, cold_calls, last_level_cache_bytes

    assert last_level_cache_bytes() >= 1 << 20
    calls = []
    plan = TimingPlan(num_samples=2, warmup_calls=1)
    samples = cold_calls(lambda: calls.append(1), plan)
    assert len(samples) == 2 * COLD_CALLS_PER_SAMPLE and len(calls) == 1 + 2 * COLD_CALLS_PER_SAMPLE
    assert all(t >= 0 for t in samples)


def test_aggregate_takes_the_median_rank_for_compute_and_the_slowest_for_collectives():
    recs = [
        [{"bench": "gemm", "rows": 1, "time_s": t}, {"bench": "all_reduce", "bytes": 8, "time_s": t}]
        for t in (1.0, 2.0, 6.0)
    ]
    agg = {r["bench"]: r for r in aggregate([{"records": r} for r in recs])}
    assert agg["gemm"]["time_s"] == 2.0
    assert agg["all_reduce"]["time_s"] == 6.0
    assert agg["gemm"]["rank_spread"] == 6.0


def test_testbed_levels_pair_ranks_on_one_node_and_across_nodes():
    from piper_sim.torch_backend.bench.runner import testbed_levels

    levels = testbed_levels({0: 0, 1: 0, 2: 1, 3: 1, 4: 2, 5: 2})
    assert levels == {
        "intra-node": [(0, 1), (2, 3), (4, 5)],
        "node0-node1": [(0, 2), (1, 3)],
        "node0-node2": [(0, 4), (1, 5)],
    }


def _increasing(xs: list[float]) -> bool:
    return all(a < b for a, b in zip(xs, xs[1:], strict=False))


@pytest.mark.slow  # the whole quick sweep (about 5 minutes on 2 cores)
def test_quick_calibration_writes_a_loadable_profile(tmp_path):
    out = tmp_path / "cpu-test.yaml"
    proc = subprocess.run(
        [sys.executable, "-m", "piper_sim.cli", "calibrate", "--quick", "--ranks", "2", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    raw = yaml.safe_load(out.read_text())
    profile = load_profile(out)
    assert profile.name == "cpu-test"
    assert profile.peak_flops_per_s > 1e8 and profile.hbm_bytes_per_s > 1e8 and profile.kernel_launch_s > 0
    for curve in (profile.gemm_efficiency, profile.attention_efficiency):
        assert _increasing(list(curve.x)) and len(curve.x) >= 3
        assert all(0 < e <= 1 for e in curve.efficiency)
    assert raw["source"].startswith("measured by piper-sim calibrate")
    assert {"platform", "cpu_count", "ranks"} <= set(raw["machine"]) and raw["versions"]["torch"]
    assert raw["measurements"]["command"].startswith("piper-sim calibrate")
    network = raw["measurements"]["network"]["local"]
    assert {"p2p", "all_to_all", "all_reduce"} <= set(network)
    assert network["p2p"]["pairs_1"]["fit"]["bandwidth_GBps"] > 0
    wait = raw["measurements"]["blocking_wait"]
    assert wait["ranks_per_core"] == [0, 1, 2] and wait["computing_per_core"][0] == 0.0
    assert all(t > 0 for t in wait["after_last_us"]) and all(e >= 0 for e in wait["extra_per_call_us"])
    assert all(n > 0 for n in wait["exchanges"]) and wait["scheduler_slice_us"] > 0
    host = load_host_profile(raw)
    assert host.blocking_wait_s(0) == pytest.approx(wait["extra_per_call_us"][0] * 1e-6, rel=1e-3)
    sharing = raw["measurements"]["core_sharing"]
    assert sharing["ranks_per_core"] == [1, 2] and sharing["cpu_time_factor"][0] == 1.0
    assert all(t > 0 for t in sharing["cpu_us_per_iteration"]) and all(u > 0 for u in sharing["cores_used"])
    assert host.core_sharing_factor(2) == pytest.approx(sharing["cpu_time_factor"][1], rel=1e-3)
    router = raw["measurements"]["framework_overhead"]["forward"]["ops"]["router:0"]
    assert router["tokens"] == [8, 256, 1024] and all(t > 0 for t in router["time_us_by_tokens"])
    experts = raw["measurements"]["framework_overhead"]["forward"]["ops"]["experts:0"]["by_experts"]
    assert experts["experts"] == [2, 4, 8] and all(len(t) == 3 for t in experts["time_us_by_tokens"])
    # the quick sweep runs tiny-moe's own layer at 8 tokens; a tiny-moe model is priced with it
    layer = raw["measurements"]["framework_overhead_by_model"]["tiny-moe"]
    assert layer["layer"]["d_model"] == 64 and layer["shapes"] == [[8, 1]]
    assert layer["forward"]["ops"]["experts:0"]["by_experts"]["experts"] == [2, 4, 8]
    assert all(op["time_us_by_tokens"][0] > 0 for op in layer["forward"]["ops"].values())
    from piper_sim.workload.presets import load_model

    assert profile.for_model(load_model("tiny-moe")).framework_s != profile.framework_s
    assert profile.for_model(load_model("small-moe")) is profile
    # the host work around an exchange: forward only, priced for a dispatch and for a combine
    from piper_sim.schedule.ir import Task
    from piper_sim.workload.cost import TaskCoster

    assert {"dispatch:0", "combine:0"} <= set(layer["forward"]["ops"]) - set(layer["backward"]["ops"])
    coster = TaskCoster(load_model("tiny-moe"), profile, 8)
    dispatch = Task(task_id="F:c0:m0:L0:dispatch", kind="all_to_all", role="dispatch", group_axis="ep")
    combine = Task(task_id="B:c0:m0:L0:dispatch", kind="all_to_all", role="dispatch", group_axis="ep")
    table = dict(profile.for_model(load_model("tiny-moe")).framework_s[("forward", "dispatch")][1])
    assert coster.exchange_s(dispatch) >= table[8] > 0 and coster.exchange_s(combine) > 0
    migrate = Task(task_id="M:L0", kind="all_to_all", role="migrate", group_axis="ep")
    assert coster.exchange_s(migrate) == 0.0


def test_blocking_wait_level_from_known_timestamps():
    from piper_sim.torch_backend.bench.wake import SKIPPED_EXCHANGES, _level_record

    # one pair on one core, one window: each iteration computes 4 ms then exchanges; rank 1 arrives 1 ms
    # after rank 0, and both return 2 ms after that (skipped first exchanges: same pattern)
    def entries(rank: int) -> list:
        out, t = [], 0.0
        for _ in range(SKIPPED_EXCHANGES + 3):
            arrive = t + 4e-3 + (1e-3 if rank else 0.0)
            out.append((t + (1e-3 if rank else 0.0), arrive, 2.5e-3 + rank * 1e-3, arrive, t + 7e-3))
            t += 7e-3
        return out

    logs = [{"levels": {"1": [entries(r)]}} for r in (0, 1)]
    rec = _level_record(logs, 1, cores=2, preset="tiny-moe")
    assert rec["time_s"] == pytest.approx(2e-3)  # from the later arrival to return
    assert rec["exchanges"] == 3
    # each iteration: 4 ms of wall on both ranks; CPU 2.5 and 3.5 ms
    assert rec["iteration_s"] == pytest.approx(4e-3) and rec["iteration_cpu_s"] == pytest.approx(3e-3)
    # computing: 4 ms of every 7 ms on each of 2 ranks, over 2 cores
    span = (SKIPPED_EXCHANGES + 3) * 7e-3
    assert rec["computing_per_core"] == pytest.approx(2 * (SKIPPED_EXCHANGES + 3) * 4e-3 / span / 2)


def test_core_sharing_workers_time_cold_iterations_without_their_flushes():
    # real workers (benchmarks/bench_core_sharing_cold.py): each cold iteration writes twice the last-level
    # cache first, untimed, so the workers' timed CPU per wall second drops well below the hot loop's
    from piper_sim.torch_backend.bench.sharing import run_levels

    (hot,) = run_levels("tiny-moe", (1,), 1, 0.5, lambda _m: None)
    (cold,) = run_levels("tiny-moe", (1,), 1, 0.5, lambda _m: None, cold=True)
    assert hot["time_s"] > 0 and cold["time_s"] > 0
    assert cold["cores_used"] < 0.8 * hot["cores_used"]
