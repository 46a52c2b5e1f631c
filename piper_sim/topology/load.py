"""Load a topology from a preset name, a YAML path or an inline mapping.

YAML form: {name: str, description: str, device_profile: the cost profile of its devices (optional; generic
machines name none), builder: registered builder, params: {unit-suffixed keys}, collectives: {algorithm:
{unit-suffixed keys}}, sources: [...]}. `collectives` holds the parameters of the
machine's collective algorithms (the vendor libraries' models, HALO's pipelining), read and checked by
piper_sim.collectives. A mapping may also be {preset: NAME, params: {overrides}, collectives: {overrides}}.
"""

from __future__ import annotations

import json
from pathlib import Path

from piper_sim.errors import ConfigError
from piper_sim.paths import data_dir

# the builder modules register their builders in BUILDERS when imported: all are imported here, where they are looked up
from piper_sim.topology import build_dgx, build_dragonfly, build_frontier, build_testbed  # noqa: F401
from piper_sim.topology.builders import BUILDERS
from piper_sim.topology.graph import Topology
from piper_sim.yamlio import read_yaml

KEEP_LINKS = 100_000  # a machine this large (about 0.7 s to build) is kept for the next load_topology of it
_LAST: list = []  # [key, Topology]: the last machine kept

TOPOLOGY_KEYS = ("name", "description", "device_profile", "builder", "params", "preset", "sources", "collectives")


def topology_presets() -> list[str]:
    return sorted(p.stem for p in data_dir("topologies").glob("*.yaml"))


def topology_file(spec: str | Path) -> Path:
    """The YAML file of a topology given by preset name (topologies/NAME.yaml) or path."""
    path = Path(spec)
    if path.suffix not in (".yaml", ".yml"):
        path = data_dir("topologies") / f"{spec}.yaml"
        if not path.exists():
            raise ConfigError("topology", spec, f"a preset ({', '.join(topology_presets())}) or a YAML path")
    if not path.exists():
        raise ConfigError("topology", str(spec), "an existing YAML file")
    return path


def read_topology_mapping(spec: str | dict | Path) -> dict:
    """The YAML mapping of a topology (preset resolved, overrides merged), not yet built."""
    if isinstance(spec, dict):
        raw = dict(spec)
        _check_mapping("topology.params", raw.get("params"), "params" in raw)
        if "preset" in raw:
            preset = raw.pop("preset")
            if not isinstance(preset, str):
                raise ConfigError(
                    "topology.preset", preset, f"a preset ({', '.join(topology_presets())}) or a YAML path"
                )
            base = read_topology_mapping(preset)
            params = {**(base.get("params") or {}), **(raw.pop("params", None) or {})}
            collectives = _merge_collectives(base.get("collectives") or {}, raw.pop("collectives", None) or {})
            raw = {**base, **raw, "params": params, "collectives": collectives}
    elif isinstance(spec, str | Path):
        path = topology_file(spec)
        loaded = read_yaml(path, "topology")
        if not isinstance(loaded, dict):
            raise ConfigError("topology", str(spec), "a YAML mapping")
        raw = loaded
        raw.setdefault("name", path.stem)
        _check_mapping("topology.params", raw.get("params"), "params" in raw)
    else:
        raise ConfigError("topology", spec, "a preset name, a YAML path or a mapping")
    unknown = sorted(set(raw) - set(TOPOLOGY_KEYS))
    if unknown:
        raise ConfigError(f"topology.{unknown[0]}", raw[unknown[0]], f"known keys: {', '.join(TOPOLOGY_KEYS)}")
    if "builder" not in raw:
        raise ConfigError("topology.builder", None, f"one of {', '.join(BUILDERS.names())}")
    return raw


def topology_device_profile(spec: str | dict | Path) -> tuple[str, str | None]:
    """(the topology's name, the cost profile of its devices, or None where it names none: a generic machine)."""
    raw = read_topology_mapping(spec)
    profile = raw.get("device_profile")
    if profile is not None and not isinstance(profile, str):
        raise ConfigError("topology.device_profile", profile, "the name of a profile in traces/profiles")
    return str(raw.get("name", "(inline)")), profile


def _check_mapping(key: str, value: object, given: bool) -> None:
    """A params section, where given, is a mapping (null too is refused: leave the key out for none)."""
    if given and not isinstance(value, dict):
        raise ConfigError(key, value, "a mapping of parameter names to values (leave the key out for none)")


def _merge_collectives(base: dict, over: dict) -> dict:
    """Per-algorithm override of the preset's collective parameters (key by key)."""
    for key, value in (("topology.collectives", base), ("topology.collectives", over)):
        if not isinstance(value, dict):
            raise ConfigError(key, value, "a mapping of algorithm name to parameters")
    return {name: {**(base.get(name) or {}), **(over.get(name) or {})} for name in {*base, *over}}


def load_topology(spec: str | dict | Path, num_gpus: int | None = None) -> Topology:
    """Build the topology; num_gpus sizes it when the file does not fix the node count. The last machine of at least
    KEEP_LINKS links is kept and given again for the same mapping and GPU count (a process that runs several commands
    on one large machine, as a test session does, builds it once; within one command the Machine is built once:
    piper_sim.machine)."""
    raw = read_topology_mapping(spec)
    key = json.dumps([raw, num_gpus], sort_keys=True, default=str)
    if _LAST and _LAST[0] == key:
        return _LAST[1]
    topo = _build(raw, num_gpus)
    if topo.graph.number_of_edges() >= KEEP_LINKS:
        _LAST[:] = [key, topo]
    return topo


def _build(raw: dict, num_gpus: int | None) -> Topology:
    builder = BUILDERS.get(raw["builder"], "topology.builder")
    topo = builder(raw.get("params") or {}, num_gpus)
    topo.name = raw.get("name", topo.name)
    collectives = raw.get("collectives") or {}
    if not isinstance(collectives, dict) or not all(isinstance(v, dict) for v in collectives.values()):
        raise ConfigError("topology.collectives", collectives, "a mapping of algorithm name to parameters")
    topo.collectives = {str(k): dict(v) for k, v in collectives.items()}
    if num_gpus is not None and topo.num_gpus < num_gpus:
        raise ConfigError("topology", topo.name, f"a machine with at least {num_gpus} GPUs (has {topo.num_gpus})")
    return topo
