"""Unit-suffixed config keys, converted once at load to SI (bytes, seconds, FLOP/s).

GB/s and TFLOPS are decimal (1e9, 1e12); GiB is binary.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, TypeGuard

from piper_sim.errors import ConfigError

SUFFIX_SCALE = {
    "GBps": 1e9,
    "MBps": 1e6,
    "Gbps": 1e9 / 8,
    "Mbps": 1e6 / 8,
    "us": 1e-6,
    "ns": 1e-9,
    "ms": 1e-3,
    "s": 1.0,
    "GiB": 2.0**30,
    "MiB": 2.0**20,
    "GB": 1e9,
    "TFLOPS": 1e12,
}
SI_SUFFIX = {
    "GBps": "bytes_per_s",
    "MBps": "bytes_per_s",
    "Gbps": "bytes_per_s",
    "Mbps": "bytes_per_s",
    "us": "s",
    "ns": "s",
    "ms": "s",
    "s": "s",
    "GiB": "bytes",
    "MiB": "bytes",
    "GB": "bytes",
    "TFLOPS": "flops_per_s",
}


def si_key(key: str) -> str:
    """bandwidth_GBps -> bandwidth_bytes_per_s; latency_us -> latency_s; keys without a unit unchanged."""
    base, _, suffix = key.rpartition("_")
    return f"{base}_{SI_SUFFIX[suffix]}" if base and suffix in SI_SUFFIX else key


# the largest value a unit-suffixed key may take, in SI: far beyond any machine (1e9 GB/s stands for an
# ideal network in tests; an hour's latency, an exabyte, a zettaFLOP/s), so that a typo cannot stall the flow
# network or overflow a size
SI_LIMIT = {"bytes_per_s": 1e18, "s": 3600.0, "bytes": 1e18, "flops_per_s": 1e21}
# rates must be above zero: a link or a device that moves or computes nothing stalls whatever uses it
POSITIVE_UNITS = frozenset({"bytes_per_s", "flops_per_s"})


def is_finite_number(value: object) -> TypeGuard[float]:
    """An int or float (not a bool) that is finite: what every numeric config value must be first."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def to_si(key: str, value: object, *, where: str = "") -> float:
    """Convert a value whose key ends in a unit suffix (e.g. bandwidth_GBps) to SI: a finite, non-negative
    number (positive for a rate) no larger than SI_LIMIT of its unit."""
    suffix = key.rsplit("_", 1)[-1]
    if suffix not in SUFFIX_SCALE:
        raise ConfigError(f"{where}{key}", value, f"a key ending in one of {sorted(SUFFIX_SCALE)}")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{where}{key}", value, "a number")
    scale, limit = SUFFIX_SCALE[suffix], SI_LIMIT[SI_SUFFIX[suffix]]
    positive = SI_SUFFIX[suffix] in POSITIVE_UNITS
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number) or number < 0 or (positive and number == 0) or number * scale > limit:
        span = f"above 0, at most {limit / scale:g}" if positive else f"from 0 to {limit / scale:g}"
        raise ConfigError(f"{where}{key}", value, f"a finite number {span}")
    return number * scale


def read_params(raw: object, schema: Mapping[str, object], where: str) -> dict[str, Any]:
    """Check a mapping against `schema` (key -> default; required when default is ...), convert units.

    Keys with a unit suffix come back renamed and converted to SI (latency_us -> latency_s);
    others as given. Unknown keys are an error.
    """
    if not isinstance(raw, dict):
        raise ConfigError(where.rstrip("."), raw, "a mapping")
    unknown = sorted(set(raw) - set(schema))
    if unknown:
        raise ConfigError(f"{where}{unknown[0]}", raw[unknown[0]], f"known keys: {', '.join(sorted(schema))}")
    out: dict[str, Any] = {}  # values as the input gave them (SI where suffixed): the caller checks their types
    for key, default in schema.items():
        if key not in raw:
            if default is ...:
                raise ConfigError(f"{where}{key}", None, "a value (required)")
            value = default
        else:
            value = raw[key]
            if value is None and default is not None:  # null only where leaving the key out means null
                raise ConfigError(
                    f"{where}{key}",
                    None,
                    "a value" + (" (required)" if default is ... else f" (leave the key out for {default!r})"),
                )
        if si_key(key) != key:
            out[si_key(key)] = None if value is None else to_si(key, value, where=where)
        else:
            out[key] = value
    return out


COUNT_LIMIT = 2**20  # nodes, GPUs per node, switches: a million of anything is beyond every machine


def positive_int(where: str, value: object, limit: int = COUNT_LIMIT) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= limit:
        raise ConfigError(where, value, f"a positive integer up to {limit:,}")
    return value
