"""What a cost profile's `measurements` (calibrate's records, traces/profiles/NAME.yaml) give the profiles at load:
the collective and p2p call overheads and the optimizer's fixed and per-tensor costs of the DeviceProfile, its
framework costs net of the measured model's own arithmetic as this profile prices it and the experts op's line over
expert counts (expert_lines), and the shared-core terms of the HostProfile (piper_sim.workload.profile).

Owns MEASUREMENTS_SHAPE (the parts of `measurements` a load reads, by type) and the checks of those tables; the rest
of the profile file's schema is profile_load.py's. Pure numpy: no torch, no simpy.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from piper_sim.errors import ConfigError
from piper_sim.units import is_finite_number
from piper_sim.workload.flops import EXCHANGE_OPS, exchange_work, op_work
from piper_sim.workload.presets import load_model
from piper_sim.workload.profile import DeviceProfile, HostProfile, layer_key
from piper_sim.workload.roofline import work_time_s
from piper_sim.workload.task_kinds import TaskKind

# the collectives whose measured per-call overhead (network.local.<kind>.groups_of_<n>.fit) the simulator charges
# per library call of that kind (DeviceProfile.collective_call_s)
CALL_COSTS = ("all_to_all", "all_reduce", "all_gather", "reduce_scatter")
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


def with_framework_costs(profile: DeviceProfile, measurements: dict) -> DeviceProfile:
    """The profile with the framework costs calibrate measured (framework_overhead, and framework_overhead_by_model
    by preset layer), each net of the arithmetic of the model it was measured on."""
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
    return profile


def device_measured(measurements: dict) -> dict:
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


def host_measured(measurements: dict) -> HostProfile | None:
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
        kind = TaskKind.FORWARD if pass_name == "forward" else TaskKind.BACKWARD
        return tuple(
            (tokens, max(seconds - _layer_work_s(profile, model, seq_of, op, tokens, experts, kind), 0.0))
            for tokens, seconds in series
        )

    return (
        {key: (op, net(key[0], op, model["num_experts"], series)) for key, (op, series) in framework_s.items()},
        {
            pass_name: tuple((e, net(pass_name, "experts:0", e, series)) for e, series in series_by_e)
            for pass_name, series_by_e in by_experts.items()
        },
    )


def _layer_work_s(
    profile: DeviceProfile, layer: dict, seq_of: dict, op: str, tokens: int, experts: int, kind: TaskKind
) -> float:
    model = load_model(dict(layer, seq_len=seq_of.get(tokens, layer["seq_len"]), num_experts=experts))
    if op.partition(":")[0] in EXCHANGE_OPS:  # host work, the same in both passes (TaskCoster.exchange_s)
        return work_time_s(profile, replace(exchange_work(model, op, tokens), num_kernels=0), model.dtype_bytes)
    # the experts op ran with the router's rows spread over its experts: priced as an even spread
    rows = (tokens * model.top_k // experts,) * experts if op.startswith("experts:") else ()
    return work_time_s(profile, replace(op_work(model, op, tokens, rows), num_kernels=0), model.dtype_bytes, kind=kind)


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
