"""Compute cost model: time of a compute task from its ops' work and a device profile.

Owns CostProfile (read from traces/profiles/NAME.yaml) and the roofline with efficiency curves.
Must not import simpy or torch. Time of one GEMM = max(FLOPs / (peak x eff(rows)), bytes / HBM);
attention core uses an efficiency curve over sequence length; elementwise work is bound by HBM
bandwidth; each kernel pays a launch overhead.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import yaml

from piper_sim.errors import ConfigError
from piper_sim.paths import data_dir
from piper_sim.units import read_params
from piper_sim.workload.flops import EXCHANGE_OPS, Gemm, OpWork, exchange_work, op_work
from piper_sim.workload.model import ModelSpec

if TYPE_CHECKING:
    from piper_sim.schedule.ir import Task

BACKWARD_FACTOR = {
    "forward": 1.0, "forward_expert": 1.0, "backward": 2.0, "backward_expert": 2.0,
    "backward_input": 1.0, "backward_expert_input": 1.0, "backward_weight": 1.0,
}

PROFILE_SCHEMA = {
    "name": ..., "device": ..., "source": "", "date": "", "versions": None, "machine": None,
    "peak_bf16_TFLOPS": ..., "hbm_GiB": ..., "hbm_bandwidth_GBps": ..., "memory_efficiency": 0.8,
    "kernel_launch_us": 5.0, "gemm_efficiency": ..., "attention_efficiency": ..., "optimizer_bytes_per_param": 36,
    "measurements": None, "collective_overhead_us": 0.0, "p2p_overhead_us": 0.0,
}


@dataclass(frozen=True, kw_only=True)
class Curve:
    """Piecewise-linear efficiency in log2(x); flat beyond the ends."""

    x: tuple[float, ...]
    efficiency: tuple[float, ...]

    def __call__(self, value: float) -> float:
        return float(np.interp(math.log2(max(value, 1.0)), np.log2(self.x), self.efficiency))


@dataclass(frozen=True, kw_only=True)
class CostProfile:
    name: str
    device: str
    peak_flops_per_s: float
    hbm_bytes: float
    hbm_bytes_per_s: float
    memory_efficiency: float
    kernel_launch_s: float
    gemm_efficiency: Curve  # over GEMM rows (tokens)
    attention_efficiency: Curve  # over sequence length
    optimizer_bytes_per_param: float  # HBM traffic of one Adam update per parameter
    collective_overhead_s: float = 0.0  # host-side cost of one collective call (launch, split exchange)
    p2p_overhead_s: float = 0.0  # host-side cost of posting one send/recv pair
    source: str = ""
    # measured by calibrate (measurements): fixed framework cost per (pass, op name) -> (op, ((tokens,
    # seconds), ...)) net of the micro model's own arithmetic, and per-call
    # collective overhead by group size {kind: ((group size, seconds), ...)}
    framework_s: dict = field(default_factory=dict)
    framework_experts: int = 0
    # the experts op at several numbers of experts: {pass: ((experts, ((tokens, seconds), ...)), ...)}
    framework_by_experts: dict = field(default_factory=dict)
    # the zero-bubble split of each op's backward: {op name: ((tokens, input pass / backward, weight pass /
    # backward), ...)}
    framework_split: dict = field(default_factory=dict)
    collective_overheads: dict = field(default_factory=dict)
    # CPU hosts whose ranks share cores: (ranks per core, CPU time factor), ...; 1 at one rank per core
    core_sharing: tuple[tuple[float, float], ...] = ()
    # CPU hosts whose ranks share cores: (ranks computing per core, extra seconds per library call of a
    # blocking exchange), ...; and the scheduler slice the simulator averages that load over
    blocking_wait: tuple[tuple[float, float], ...] = ()
    scheduler_slice_s: float = 0.0
    optimizer_fixed_s: float = 0.0  # measured: time = fixed + per_tensor x tensors + per_param x params
    optimizer_per_tensor_s: float = 0.0
    # the framework fields measured on one layer of a preset at its own dimensions: ((layer_key, {field:
    # table}), ...); a model with that key is priced with them (for_model) instead of the micro model's
    framework_by_layer: tuple = ()
    # the machine's speed when calibrated: CPU seconds per iteration of one layer's forward + backward, one
    # process per core (core_sharing at 1 per core, median over rounds); validate compares its runs' (0: none)
    reference_cpu_s: float = 0.0
    reference_preset: str = ""

    def for_model(self, model: ModelSpec) -> CostProfile:
        """This profile with the framework tables measured on this model's layer, when calibrate ran one."""
        key = layer_key(model)
        for layer, tables in self.framework_by_layer:
            if layer == key:
                return replace(self, **tables)
        return self

    def collective_call_s(self, kind: str, group_size: int) -> float:
        """Host cost of one collective call of this kind and group size (interpolated in group size)."""
        table = self.collective_overheads.get(kind)
        if not table:
            return self.collective_overhead_s
        sizes, seconds = zip(*table, strict=True)
        return float(np.interp(group_size, sizes, seconds))

    def core_sharing_factor(self, ranks_per_core: float) -> float:
        """How much more CPU time the same compute takes when this many ranks take turns on each core
        (measured; flat beyond the largest level measured, 1 where nothing was measured)."""
        if not self.core_sharing or ranks_per_core <= 1.0:
            return 1.0
        levels, factors = zip(*self.core_sharing, strict=True)
        return float(np.interp(ranks_per_core, levels, factors))

    def blocking_wait_s(self, computing_per_core: float) -> float:
        """Extra wait of one library call of a blocking exchange when this many ranks per core are computing
        (measured from load 0; linear between the levels, flat beyond the last; 0 where nothing was measured)."""
        if not self.blocking_wait:
            return 0.0
        levels, extra = zip(*self.blocking_wait, strict=True)
        return float(np.interp(computing_per_core, levels, extra))

    def gemm_time_s(self, gemm: Gemm, dtype_bytes: int) -> float:
        flop_time = gemm.flops / (self.peak_flops_per_s * self.gemm_efficiency(gemm.rows))
        traffic = gemm.count * dtype_bytes * (gemm.rows * gemm.k + gemm.k * gemm.n + gemm.rows * gemm.n)
        return max(flop_time, traffic / (self.hbm_bytes_per_s * self.memory_efficiency))

    def work_time_s(self, work: OpWork, dtype_bytes: int) -> float:
        t = sum(self.gemm_time_s(g, dtype_bytes) for g in work.gemms)
        if work.attention_flops:
            t += work.attention_flops / (self.peak_flops_per_s * self.attention_efficiency(work.attention_seq_len))
        t += work.elementwise_bytes / (self.hbm_bytes_per_s * self.memory_efficiency)
        return t + work.num_kernels * self.kernel_launch_s


def _curve(raw: object, key: str, x_key: str) -> Curve:
    if not isinstance(raw, dict) or set(raw) != {x_key, "efficiency"}:
        raise ConfigError(f"cost profile {key}", raw, f"a mapping with keys {x_key} and efficiency")
    xs, eff = raw[x_key], raw["efficiency"]
    if (not isinstance(xs, list) or not isinstance(eff, list) or len(xs) != len(eff) or len(xs) < 1
            or any(v <= 0 for v in xs) or any(not 0 < e <= 1 for e in eff) or xs != sorted(xs)):
        raise ConfigError(f"cost profile {key}", raw,
                          "equal-length lists; increasing positive x; efficiencies in (0, 1]")
    return Curve(x=tuple(float(v) for v in xs), efficiency=tuple(float(e) for e in eff))


def profile_path(spec: str | Path) -> Path:
    """The file of a profile given by name (traces/profiles/NAME.yaml) or path."""
    path = Path(spec)
    if path.suffix not in (".yaml", ".yml"):
        path = data_dir("traces/profiles") / f"{spec}.yaml"
    if not path.exists():
        names = sorted(p.stem for p in data_dir("traces/profiles").glob("*.yaml"))
        raise ConfigError("cost.profile", str(spec), f"one of {', '.join(names)} or a YAML path")
    return path


def load_profile(spec: str | Path | dict) -> CostProfile:
    """A profile by name (traces/profiles/NAME.yaml), path, or inline mapping."""
    raw = spec if isinstance(spec, dict) else yaml.safe_load(profile_path(spec).read_text())
    p = read_params(raw, PROFILE_SCHEMA, "cost.profile.")
    profile = CostProfile(
        name=p["name"], device=p["device"], source=p["source"], peak_flops_per_s=p["peak_bf16_flops_per_s"],
        hbm_bytes=p["hbm_bytes"], hbm_bytes_per_s=p["hbm_bandwidth_bytes_per_s"],
        memory_efficiency=p["memory_efficiency"], kernel_launch_s=p["kernel_launch_s"],
        gemm_efficiency=_curve(p["gemm_efficiency"], "gemm_efficiency", "rows"),
        attention_efficiency=_curve(p["attention_efficiency"], "attention_efficiency", "seq_len"),
        optimizer_bytes_per_param=float(p["optimizer_bytes_per_param"]),
        **{"collective_overhead_s": p["collective_overhead_s"], "p2p_overhead_s": p["p2p_overhead_s"],
           **_measured(p.get("measurements") or {})},
    )
    measurements = p.get("measurements") or {}
    framework = measurements.get("framework_overhead") or {}
    if profile.framework_s and framework.get("micro_model"):
        profile = replace(profile, **_net_of_work(profile, profile.framework_s, profile.framework_by_experts,
                                                  framework["micro_model"], framework.get("shapes")))
    from piper_sim.workload.presets import load_model

    by_layer = []
    for name, entry in (measurements.get("framework_overhead_by_model") or {}).items():
        tables = _framework_tables(entry) if isinstance(entry, dict) else {}
        layer = entry.get("layer") if isinstance(entry, dict) else None
        if not tables or not isinstance(layer, dict):
            raise ConfigError(f"cost profile measurements.framework_overhead_by_model.{name}", entry,
                              "a layer (model dict) and forward/backward op tables, as calibrate writes them")
        tables.update(_net_of_work(profile, tables["framework_s"], tables.get("framework_by_experts", {}), layer,
                                   entry.get("shapes")))
        by_layer.append((layer_key(load_model(layer)), tables))
    return replace(profile, framework_by_layer=tuple(by_layer)) if by_layer else profile


# ModelSpec fields a layer's op times do not depend on (or that vary by run: tokens, experts per rank)
NOT_IN_LAYER_KEY = frozenset({"name", "num_layers", "seq_len", "num_experts", "num_dense_layers", "moe_layer_freq",
                              "moe_layer_offset", "published_params", "published_active_params", "source"})


def layer_key(model: ModelSpec) -> tuple:
    """What a layer's op times depend on besides tokens and experts per rank: two models with the same
    key run the same ops on tensors of the same sizes."""
    return tuple((f.name, getattr(model, f.name)) for f in fields(model) if f.name not in NOT_IN_LAYER_KEY)


def _measured(measurements: dict) -> dict:
    """What calibrate measured that the cost model uses: framework overhead per op, call overheads."""
    out: dict = _framework_tables(measurements.get("framework_overhead") or {})
    local = (measurements.get("network") or {}).get("local") or {}
    overheads = {}
    for kind in ("all_to_all", "all_reduce"):
        series = sorted((int(name.rpartition("_")[2]), float(v["fit"]["overhead_us"]) * 1e-6)
                        for name, v in (local.get(kind) or {}).items() if name.startswith("groups_of_"))
        if series:
            overheads[kind] = tuple(series)
    if overheads:
        out["collective_overheads"] = overheads
    sharing = measurements.get("core_sharing")
    if sharing:
        out["core_sharing"] = _core_sharing(sharing)
        out.update(reference_cpu_s=_reference_s(sharing), reference_preset=str(sharing.get("preset", "")))
    blocking = measurements.get("blocking_wait")
    if blocking:
        out["blocking_wait"], out["scheduler_slice_s"] = _blocking_wait(blocking)
    optimizer = measurements.get("optimizer") or {}
    if "per_tensor_us" in optimizer:
        out.update(optimizer_fixed_s=float(optimizer.get("fixed_us", 0.0)) * 1e-6,
                   optimizer_per_tensor_s=float(optimizer["per_tensor_us"]) * 1e-6)
    p2p = ((local.get("p2p") or {}).get("pairs_1") or {}).get("fit")
    if p2p:
        out["p2p_overhead_s"] = float(p2p["overhead_us"]) * 1e-6
    return out


def _core_sharing(raw: object) -> tuple[tuple[float, float], ...]:
    levels = raw.get("ranks_per_core") if isinstance(raw, dict) else None
    factors = raw.get("cpu_time_factor") if isinstance(raw, dict) else None
    if (not isinstance(levels, list) or not isinstance(factors, list) or len(levels) != len(factors) or not levels
            or any(not isinstance(v, int | float) or v < 1 for v in levels) or levels != sorted(set(levels))
            or any(not isinstance(f, int | float) or f <= 0 for f in factors)):
        raise ConfigError("cost profile measurements.core_sharing", raw,
                          "ranks_per_core (increasing, from 1) and cpu_time_factor (positive) of equal length")
    return tuple((float(v), float(f)) for v, f in zip(levels, factors, strict=True))


def _reference_s(sharing: dict) -> float:
    """Seconds per iteration at one process per core: the median of its rounds (older profiles: the mean;
    0 where the table has neither)."""
    rounds = (sharing.get("window_means_us") or [[]])[0] or (sharing.get("cpu_us_per_iteration") or [])[:1]
    if rounds == []:
        return 0.0
    if not isinstance(rounds, list) or any(not isinstance(v, int | float) or v <= 0 for v in rounds):
        raise ConfigError("cost profile measurements.core_sharing", sharing,
                          "window_means_us (a list per level of positive microseconds) or cpu_us_per_iteration")
    return float(np.median(rounds)) * 1e-6


def _blocking_wait(raw: object) -> tuple[tuple[tuple[float, float], ...], float]:
    loads = raw.get("computing_per_core") if isinstance(raw, dict) else None
    extra = raw.get("extra_per_call_us") if isinstance(raw, dict) else None
    slice_us = raw.get("scheduler_slice_us") if isinstance(raw, dict) else None
    if (not isinstance(loads, list) or not isinstance(extra, list) or len(loads) != len(extra) or not loads
            or any(not isinstance(v, int | float) or v < 0 for v in loads) or loads != sorted(set(loads))
            or any(not isinstance(e, int | float) or e < 0 for e in extra)
            or not isinstance(slice_us, int | float) or slice_us <= 0):
        raise ConfigError("cost profile measurements.blocking_wait", raw,
                          "computing_per_core (>= 0, increasing) and extra_per_call_us (>= 0) of equal length, "
                          "and scheduler_slice_us > 0")
    return tuple((float(v), float(e) * 1e-6) for v, e in zip(loads, extra, strict=True)), float(slice_us) * 1e-6


def _framework_tables(framework: dict) -> dict:
    """CostProfile's framework fields from one framework_overhead table of a profile's measurements."""
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
            by_experts[pass_name] = tuple((int(e), _series_s(entry["tokens"], times))
                                          for e, times in zip(fit["experts"], fit["time_us_by_tokens"], strict=True))
    if by_experts:
        out["framework_by_experts"] = by_experts
    split = {}
    for op, entry in ((framework.get("backward") or {}).get("ops") or {}).items():
        inputs, weights = entry.get("input_pass_us_by_tokens"), entry.get("weight_pass_us_by_tokens")
        if inputs and weights:
            split[op.partition(":")[0]] = tuple(
                (int(t), i / b if b > 0 else 1.0, w / b if b > 0 else 0.0)
                for t, b, i, w in zip(entry["tokens"], entry["time_us_by_tokens"], inputs, weights, strict=True))
    if split:
        out["framework_split"] = split
    return out


def _series_s(tokens: list, times_us: list) -> tuple[tuple[int, float], ...]:
    """((tokens, seconds), ...) from a profile's token counts and microsecond times."""
    return tuple((int(t), float(us) * 1e-6) for t, us in zip(tokens, times_us, strict=True))


def _net_of_work(profile: CostProfile, framework_s: dict, by_experts: dict, model: dict, shapes: list) -> dict:
    """The framework tables less the arithmetic of the model they were measured on as this profile prices
    it (the micro model's is small but not nothing: attention at 256 tokens; a preset layer's is most of
    its time), so that a priced op does not count it twice."""
    seq_of = {int(seq) * int(batch): int(seq) for seq, batch in shapes or []}

    def net(pass_name: str, op: str, experts: int, series: tuple) -> tuple:
        factor = 1.0 if pass_name == "forward" else BACKWARD_FACTOR["backward"]
        return tuple((tokens, max(seconds - factor * _layer_work_s(profile, model, seq_of, op, tokens, experts), 0.0))
                     for tokens, seconds in series)

    return {"framework_s": {key: (op, net(key[0], op, model["num_experts"], series))
                            for key, (op, series) in framework_s.items()},
            "framework_by_experts": {pass_name: tuple((e, net(pass_name, "experts:0", e, series))
                                                      for e, series in series_by_e)
                                     for pass_name, series_by_e in by_experts.items()}}


def _layer_work_s(profile: CostProfile, layer: dict, seq_of: dict, op: str, tokens: int, experts: int) -> float:
    from piper_sim.workload.presets import load_model

    model = load_model(dict(layer, seq_len=seq_of.get(tokens, layer["seq_len"]), num_experts=experts))
    if op.partition(":")[0] in EXCHANGE_OPS:
        return profile.work_time_s(replace(exchange_work(model, op, tokens), num_kernels=0), model.dtype_bytes)
    # the experts op ran with the router's rows spread over its experts: priced as an even spread
    rows = (tokens * model.top_k // experts,) * experts if op.startswith("experts:") else ()
    return profile.work_time_s(replace(op_work(model, op, tokens, rows), num_kernels=0), model.dtype_bytes)


class TaskCoster:
    """Time and FLOPs of compute tasks for one model, profile and micro-batch size, memoized."""

    def __init__(self, model: ModelSpec, profile: CostProfile, tokens_per_microbatch: int) -> None:
        self.model, self.profile, self.tokens = model, profile.for_model(model), tokens_per_microbatch
        self._cache: dict[tuple, tuple[float, float]] = {}

    def cost(self, kind: str, ops: tuple[str, ...], expert_rows: tuple[int, ...] = ()) -> tuple[float, float]:
        """(seconds, flops) of a compute task of this kind running these ops."""
        key = (kind, ops, expert_rows)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        factor = BACKWARD_FACTOR[kind]
        seconds = flops = 0.0
        for op in ops:
            work = op_work(self.model, op, self.tokens, expert_rows)
            fixed = self._framework_s(kind, op, expert_rows, work)
            if fixed is None:
                seconds += factor * self.profile.work_time_s(work, self.model.dtype_bytes)
            else:  # measured fixed cost of the op's code path, plus its arithmetic without per-kernel launches
                arithmetic = replace(work, num_kernels=0)
                seconds += fixed + factor * self.profile.work_time_s(arithmetic, self.model.dtype_bytes)
            flops += factor * work.flops
        self._cache[key] = (seconds, flops)
        return seconds, flops

    def _framework_s(self, kind: str, op: str, expert_rows: tuple[int, ...],
                     work: OpWork | None = None) -> float | None:
        """Measured fixed cost of this op in this pass, or None when the profile has none.

        A split backward (zero bubble) defers only the linears' weight GEMMs (torch backend:
        layers.DeferredWeightGrads): each pass takes the share of the backward's fixed cost calibrate
        measured for it; without that measurement the input pass takes all of it and the weight pass one
        launch per GEMM. An experts op is a fixed part plus a part per expert that got rows, from the line
        over the numbers of experts calibrate ran (profiles with one number scale it).
        """
        name = op.partition(":")[0]
        pass_name = "forward" if kind.startswith("forward") else "backward"
        entry = self.profile.framework_s.get((pass_name, name))
        if entry is None:
            return None
        tokens, seconds = zip(*entry[1], strict=True)  # flat beyond the measured token counts
        base = float(np.interp(self.tokens, tokens, seconds))
        if name == "experts":
            active = sum(1 for r in expert_rows if r > 0)
            by_experts = self.profile.framework_by_experts.get(pass_name)
            if not by_experts:  # one expert count measured: scale it
                base *= active / max(self.profile.framework_experts, 1)
            else:
                counts = [e for e, _ in by_experts]
                at_tokens = [float(np.interp(self.tokens, *zip(*series, strict=True))) for _, series in by_experts]
                per_expert, fixed = np.polyfit(counts, at_tokens, 1)  # a fixed part and a part per expert
                base = max(float(fixed + per_expert * active), 0.0)
        if kind not in ("backward_input", "backward_expert_input", "backward_weight"):
            return base
        split = self.profile.framework_split.get(name)
        if not split:  # unmeasured: the input pass runs the whole backward, the weight pass its deferred GEMMs
            if kind != "backward_weight":
                return base
            gemms = (work or op_work(self.model, op, self.tokens, expert_rows)).gemms
            return self.profile.kernel_launch_s * sum(g.count for g in gemms)
        tokens, inputs, weights = zip(*split, strict=True)
        share = inputs if kind != "backward_weight" else weights
        return base * float(np.interp(self.tokens, tokens, share))

    def op_s(self, op: str, expert_rows: tuple[int, ...] = ()) -> tuple[float, float]:
        """Forward and backward seconds of one op alone (an experts op as forward_expert / backward_expert),
        as the simulator prices it; expert_rows are the rows each local expert gets (zeros dropped)."""
        expert = op.startswith("experts:")
        rows = tuple(r for r in expert_rows if r > 0) if expert else ()
        return (self.cost("forward_expert" if expert else "forward", (op,), rows)[0],
                self.cost("backward_expert" if expert else "backward", (op,), rows)[0])

    def exchange_s(self, task: Task) -> float:
        """Host work around one MoE all-to-all (dispatch or combine) besides its library calls: the fixed cost
        calibrate measured for it (the forward dispatch packs the expert ids into the rows and unpacks them;
        every other exchange passes its rows) plus its memory traffic; 0 where the profile did not measure it,
        and for expert migration."""
        if task.role not in ("dispatch", "combine"):
            return 0.0
        op = "dispatch:0" if task.in_forward and task.role == "dispatch" else "combine:0"
        hit = self._cache.get(op)
        if hit is None:
            entry = self.profile.framework_s.get(("forward", op.partition(":")[0]))
            hit = (0.0, 0.0)
            if entry is not None:
                tokens, seconds = zip(*entry[1], strict=True)
                work = replace(exchange_work(self.model, op, self.tokens), num_kernels=0)
                hit = (float(np.interp(self.tokens, tokens, seconds))
                       + self.profile.work_time_s(work, self.model.dtype_bytes), 0.0)
            self._cache[op] = hit
        return hit[0]

    def optimizer_time_s(self, num_params: float, num_tensors: int) -> float:
        """Adam over a rank's parameters: the fixed and per-tensor costs calibrate measured (the update
        runs tensor by tensor), plus the per-parameter traffic."""
        p = self.profile
        traffic = num_params * p.optimizer_bytes_per_param / (p.hbm_bytes_per_s * p.memory_efficiency)
        return p.optimizer_fixed_s + p.optimizer_per_tensor_s * num_tensors + traffic
