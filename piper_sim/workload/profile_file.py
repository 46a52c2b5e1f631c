"""A cost profile's YAML before it is fitted: where a named profile lives, the file read with what it
extends merged in, and the kind of device it prices.

Owns finding a profile (traces/profiles/NAME.yaml or a path), `extends` (one level) and `device_kind`, the
short name of the device a profile prices, which a topology's device_profile is matched by
(piper_sim.profile_choice). The schema of the rest and the fits are piper_sim.workload.profile_load's.
"""

from __future__ import annotations

from pathlib import Path

from piper_sim.errors import ConfigError, one_of
from piper_sim.paths import data_dir
from piper_sim.yamlio import read_yaml

RESERVE_KEYS = ("framework_reserve", "framework_reserve_GiB")  # fixed, or by communicator (profile_load.py)
CPU = "cpu"  # the device_kind of the profiles calibrate measures on CPUs


def profile_path(spec: str | Path) -> Path:
    """The file of a profile given by name (traces/profiles/NAME.yaml) or path."""
    path = Path(spec)
    if path.suffix not in (".yaml", ".yml"):
        path = data_dir("traces/profiles") / f"{spec}.yaml"
    if not path.exists():
        names = sorted(p.stem for p in data_dir("traces/profiles").glob("*.yaml"))
        raise ConfigError("cost.profile", str(spec), f"{one_of(names, str(spec))} or a YAML path (no file {path})")
    return path


def read_profile_raw(spec: str | Path | dict) -> object:
    """A profile's mapping by name, path or inline, with the profile it extends merged in (not yet checked)."""
    if not isinstance(spec, str | Path | dict):
        raise ConfigError("cost.profile", spec, "a profile name (traces/profiles/NAME.yaml), a YAML path or a mapping")
    return _extended(spec if isinstance(spec, dict) else read_yaml(profile_path(spec), "cost.profile"))


def profile_device_kind(spec: str | Path | dict) -> str:
    """The kind of device a profile prices (its `device_kind`, or that of the profile it extends; "" when it
    names none)."""
    raw = read_profile_raw(spec)
    kind = raw.get("device_kind", "") if isinstance(raw, dict) else ""
    if not isinstance(kind, str):
        raise ConfigError("cost.profile.device_kind", kind, "a short name of the device (mi250x, h100, cpu, ...)")
    return kind


def _extended(raw: object) -> object:
    """A profile that extends another (`extends: NAME`): the other's keys, those this one gives replaced (either
    form of the framework reserve replaces both of the other's). One level: the profile extended may not extend one
    itself."""
    if not isinstance(raw, dict) or raw.get("extends") is None:
        return raw
    base_name = raw["extends"]
    if not isinstance(base_name, str):
        raise ConfigError("cost.profile.extends", base_name, "the name of a profile in traces/profiles")
    base = read_yaml(profile_path(base_name), "cost.profile.extends")
    if not isinstance(base, dict) or base.get("extends") is not None:
        raise ConfigError("cost.profile.extends", base_name, "a profile that extends none itself")
    if any(key in raw for key in RESERVE_KEYS):  # the reserve's two forms are one setting: this profile's replaces
        base = {k: v for k, v in base.items() if k not in RESERVE_KEYS}
    return {**base, **{k: v for k, v in raw.items() if k != "extends"}}
