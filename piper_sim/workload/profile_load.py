"""Reading a cost profile (traces/profiles/NAME.yaml, a path or an inline mapping) into the fitted
DeviceProfile and, where calibrate measured shared cores, the HostProfile (piper_sim.workload.profile).

Owns the profile file's schema (unit-suffixed keys, converted once), the checks of its tables, and what
is derived from its measurements at load: framework costs net of the measured model's own arithmetic as
this profile prices it, and the experts op's line over expert counts (expert_lines). Measuring is
piper_sim.calibrate's; finding a profile's file and what it extends is profile_file.py's.
Pure numpy and yaml: no torch, no simpy.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from piper_sim.bounds import check_value
from piper_sim.errors import ConfigError
from piper_sim.units import is_finite_number, read_params
from piper_sim.workload.flops import EXCHANGE_OPS, MEMORY_KINDS, exchange_work, op_work
from piper_sim.workload.presets import load_model
from piper_sim.workload.profile import (
    AttentionBmmEfficiency,
    Curve,
    DeviceProfile,
    FrameworkReserve,
    HostProfile,
    MoePath,
    ShapeFactor,
    layer_key,
)
from piper_sim.workload.profile_file import read_profile_raw
from piper_sim.workload.roofline import BACKWARD_FACTOR, work_time_s
from piper_sim.workload.task_kinds import TaskKind

PROFILE_SCHEMA = {
    "name": ...,
    "device": ...,
    "source": "",
    "date": "",
    "versions": None,
    "machine": None,
    "peak_bf16_TFLOPS": ...,
    "hbm_GiB": ...,
    "hbm_bandwidth_GBps": ...,
    "memory_efficiency": 0.8,
    "kernel_launch_us": 5.0,
    "gemm_efficiency": ...,
    "attention_efficiency": ...,
    "optimizer_bytes_per_param": 36,
    "measurements": None,
    "collective_overhead_us": 0.0,
    "p2p_overhead_us": 0.0,
    "gemm_shape_factor": None,
    "extends": None,
    "moe_path": None,
    "device_kind": "",
    "framework_reserve_GiB": None,
    "framework_reserve": None,
    "gemm_sustained_factor": 1.0,
    "attention_bmm_memory_efficiency": None,
    "memory_kernel_efficiency": None,
    "peak_fp8_TFLOPS": None,
    "fp8_gemm_efficiency_ratio": 1.0,
    "fp8_transposed_copies": True,
}
RESERVE_SCHEMA = {"context_MiB": ..., "first_communicator_MiB": ..., "per_communicator_MiB": ...}
# the collectives whose measured per-call overhead (network.local.<kind>.groups_of_<n>.fit) the simulator charges
# per library call of that kind (DeviceProfile.collective_call_s)
CALL_COSTS = ("all_to_all", "all_reduce", "all_gather", "reduce_scatter")
MOE_PATH_SCHEMA = {"gate_us": ..., "gather_GBps": ..., "scatter_GBps": ...}
ATTENTION_BMM_SCHEMA = {"writes_scores": ..., "reads_scores": ...}
# the parts of `measurements` a load reads, by type (bounds.check_value); calibrate's other records are left alone
_FIT = {"fit": {"overhead_us": float}}
_OP = {
    "time_us": float,
    "time_us_by_tokens": [float],
    "tokens": [int],
    "input_pass_us_by_tokens": [float],
    "weight_pass_us_by_tokens": [float],
    "by_experts": {"experts": [int], "time_us_by_tokens": [[float]]},
}
_FRAMEWORK = {
    "micro_model": dict,
    "layer": dict,
    "shapes": [[int]],
    "model": str,
    **{pass_name: {"ops": {"*": _OP}} for pass_name in ("forward", "backward")},
}
MEASUREMENTS_SHAPE = {
    "network": {"local": {kind: {"*": _FIT} for kind in (*CALL_COSTS, "p2p")}},
    "optimizer": {"fixed_us": float, "per_tensor_us": float},
    "framework_overhead": _FRAMEWORK,
    "framework_overhead_by_model": {"*": _FRAMEWORK},
    "core_sharing": dict,
    "blocking_wait": dict,
}


def load_profile(spec: str | Path | dict) -> DeviceProfile:
    """The device profile of a profile by name (traces/profiles/NAME.yaml), path, or inline mapping."""
    return load_profiles(spec)[0]


def load_host_profile(spec: str | Path | dict) -> HostProfile | None:
    """The shared-core terms of a profile, or None when calibrate measured none (every GPU profile)."""
    return load_profiles(spec)[1]


def load_profiles(spec: str | Path | dict) -> tuple[DeviceProfile, HostProfile | None]:
    raw = read_profile_raw(spec)
    p = read_params(raw, PROFILE_SCHEMA, "cost.profile.")
    _check_device_numbers(p)
    measurements = p.get("measurements") or {}
    check_value(measurements, MEASUREMENTS_SHAPE, "cost.profile.measurements")
    profile = DeviceProfile(
        name=p["name"],
        device=p["device"],
        source=p["source"],
        peak_flops_per_s=p["peak_bf16_flops_per_s"],
        hbm_bytes=p["hbm_bytes"],
        hbm_bytes_per_s=p["hbm_bandwidth_bytes_per_s"],
        framework_reserve_bytes=_reserve(p),
        framework_reserve=_reserve_by_communicator(p),
        memory_efficiency=p["memory_efficiency"],
        kernel_launch_s=p["kernel_launch_s"],
        gemm_efficiency=_curve(p["gemm_efficiency"], "gemm_efficiency", "rows"),
        attention_efficiency=_curve(p["attention_efficiency"], "attention_efficiency", "seq_len"),
        optimizer_bytes_per_param=float(p["optimizer_bytes_per_param"]),
        gemm_shape_factor=_shape_factor(p["gemm_shape_factor"]),
        moe_path=_moe_path(p["moe_path"]),
        gemm_sustained_factor=p["gemm_sustained_factor"],
        attention_bmm_memory_efficiency=_attention_bmm(p["attention_bmm_memory_efficiency"]),
        memory_kernel_efficiency=_memory_kernels(p["memory_kernel_efficiency"]),
        **_fp8(p),
        **{
            "collective_overhead_s": p["collective_overhead_s"],
            "p2p_overhead_s": p["p2p_overhead_s"],
            **_device_measured(measurements),
        },
    )
    framework = measurements.get("framework_overhead") or {}
    tables = _checked_tables(framework, "cost.profile.measurements.framework_overhead")
    if tables:
        profile = replace(profile, **_fitted(profile, tables, framework.get("micro_model"), framework.get("shapes")))
    by_layer = []
    for name, entry in (measurements.get("framework_overhead_by_model") or {}).items():
        tables = (
            _checked_tables(entry, f"cost.profile.measurements.framework_overhead_by_model.{name}")
            if isinstance(entry, dict)
            else {}
        )
        layer = entry.get("layer") if isinstance(entry, dict) else None
        if not tables or not isinstance(layer, dict):
            raise ConfigError(
                f"cost.profile.measurements.framework_overhead_by_model.{name}",
                entry,
                "a layer (model dict) and forward/backward op tables, as calibrate writes them",
            )
        by_layer.append((layer_key(load_model(layer)), _fitted(profile, tables, layer, entry.get("shapes"))))
    if by_layer:
        profile = replace(profile, framework_by_layer=tuple(by_layer))
    return profile, _host_measured(measurements)


def _moe_path(raw: object) -> MoePath | None:
    if raw is None:
        return None
    p = read_params(raw, MOE_PATH_SCHEMA, "cost.profile.moe_path.")
    assert isinstance(raw, dict)  # read_params took it as a mapping
    for key, si in (("gather_GBps", "gather_bytes_per_s"), ("scatter_GBps", "scatter_bytes_per_s")):
        if not p[si] > 0:
            raise ConfigError(f"cost.profile.moe_path.{key}", raw[key], "a positive rate")
    return MoePath(**p)


def _attention_bmm(raw: object) -> AttentionBmmEfficiency | None:
    if raw is None:
        return None
    p = read_params(raw, ATTENTION_BMM_SCHEMA, "cost.profile.attention_bmm_memory_efficiency.")
    for key, value in p.items():
        if not is_finite_number(value) or not 0 < value <= 1:
            raise ConfigError(f"cost.profile.attention_bmm_memory_efficiency.{key}", value, "a fraction in (0, 1]")
    return AttentionBmmEfficiency(**p)


def _memory_kernels(raw: object) -> dict[str, float]:
    """The optional shares of HBM bandwidth by memory-bound kernel kind: {kind: fraction in (0, 1]}."""
    where = "cost.profile.memory_kernel_efficiency"
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(where, raw, f"a mapping of kernel kind ({', '.join(MEMORY_KINDS)}) to a fraction in (0, 1]")
    for kind, value in raw.items():
        if kind not in MEMORY_KINDS:
            raise ConfigError(f"{where}.{kind}", value, f"a kernel kind: {', '.join(MEMORY_KINDS)}")
        if not is_finite_number(value) or not 0 < value <= 1:
            raise ConfigError(f"{where}.{kind}", value, "a fraction in (0, 1]")
    return {kind: float(value) for kind, value in raw.items()}


def _fp8(p: dict) -> dict:
    """The profile's fp8 rates (workload/precision.py), checked: a ratio or transposes only with an fp8 peak."""
    peak, ratio, transposed = p["peak_fp8_flops_per_s"], p["fp8_gemm_efficiency_ratio"], p["fp8_transposed_copies"]
    if peak is not None and not peak > 0:
        raise ConfigError("cost.profile.peak_fp8_TFLOPS", peak / 1e12, "a positive number (leave it out: no fp8)")
    if not is_finite_number(ratio) or not 0 < ratio <= 2:
        raise ConfigError("cost.profile.fp8_gemm_efficiency_ratio", ratio, "a number in (0, 2]")
    if not isinstance(transposed, bool):
        raise ConfigError("cost.profile.fp8_transposed_copies", transposed, "true or false")
    if peak is None and (ratio != 1.0 or not transposed):
        key = "fp8_gemm_efficiency_ratio" if ratio != 1.0 else "fp8_transposed_copies"
        raise ConfigError(f"cost.profile.{key}", p[key], "left out where the profile has no peak_fp8_TFLOPS")
    return {
        "peak_fp8_flops_per_s": peak,
        "fp8_gemm_efficiency_ratio": float(ratio),
        "fp8_transposed_copies": transposed,
    }


def _reserve(p: dict) -> float | None:
    """The profile's framework reserve (bytes), checked against its HBM."""
    reserve = p["framework_reserve_bytes"]
    if reserve is not None and not 0 <= reserve < p["hbm_bytes"]:
        raise ConfigError("cost.profile.framework_reserve_GiB", reserve / 2**30, "a number of GiB from 0 to hbm_GiB")
    return reserve


def _reserve_by_communicator(p: dict) -> FrameworkReserve | None:
    """The profile's framework reserve by communicator (`framework_reserve`), checked: the fixed
    `framework_reserve_GiB` or this, not both; the context and the first communicator within HBM."""
    raw = p["framework_reserve"]
    if raw is None:
        return None
    if p["framework_reserve_bytes"] is not None:
        raise ConfigError(
            "cost.profile.framework_reserve",
            raw,
            "left out where the profile gives framework_reserve_GiB (one of the two)",
        )
    r = read_params(raw, RESERVE_SCHEMA, "cost.profile.framework_reserve.")
    if not r["context_bytes"] + r["first_communicator_bytes"] < p["hbm_bytes"]:
        raise ConfigError(
            "cost.profile.framework_reserve.first_communicator_MiB",
            raw["first_communicator_MiB"],
            "a number of MiB that with context_MiB leaves some of hbm_GiB",
        )
    return FrameworkReserve(**r)


def _check_device_numbers(p: dict) -> None:
    """Sizes and rates a device cannot be without (read_params has checked units: finite, non-negative)."""
    for key, si in (
        ("peak_bf16_TFLOPS", "peak_bf16_flops_per_s"),
        ("hbm_GiB", "hbm_bytes"),
        ("hbm_bandwidth_GBps", "hbm_bandwidth_bytes_per_s"),
    ):
        if not p[si] > 0:
            raise ConfigError(f"cost.profile.{key}", p[si], "a positive number")
    for key in ("memory_efficiency", "gemm_sustained_factor"):
        if not is_finite_number(p[key]) or not 0 < p[key] <= 1:
            raise ConfigError(f"cost.profile.{key}", p[key], "a fraction in (0, 1]")
    per_param = p["optimizer_bytes_per_param"]
    if not is_finite_number(per_param) or not 0 <= per_param < 1e6:
        raise ConfigError("cost.profile.optimizer_bytes_per_param", per_param, "a number of bytes from 0 to 1e6")


def _curve(raw: object, key: str, x_key: str) -> Curve:
    if not isinstance(raw, dict) or set(raw) != {x_key, "efficiency"}:
        raise ConfigError(f"cost.profile.{key}", raw, f"a mapping with keys {x_key} and efficiency")
    xs, eff = raw[x_key], raw["efficiency"]
    if (
        not isinstance(xs, list)
        or not isinstance(eff, list)
        or len(xs) != len(eff)
        or len(xs) < 1
        or not all(is_finite_number(v) for v in xs + eff)
        or any(not 0 < v < 1e18 for v in xs)
        or any(not 0 < e <= 1 for e in eff)
        or xs != sorted(xs)
    ):
        raise ConfigError(
            f"cost.profile.{key}", raw, "equal-length lists; increasing positive x; efficiencies in (0, 1]"
        )
    return Curve(x=tuple(float(v) for v in xs), efficiency=tuple(float(e) for e in eff))


def _shape_factor(raw: object) -> ShapeFactor | None:
    """The optional GEMM shape table: rows and width (sqrt(k x n)) increasing, a factor in (0, 1] per (rows, width)."""
    if raw is None:
        return None
    where = "cost.profile.gemm_shape_factor"
    if not isinstance(raw, dict) or set(raw) != {"rows", "width", "factor"}:
        raise ConfigError(where, raw, "a mapping with keys rows, width and factor")
    rows, width, factor = raw["rows"], raw["width"], raw["factor"]
    axes_ok = all(
        isinstance(a, list) and a and all(is_finite_number(v) and 0 < v < 1e18 for v in a) and a == sorted(set(a))
        for a in (rows, width)
    )
    if (
        not axes_ok
        or not isinstance(factor, list)
        or len(factor) != len(rows)
        or any(not isinstance(line, list) or len(line) != len(width) for line in factor)
        or any(not is_finite_number(f) or not 0 < f <= 1 for line in factor for f in line)
    ):
        raise ConfigError(
            where,
            raw,
            "increasing positive rows and width; factor: one list per rows value, one fraction in (0, 1] per width",
        )
    return ShapeFactor(
        rows=tuple(float(v) for v in rows),
        width=tuple(float(v) for v in width),
        factor=tuple(tuple(float(f) for f in line) for line in factor),
    )


def _device_measured(measurements: dict) -> dict:
    """What calibrate measured that the device's cost model uses besides the framework tables: call overheads
    and the optimizer's fixed and per-tensor costs."""
    out: dict = {}
    local = (measurements.get("network") or {}).get("local") or {}
    overheads = {}
    for kind in CALL_COSTS:
        series = sorted(
            (int(name.rpartition("_")[2]), float(v["fit"]["overhead_us"]) * 1e-6)
            for name, v in (local.get(kind) or {}).items()
            if name.startswith("groups_of_")
        )
        if series:
            overheads[kind] = tuple(series)
    if overheads:
        out["collective_overheads"] = overheads
    optimizer = measurements.get("optimizer") or {}
    if "per_tensor_us" in optimizer:
        out.update(
            optimizer_fixed_s=float(optimizer.get("fixed_us", 0.0)) * 1e-6,
            optimizer_per_tensor_s=float(optimizer["per_tensor_us"]) * 1e-6,
        )
    p2p = ((local.get("p2p") or {}).get("pairs_1") or {}).get("fit")
    if p2p:
        out["p2p_overhead_s"] = float(p2p["overhead_us"]) * 1e-6
    return out


def _host_measured(measurements: dict) -> HostProfile | None:
    """The shared-core terms calibrate measured on a CPU host (core sharing, blocking wait), or None."""
    out: dict = {}
    sharing = measurements.get("core_sharing")
    if sharing:
        out["core_sharing"] = _core_sharing(sharing)
        out.update(reference_cpu_s=_reference_s(sharing), reference_preset=str(sharing.get("preset", "")))
    blocking = measurements.get("blocking_wait")
    if blocking:
        out["blocking_wait"], out["scheduler_slice_s"] = _blocking_wait(blocking)
    return HostProfile(**out) if out else None


def _core_sharing(raw: object) -> tuple[tuple[float, float], ...]:
    levels = raw.get("ranks_per_core") if isinstance(raw, dict) else None
    factors = raw.get("cpu_time_factor") if isinstance(raw, dict) else None
    if (
        not isinstance(levels, list)
        or not isinstance(factors, list)
        or len(levels) != len(factors)
        or not levels
        or any(not is_finite_number(v) or v < 1 for v in levels)
        or levels != sorted(set(levels))
        or any(not is_finite_number(f) or f <= 0 for f in factors)
    ):
        raise ConfigError(
            "cost.profile.measurements.core_sharing",
            raw,
            "ranks_per_core (increasing, from 1) and cpu_time_factor (positive) of equal length",
        )
    return tuple((float(v), float(f)) for v, f in zip(levels, factors, strict=True))


def _reference_s(sharing: dict) -> float:
    """Seconds per iteration at one process per core: the median of its rounds (older profiles: the mean;
    0 where the table has neither)."""
    rounds = (sharing.get("window_means_us") or [[]])[0] or (sharing.get("cpu_us_per_iteration") or [])[:1]
    if rounds == []:
        return 0.0
    if not isinstance(rounds, list) or any(not is_finite_number(v) or v <= 0 for v in rounds):
        raise ConfigError(
            "cost.profile.measurements.core_sharing",
            sharing,
            "window_means_us (a list per level of positive microseconds) or cpu_us_per_iteration",
        )
    return float(np.median(rounds)) * 1e-6


def _blocking_wait(raw: object) -> tuple[tuple[tuple[float, float], ...], float]:
    loads = raw.get("computing_per_core") if isinstance(raw, dict) else None
    extra = raw.get("extra_per_call_us") if isinstance(raw, dict) else None
    slice_us = raw.get("scheduler_slice_us") if isinstance(raw, dict) else None
    if (
        not isinstance(loads, list)
        or not isinstance(extra, list)
        or len(loads) != len(extra)
        or not loads
        or any(not is_finite_number(v) or v < 0 for v in loads)
        or loads != sorted(set(loads))
        or any(not is_finite_number(e) or e < 0 for e in extra)
        or not is_finite_number(slice_us)
        or slice_us <= 0
    ):
        raise ConfigError(
            "cost.profile.measurements.blocking_wait",
            raw,
            "computing_per_core (>= 0, increasing) and extra_per_call_us (>= 0) of equal length, "
            "and scheduler_slice_us > 0",
        )
    return tuple((float(v), float(e) * 1e-6) for v, e in zip(loads, extra, strict=True)), float(slice_us) * 1e-6


def _checked_tables(framework: dict, where: str) -> dict:
    """_framework_tables of one entry whose types check_value has passed: its measured model a valid model, its
    shapes [seq_len, batch] pairs, and its op tables' lists of equal length (else a ConfigError naming the entry)."""
    for name in ("micro_model", "layer"):
        if framework.get(name):
            load_model(framework[name], key=f"{where}.{name}")
    shapes = framework.get("shapes") or []
    if any(len(pair) != 2 for pair in shapes):
        raise ConfigError(f"{where}.shapes", shapes, "a list of [seq_len, batch] pairs")
    try:
        return _framework_tables(framework)
    except (KeyError, ValueError) as exc:
        raise ConfigError(
            where,
            framework,
            "forward and backward op tables as calibrate writes them: each op's "
            f"time_us or tokens and times of equal length ({exc})",
        ) from None


def _framework_tables(framework: dict) -> dict:
    """The raw framework tables of one framework_overhead entry of a profile's measurements: framework_s,
    framework_experts, framework_split and by_experts ({pass: ((experts, ((tokens, seconds), ...)), ...)})."""
    out: dict = {}
    table = {}
    for pass_name in ("forward", "backward"):
        for op, entry in ((framework.get(pass_name) or {}).get("ops") or {}).items():
            times = entry.get("time_us_by_tokens") or [entry["time_us"]]
            table[(pass_name, op.partition(":")[0])] = (op, _series_s(entry.get("tokens") or [0], times))
    if table:
        match = re.search(r"E (\d+)", str(framework.get("model", "")))
        experts = (framework.get("micro_model") or framework.get("layer") or {}).get("num_experts")
        out.update(framework_s=table, framework_experts=int(experts or (match.group(1) if match else 1)))
    by_experts = {}
    for pass_name in ("forward", "backward"):
        entry = ((framework.get(pass_name) or {}).get("ops") or {}).get("experts:0") or {}
        fit = entry.get("by_experts")
        if fit:
            by_experts[pass_name] = tuple(
                (int(e), _series_s(entry["tokens"], times))
                for e, times in zip(fit["experts"], fit["time_us_by_tokens"], strict=True)
            )
    if by_experts:
        out["by_experts"] = by_experts
    split = {}
    for op, entry in ((framework.get("backward") or {}).get("ops") or {}).items():
        inputs, weights = entry.get("input_pass_us_by_tokens"), entry.get("weight_pass_us_by_tokens")
        if inputs and weights:
            split[op.partition(":")[0]] = tuple(
                (int(t), i / b if b > 0 else 1.0, w / b if b > 0 else 0.0)
                for t, b, i, w in zip(entry["tokens"], entry["time_us_by_tokens"], inputs, weights, strict=True)
            )
    if split:
        out["framework_split"] = split
    return out


def _series_s(tokens: list, times_us: list) -> tuple[tuple[int, float], ...]:
    """((tokens, seconds), ...) from a profile's token counts and microsecond times."""
    return tuple((int(t), float(us) * 1e-6) for t, us in zip(tokens, times_us, strict=True))


def _fitted(profile: DeviceProfile, tables: dict, model: dict | None, shapes: list | None) -> dict:
    """DeviceProfile framework fields from raw tables: net of the measured model's arithmetic (when the model is
    known), and the experts op's line over expert counts."""
    tables = dict(tables)
    by_experts = tables.pop("by_experts", {})
    if model:
        tables["framework_s"], by_experts = _net_of_work(profile, tables["framework_s"], by_experts, model, shapes)
    tables["framework_expert_lines"] = {pass_name: expert_lines(series) for pass_name, series in by_experts.items()}
    return tables


def _net_of_work(
    profile: DeviceProfile, framework_s: dict, by_experts: dict, model: dict, shapes: list | None
) -> tuple[dict, dict]:
    """The framework tables less the arithmetic of the model they were measured on as this profile prices
    it (the micro model's is small but not nothing: attention at 256 tokens; a preset layer's is most of
    its time), so that a priced op does not count it twice."""
    seq_of = {int(seq) * int(batch): int(seq) for seq, batch in shapes or []}

    def net(pass_name: str, op: str, experts: int, series: tuple) -> tuple:
        factor = 1.0 if pass_name == "forward" else BACKWARD_FACTOR[TaskKind.BACKWARD]
        return tuple(
            (tokens, max(seconds - factor * _layer_work_s(profile, model, seq_of, op, tokens, experts), 0.0))
            for tokens, seconds in series
        )

    return (
        {key: (op, net(key[0], op, model["num_experts"], series)) for key, (op, series) in framework_s.items()},
        {
            pass_name: tuple((e, net(pass_name, "experts:0", e, series)) for e, series in series_by_e)
            for pass_name, series_by_e in by_experts.items()
        },
    )


def _layer_work_s(profile: DeviceProfile, layer: dict, seq_of: dict, op: str, tokens: int, experts: int) -> float:
    model = load_model(dict(layer, seq_len=seq_of.get(tokens, layer["seq_len"]), num_experts=experts))
    if op.partition(":")[0] in EXCHANGE_OPS:
        return work_time_s(profile, replace(exchange_work(model, op, tokens), num_kernels=0), model.dtype_bytes)
    # the experts op ran with the router's rows spread over its experts: priced as an even spread
    rows = (tokens * model.top_k // experts,) * experts if op.startswith("experts:") else ()
    return work_time_s(profile, replace(op_work(model, op, tokens, rows), num_kernels=0), model.dtype_bytes)


def expert_lines(by_experts: Sequence[tuple[int, Sequence[tuple[int, float]]]]) -> tuple[tuple[int, float, float], ...]:
    """The experts op's fixed cost as a line over the number of experts, at each token count measured:
    from ((experts, ((tokens, seconds), ...)), ...) with one token grid, ((tokens, fixed_s, per_expert_s), ...)
    by ordinary least squares (np.polyfit, degree 1) over the expert counts."""
    counts = [e for e, _ in by_experts]
    grid = [t for t, _ in by_experts[0][1]]
    lines = []
    for j, tokens in enumerate(grid):
        per_expert, fixed = np.polyfit(counts, [float(series[j][1]) for _, series in by_experts], 1)
        lines.append((tokens, fixed, per_expert))
    return tuple(lines)
