"""Parameters of a collective algorithm on a machine: the topology YAML's `collectives` section.

Owns reading one algorithm's entry (unit-suffixed keys, converted to SI by units.read_params) against the
algorithm's schema, with the schema's defaults for keys the machine does not set, and bad values reported
as ConfigError("topology.collectives.<algorithm>.<key>", value, allowed). An entry may carry `source`
(where its values come from: a data file under traces/collectives/ or a citation), kept as text.
Pure Python; no simpy or torch.
"""

from __future__ import annotations

import weakref

from piper_sim.errors import ConfigError
from piper_sim.topology.graph import Topology
from piper_sim.units import read_params

_CACHE: weakref.WeakKeyDictionary[Topology, dict[str, dict]] = weakref.WeakKeyDictionary()


def algorithm_params(topo: Topology, algorithm: str, schema: dict[str, object],
                     integers: tuple[str, ...] = ()) -> dict[str, object]:
    """The algorithm's parameters on this topology (SI keys), defaults filled in; cached per topology.

    Keys in `integers` (and keys whose default is an int) must be positive integers."""
    per_topology = _CACHE.setdefault(topo, {})
    hit = per_topology.get(algorithm)
    if hit is not None:
        return hit
    raw = dict(topo.collectives.get(algorithm) or {})
    raw.pop("source", None)
    where = f"topology.collectives.{algorithm}."
    params = read_params(raw, schema, where)
    for name, value in params.items():
        default = schema.get(name)
        if name in integers or (isinstance(default, int) and not isinstance(default, bool)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{where}{name}", value, "a positive integer")
    per_topology[algorithm] = params
    return params
