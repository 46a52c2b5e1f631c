"""Reading a cost profile (traces/profiles/NAME.yaml, a path or an inline mapping) into the fitted
DeviceProfile and, where calibrate measured shared cores, the HostProfile (piper_sim.workload.profile).

Owns the profile file's schema (unit-suffixed keys, converted once) and the checks of its device tables (efficiency
curves, the GEMM shape table, the MoE path, the framework reserve, fp8 rates). What is derived from its
measurements at load (call overheads, framework costs net of the measured model's arithmetic, the host's terms) is
profile_measurements.py's; measuring is piper_sim.calibrate's; finding a profile's file and what it extends is
profile_file.py's. Pure numpy and yaml: no torch, no simpy.
"""

from __future__ import annotations

from pathlib import Path

from piper_sim.bounds import UNITS_LIMIT, check_value, read_int
from piper_sim.errors import ConfigError
from piper_sim.units import is_finite_number, read_params
from piper_sim.workload.flops import MEMORY_KINDS
from piper_sim.workload.profile import (
    AttentionBmmEfficiency,
    Curve,
    DeviceProfile,
    FrameworkReserve,
    HostProfile,
    MoePath,
    ShapeFactor,
)
from piper_sim.workload.profile_file import read_profile_raw
from piper_sim.workload.profile_measurements import (
    MEASUREMENTS_SHAPE,
    device_measured,
    host_measured,
    with_framework_costs,
)

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
    "compute_units": None,
}
RESERVE_SCHEMA = {"context_MiB": ..., "first_communicator_MiB": ..., "per_communicator_MiB": ...}
MOE_PATH_SCHEMA = {"gate_us": ..., "gather_GBps": ..., "scatter_GBps": ...}
ATTENTION_BMM_SCHEMA = {"writes_scores": ..., "reads_scores": ...}


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
        compute_units=_compute_units(p["compute_units"]),
        **_fp8(p),
        **{
            "collective_overhead_s": p["collective_overhead_s"],
            "p2p_overhead_s": p["p2p_overhead_s"],
            **device_measured(measurements),
        },
    )
    profile = with_framework_costs(profile, measurements)
    return profile, host_measured(measurements)


def _compute_units(value: object) -> int | None:
    """The device's SMs (CUs): none or a positive integer."""
    return None if value is None else read_int("cost.profile.compute_units", value, low=1, limit=UNITS_LIMIT)


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
