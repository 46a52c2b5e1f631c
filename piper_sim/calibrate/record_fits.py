"""The fits of aggregated benchmark records (records_to_profile.aggregate) into a cost profile's numbers and
measurement tables, with unit-suffixed keys and values rounded for a readable YAML.

Owns the choice of each profile number (see docs/calibration.md):
- kernel_launch_us: median of the one-element ops (add, mul, softmax, 1x1 linear) with autograd on;
- peak_bf16_TFLOPS: best GEMM FLOP/s over the sweep (fp32 on CPU), from times net of one launch;
- gemm_efficiency over rows: per rows, the median over the (k, n) pairs of FLOPs / (peak x net time);
- attention_efficiency over seq_len: the same over the head configurations;
- hbm_bandwidth_GBps: the overhead + bytes / bandwidth fit of add and mul over the tensor sizes the
  models use (on CPU these live in cache; the streaming DRAM fit is recorded beside it);
- optimizer_bytes_per_param: the per-parameter slope of the Adam step times that bandwidth;
and the measurement tables beside them: framework costs per op, the network's overhead + bandwidth fits, the host's
blocking wait and core sharing. Pure numpy: no torch.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable

import numpy as np

from piper_sim.calibrate import fit
from piper_sim.calibrate.sweep import MICRO_MODEL, MICRO_SHAPES, TINY_OPS
from piper_sim.torch_backend.bench.calibration_inputs import COMM_BENCHES

MODEL_RANGE_MAX_BYTES = 4 * 2**20  # largest activation tensors of the shipped small presets are ~2 MiB
DRAM_MIN_BYTES = 16 * 2**20  # beyond per-core caches, and with several ranks beyond a shared L3


def _select(records: Iterable[dict], bench: str, **match: object) -> list[dict]:
    return [r for r in records if r["bench"] == bench and all(r.get(k) == v for k, v in match.items())]


def rounded(value: float, digits: int = 4) -> float:
    """Round to significant digits for a readable YAML."""
    if value == 0 or not np.isfinite(value):
        return float(value)
    return float(f"{value:.{digits}g}")


def rounded_us(seconds: float) -> float:
    """Seconds as microseconds, rounded as rounded() does."""
    return rounded(seconds * 1e6)


def _linear_fit_yaml(f: fit.LinearFit, *, scale: float = 1e9, unit: str = "GBps") -> dict:
    return {
        "overhead_us": rounded_us(f.overhead_s),
        f"bandwidth_{unit}": rounded(f.bandwidth_per_s / scale),
        "rms_relative_error": rounded(f.rms_relative_error, 3),
        "num_points": f.num_points,
    }


def fit_launch(records: list[dict]) -> tuple[float, dict]:
    tiny = _select(records, "tiny")
    launch = fit.median([r["time_s"] for r in tiny if r["autograd"] and r["op"] in TINY_OPS])
    table = {("autograd" if r["autograd"] else "no_grad"): {} for r in tiny}
    for r in tiny:
        table["autograd" if r["autograd"] else "no_grad"][f"{r['op']}_us"] = rounded_us(r["time_s"])
    return launch, table


FRAMEWORK_NOTE = (
    "executor forward_op / backward_op, caches flushed before each call; ops: time_us at the fewest "
    "tokens, time_us_by_tokens at each of tokens (seq_len x micro-batch size); experts:0 by_experts: "
    "the same with each number of experts; backward ops: input_pass / weight_pass: the zero-bubble "
    "split of the backward"
)


def fit_framework(records: list[dict]) -> dict | None:
    """Per pass: each micro-model op's time at each token count, and time = per_op + per_aten_op x (kernels
    + views) fitted over the ops at the fewest tokens."""
    out = _framework_tables(records, MICRO_MODEL)
    if out is None:
        return None
    return {
        "model": "time = per_op_us + per_aten_op_us x (ATen kernels + views), micro MoE (d 8, E 4), " + FRAMEWORK_NOTE,
        "micro_model": dict(MICRO_MODEL),
        "shapes": [list(s) for s in MICRO_SHAPES],
        **out,
    }


def fit_framework_by_model(records: list[dict]) -> dict:
    """The same tables for one layer of each preset the framework benchmark ran at its own dimensions:
    {preset name: {"layer": its model dict, "shapes", forward, backward}}."""
    out = {}
    layers = {r["model"]: json.loads(r["layer"]) for r in _select(records, "framework") if "layer" in r}
    for name, layer in layers.items():
        tables = _framework_tables(records, layer)
        shapes = sorted({(r["seq_len"], r["micro_batch_size"]) for r in _select(records, "framework", model=name)})
        out[name] = {
            "model": f"one layer of {name} at its own dimensions, " + FRAMEWORK_NOTE,
            "layer": layer,
            "shapes": [list(s) for s in shapes],
            **(tables or {}),
        }
    return out


def _framework_tables(records: list[dict], model: dict) -> dict | None:
    every = [r for r in _select(records, "framework") if r.get("model", MICRO_MODEL["name"]) == model["name"]]
    if not every:
        return None
    base_experts = model["num_experts"]
    pts = [r for r in every if r.get("num_experts", base_experts) == base_experts]
    fewest = min(r.get("tokens", 0) for r in pts)
    out: dict = {}
    for direction, name in (("fwd", "forward"), ("bwd", "backward")):
        sel = [r for r in pts if r["pass"] == direction and r["time_s"] > 0]
        if not sel:
            continue
        base = [r for r in sel if r.get("tokens", 0) == fewest]
        counts = np.array([r["kernels"] + r["views"] for r in base], dtype=float)
        coef, rms = fit.fit_nonnegative(np.column_stack([np.ones_like(counts), counts]), [r["time_s"] for r in base])
        ops: dict = {}
        for r in sorted(sel, key=lambda r: r.get("tokens", 0)):
            entry = ops.setdefault(
                r["op"],
                {
                    "kernels": r["kernels"],
                    "views": r["views"],
                    "time_us": rounded_us(r["time_s"]),
                    "tokens": [],
                    "time_us_by_tokens": [],
                },
            )
            entry["tokens"].append(int(r.get("tokens", 0)))
            entry["time_us_by_tokens"].append(rounded_us(r["time_s"]))
        by_experts: dict[int, list[float]] = {}
        for r in sorted(
            (r for r in every if r["pass"] == direction and r["op"].startswith("experts:")),
            key=lambda r: r.get("tokens", 0),
        ):
            by_experts.setdefault(int(r.get("num_experts", base_experts)), []).append(rounded_us(r["time_s"]))
        if len(by_experts) > 1 and "experts:0" in ops:
            counts = sorted(by_experts)
            ops["experts:0"]["by_experts"] = {"experts": counts, "time_us_by_tokens": [by_experts[e] for e in counts]}
        if direction == "bwd":  # the zero-bubble split of each op's backward, at each token count
            for split, key in (("bwd_input", "input_pass_us_by_tokens"), ("bwd_weight", "weight_pass_us_by_tokens")):
                for r in sorted((r for r in pts if r["pass"] == split), key=lambda r: r.get("tokens", 0)):
                    # only at the token counts the backward kept (a backward timed at 0 or less is dropped)
                    if r["op"] in ops and int(r.get("tokens", 0)) in ops[r["op"]]["tokens"]:
                        ops[r["op"]].setdefault(key, []).append(rounded_us(r["time_s"]))
        out[name] = {
            "per_op_us": rounded_us(coef[0]),
            "per_aten_op_us": rounded_us(coef[1]),
            "rms_relative_error": rounded(rms, 3),
            "ops": ops,
        }
    return out


def fit_gemms(records: list[dict], launch_s: float) -> tuple[float, list[float], list[float], dict]:
    gemms = _select(records, "gemm")
    peak = fit.peak_rate([r["flops"] for r in gemms], [r["time_s"] for r in gemms], launch_s)
    rows, eff = fit.efficiency_curve(
        [r["rows"] for r in gemms], [r["flops"] for r in gemms], [r["time_s"] for r in gemms], peak, launch_s
    )
    best = max(gemms, key=lambda r: r["flops"] / fit.net_time_s(r["time_s"], launch_s))
    by_shape = []
    for k, n in dict.fromkeys((r["k"], r["n"]) for r in gemms):
        pts = sorted(_select(gemms, "gemm", k=k, n=n), key=lambda r: r["rows"])
        by_shape.append(
            {
                "label": pts[0]["label"],
                "k": k,
                "n": n,
                "rows": [r["rows"] for r in pts],
                "time_us": [rounded_us(r["time_s"]) for r in pts],
                "efficiency": [rounded(r["flops"] / (peak * fit.net_time_s(r["time_s"], launch_s)), 3) for r in pts],
            }
        )
    ffns = []
    for label in dict.fromkeys(r["label"] for r in _select(records, "ffn")):
        pts = sorted(_select(records, "ffn", label=label), key=lambda r: r["rows"])
        ffns.append(
            {
                "label": label,
                "d_model": pts[0]["d_model"],
                "ffn_dim": pts[0]["ffn_dim"],
                "matrices": pts[0]["matrices"],
                "rows": [r["rows"] for r in pts],
                "time_us": [rounded_us(r["time_s"]) for r in pts],
                "gemm_sum_us": [rounded_us(r["gemm_sum_s"]) for r in pts],
                "whole_over_gemm_sum": [rounded(r["time_s"] / r["gemm_sum_s"], 3) for r in pts],
            }
        )
    detail = {
        "peak_at": {"rows": best["rows"], "k": best["k"], "n": best["n"]},
        "curve": "per rows, median over the (k, n) pairs of flops / (peak x (time - kernel_launch))",
        "by_shape": by_shape,
        "expert_ffn": ffns,
    }
    return peak, rows, eff, detail


def fit_attention(records: list[dict], peak: float, launch_s: float) -> tuple[list[float], list[float], list[dict]]:
    attn = _select(records, "attention")
    seq, eff = fit.efficiency_curve(
        [r["seq_len"] for r in attn], [r["flops"] for r in attn], [r["time_s"] for r in attn], peak, launch_s
    )
    detail = []
    for label in dict.fromkeys(r["label"] for r in attn):
        pts = sorted(_select(attn, "attention", label=label), key=lambda r: r["seq_len"])
        detail.append(
            {
                "label": label,
                "batch": pts[0]["batch"],
                "heads": pts[0]["heads"],
                "head_dim": pts[0]["head_dim"],
                "seq_len": [r["seq_len"] for r in pts],
                "time_us": [rounded_us(r["time_s"]) for r in pts],
                "efficiency": [
                    rounded(min(1.0, r["flops"] / (peak * fit.net_time_s(r["time_s"], launch_s))), 3) for r in pts
                ],
            }
        )
    return seq, eff, detail


def fit_memory(records: list[dict], cuda: bool) -> tuple[float, dict]:
    elem = _select(records, "elementwise")
    simple = [r for r in elem if r["op"] in ("add", "mul")]
    in_model = [r for r in simple if cuda or r["tensor_bytes"] <= MODEL_RANGE_MAX_BYTES]
    model_fit = fit.fit_overhead_bandwidth([r["bytes"] for r in in_model], [r["time_s"] for r in in_model])
    detail: dict = {
        "chosen": "model_range" if not cuda else "all sizes",
        "model_range": {"max_tensor_bytes": MODEL_RANGE_MAX_BYTES if not cuda else None, **_linear_fit_yaml(model_fit)},
    }
    dram = [r for r in simple if r["tensor_bytes"] >= DRAM_MIN_BYTES]
    if len(dram) >= 2:
        dram_fit = fit.fit_overhead_bandwidth([r["bytes"] for r in dram], [r["time_s"] for r in dram])
        detail["dram_streaming"] = {"min_tensor_bytes": DRAM_MIN_BYTES, **_linear_fit_yaml(dram_fit)}
    by_op = {}
    for op in dict.fromkeys(r["op"] for r in elem):
        pts = sorted(_select(elem, "elementwise", op=op), key=lambda r: r["tensor_bytes"])
        op_fit = fit.fit_overhead_bandwidth([r["bytes"] for r in pts], [r["time_s"] for r in pts])
        by_op[op] = {
            "tensor_bytes": [r["tensor_bytes"] for r in pts],
            "time_us": [rounded_us(r["time_s"]) for r in pts],
            "achieved_GBps": [rounded(r["bytes"] / r["time_s"] / 1e9) for r in pts],
            "fit_all_sizes": _linear_fit_yaml(op_fit),
        }
    detail["by_op"] = by_op
    return model_fit.bandwidth_per_s, detail


def fit_optimizer_records(records: list[dict], bandwidth: float) -> tuple[float, dict]:
    pts = _select(records, "optimizer")
    fixed, per_tensor, per_param, rms = fit.fit_optimizer(
        [r["params"] for r in pts], [r["tensors"] for r in pts], [r["time_s"] for r in pts]
    )
    bytes_per_param = fit.optimizer_bytes_per_param(per_param, bandwidth)
    return bytes_per_param, {
        "model": "time = fixed + per_tensor x tensors + per_param x params (Adam, torch defaults; on CPU "
        "each step timed after a cache flush)",
        "fixed_us": rounded_us(fixed),
        "per_tensor_us": rounded_us(per_tensor),
        "per_param_ns": rounded(per_param * 1e9),
        "rms_relative_error": rounded(rms, 3),
        "points": [{"params": r["params"], "tensors": r["tensors"], "time_us": rounded_us(r["time_s"])} for r in pts],
    }


def network_summary(records: list[dict]) -> dict:
    """Per level and benchmark: sizes, times and the per-message overhead + bandwidth fit."""
    out: dict = {}
    for r in records:
        if r["bench"] not in COMM_BENCHES:
            continue
        series = f"pairs_{r['pairs']}" if r["bench"] == "p2p" else f"groups_of_{r['group_size']}"
        out.setdefault(r.get("level", "local"), {}).setdefault(r["bench"], {}).setdefault(series, []).append(r)
    for level in out.values():
        for bench, by_series in level.items():
            for series, pts in by_series.items():
                pts.sort(key=lambda r: r["bytes"])
                f = fit.fit_overhead_bandwidth([r["bytes"] for r in pts], [r["time_s"] for r in pts])
                entry = {
                    "bytes": [r["bytes"] for r in pts],
                    "time_us": [rounded_us(r["time_s"]) for r in pts],
                    "fit": _linear_fit_yaml(f),
                }
                if bench != "p2p":
                    entry["concurrent_groups"] = pts[0]["groups"]
                by_series[series] = entry
    return out


def blocking_wait_summary(records: list[dict], network: dict) -> dict | None:
    """The blocking exchange after compute at K processes per core, and back to back with nothing else
    running (load 0), less what the profile already prices for it (each call's overhead + bytes / bandwidth
    from the local all_to_all fit of groups of 2), per call (torch_backend/bench/wake.py). The simulator charges the
    extra at the load it sees (workload/profile.py: HostProfile.blocking_wait_s)."""
    pts = sorted(_select(records, "blocking_wait"), key=lambda r: r["computing_per_core"])
    slices = _select(records, "scheduler_slice")
    fit_ = ((network.get("all_to_all") or {}).get("groups_of_2") or {}).get("fit")
    if not pts or not slices or not fit_:
        return None
    calls, hot = pts[0]["calls_per_exchange"], pts[0]["hot_s"]
    call_bytes = [pts[0]["count_bytes"], pts[0]["row_bytes"]]
    priced = sum(fit_["overhead_us"] * 1e-6 + b / (fit_["bandwidth_GBps"] * 1e9) for b in call_bytes)
    return {
        "model": "a blocking exchange (pairs, flat all-to-all through the torch backend) costs more than its "
        "calls are priced, and more the more ranks compute, since each wake-up waits for a core: "
        "extra per library call = (mean time from the last arrival to return - priced) / calls; "
        "load 0 is the exchange back to back, the others follow one layer's forward + backward with "
        "K processes per core",
        "preset": pts[0]["preset"],
        "cores": pts[0]["cores"],
        "calls_per_exchange": calls,
        "call_bytes": call_bytes,
        "priced_us": rounded_us(priced),
        "ranks_per_core": [0] + [r["ranks_per_core"] for r in pts],
        "computing_per_core": [0.0] + [rounded(r["computing_per_core"], 3) for r in pts],
        "after_last_us": [rounded_us(hot)] + [rounded_us(r["time_s"]) for r in pts],
        "median_us": [rounded_us(pts[0]["hot_median_s"])] + [rounded_us(r["median_s"]) for r in pts],
        "window_means_us": [[rounded_us(t) for t in r["window_means_s"]] for r in pts],
        "exchanges": [r["exchanges"] for r in pts],
        # recorded, not charged: one iteration of the compute between exchanges, wall and main-thread CPU
        # (older records lack them)
        "iteration_us": [rounded_us(r["iteration_s"]) if "iteration_s" in r else None for r in pts],
        "iteration_cpu_us": [rounded_us(r["iteration_cpu_s"]) if "iteration_cpu_s" in r else None for r in pts],
        "extra_per_call_us": [rounded_us(max(t - priced, 0.0) / calls) for t in [hot] + [r["time_s"] for r in pts]],
        "scheduler_slice_us": rounded_us(slices[0]["time_s"]),
    }


def core_sharing_summary(records: list[dict]) -> dict | None:
    """CPU time of the same compute at K processes per core over the time at one per core
    (torch_backend/bench/sharing.py); the simulator slows shared cores by it (workload/profile.py:
    HostProfile.core_sharing_factor)."""
    pts = sorted(_select(records, "core_sharing"), key=lambda r: r["ranks_per_core"])
    if not pts or pts[0]["ranks_per_core"] != 1:
        return None
    base = pts[0]
    paired = all(len(r["window_means_s"]) == len(base["window_means_s"]) for r in pts)
    # each round's ratio to level 1 of the same round (the machine drifts between rounds), median over rounds
    per_round = [
        [r_t / b_t for r_t, b_t in zip(r["window_means_s"], base["window_means_s"], strict=True)]
        if paired
        else [r["time_s"] / base["time_s"]]
        for r in pts
    ]
    return {
        "model": "CPU time of compute with K processes taking turns on each core / CPU time at one per core "
        "(forward + backward of one layer, one thread per process, all cores busy); the median over "
        "rounds of the ratio to one per core in the same round",
        "preset": pts[0]["preset"],
        "cores": pts[0]["cores"],
        "ranks_per_core": [r["ranks_per_core"] for r in pts],
        "cpu_time_factor": [rounded(statistics.median(ratios), 3) for ratios in per_round],
        "factor_by_round": [[rounded(x, 3) for x in ratios] for ratios in per_round],
        "cpu_us_per_iteration": [rounded_us(r["time_s"]) for r in pts],
        "window_means_us": [[rounded_us(t) for t in r["window_means_s"]] for r in pts],
        "cores_used": [r["cores_used"] for r in pts],
    }
