"""Parameters of a collective algorithm on a machine: the topology YAML's `collectives` section.

Owns reading one algorithm's entry (unit-suffixed keys, converted to SI by units.read_params) against the
algorithm's schema, with the schema's defaults for keys the machine does not set, and bad values reported
as ConfigError("topology.collectives.<algorithm>.<key>", value, allowed). An entry may carry `source`
(where its values come from: a data file under traces/collectives/ or a citation), kept as text.
Each algorithm registers its schema (register_params); algorithms.check_collective_params reads every entry a machine
gives when the run starts, so a bad value is refused whether or not the run reaches the algorithm.
Pure Python; no simpy or torch.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from piper_sim.bounds import UNITS_LIMIT, read_int
from piper_sim.errors import ConfigError
from piper_sim.topology.graph import Topology
from piper_sim.units import read_params, si_key

_CACHE: weakref.WeakKeyDictionary[Topology, dict[str, dict]] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class ParamSchema:
    """An algorithm's keys (key -> default; required when ...), those that are positive integers, those that must
    be above zero (chunk sizes), and a further check of the read values on a machine (may raise ConfigError)."""

    keys: Mapping[str, object]
    integers: tuple[str, ...] = ()
    positive: tuple[str, ...] = ()
    check: Callable[[Topology, dict], None] | None = None


SCHEMAS: dict[str, ParamSchema] = {}


def register_params(algorithm: str, schema: ParamSchema) -> None:
    SCHEMAS[algorithm] = schema


def check_fraction(value: object, key: str) -> None:
    """A share of a link's rate: a number in (0, 1]."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise ConfigError(key, value, "a fraction in (0, 1]")


def check_units(value: object, key: str) -> None:
    """Compute units (SMs, CUs) a library's kernels hold: unset (None) or a positive integer (bounds.read_int)."""
    if value is not None:
        read_int(key, value, low=1, limit=UNITS_LIMIT)


def library_units(topo: Topology, algorithm: str) -> int:
    """The compute units the algorithm's kernels hold on this machine while they run (its `compute_units`), 0 where
    the machine does not say."""
    if algorithm not in SCHEMAS or "compute_units" not in SCHEMAS[algorithm].keys or algorithm not in topo.collectives:
        return 0
    return algorithm_params(topo, algorithm)["compute_units"] or 0


def algorithm_params(topo: Topology, algorithm: str) -> dict[str, Any]:
    """The algorithm's parameters on this topology (SI keys), defaults filled in; cached per topology."""
    per_topology = _CACHE.setdefault(topo, {})
    hit = per_topology.get(algorithm)
    if hit is not None:
        return hit
    schema = SCHEMAS[algorithm]
    raw = dict(topo.collectives.get(algorithm) or {})
    raw.pop("source", None)
    where = f"topology.collectives.{algorithm}."
    params = read_params(raw, schema.keys, where)
    for name, default in schema.keys.items():
        value = params[si_key(name)]
        if name in schema.integers or (isinstance(default, int) and not isinstance(default, bool)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{where}{name}", value, "a positive integer")
        if name in schema.positive and not value > 0:
            raise ConfigError(f"{where}{name}", raw.get(name), "a number above 0")
    if schema.check is not None:
        schema.check(topo, params)
    per_topology[algorithm] = params
    return params
