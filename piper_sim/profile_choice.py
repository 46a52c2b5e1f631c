"""Which cost profile prices a run's devices: the one the config gives, else the machine's own.

Owns the rule that ties cost.profile to the machine. A topology names the profile of its devices
(`device_profile` in topologies/NAME.yaml; generic machines name none); a real run's ranks on this machine's
CPUs are CPU devices whatever the topology. Without cost.profile the machine's profile is taken, or
DEFAULT_PROFILE where the machine names none. A given profile must price the same kind of device as the
machine's (`device_kind` in the profile, inherited through `extends`), unless the config allows another
(cost.allow_device_mismatch: true). Reads the topology and profile YAML only; builds nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from piper_sim.errors import ConfigError
from piper_sim.workload.profile_file import CPU, profile_device_kind

DEFAULT_PROFILE = "mi250x"  # where the machine names no device profile (uniform, fat-tree, dragonfly)
CPU_RUN_PROFILE = "cpu-dev"  # ranks on this machine's CPUs, where the topology's profile is not a CPU one


def profile_name(profile: str | dict | None) -> str:
    """A profile as a user names it: its name, or an inline mapping's name key."""
    return profile if isinstance(profile, str) else str((profile or {}).get("name", "inline"))


@dataclass(frozen=True)
class ProfileChoice:
    profile: str | dict
    reason: str  # why this profile, where the config gave none ("" where it gave one)


def machine_profile(topology: str | dict, devices: str | None = None) -> tuple[str, str | None]:
    """(what the machine is, in words; the profile of its devices or None). devices "cpu": the ranks run on
    this machine's CPUs (a real run), so a topology whose profile is not a CPU one gives way to CPU_RUN_PROFILE."""
    # networkx, numpy (the builders): config imports this module and stays light (config.py)
    from piper_sim.topology.load import topology_device_profile

    name, profile = topology_device_profile(topology)
    if devices != CPU or (profile is not None and profile_device_kind(profile) == CPU):
        return f"topology {name}", profile
    return "a real run on this machine's CPUs", CPU_RUN_PROFILE


def choose_profile(
    topology: str | dict,
    given: str | dict | None,
    *,
    allow_mismatch: bool = False,
    devices: str | None = None,
    key: str = "cost.profile",
    allow_key: str = "cost.allow_device_mismatch: true",
) -> ProfileChoice:
    """The profile that prices the run: given (checked against the machine's device) or the machine's own."""
    machine, own = machine_profile(topology, devices)
    if given is None:
        if own is None:
            return ProfileChoice(DEFAULT_PROFILE, f"the default: {machine} names no device_profile")
        return ProfileChoice(own, f"what {machine} computes on")
    if own is None or allow_mismatch or given == own:
        profile_device_kind(given)  # a bad profile fails here, naming the key
        return ProfileChoice(given, "")
    kind, want = profile_device_kind(given), profile_device_kind(own)
    if kind != want or not want:
        name = profile_name(given)
        raise ConfigError(
            key,
            name,
            f"a profile of {want or '?'} devices ({own} or another profile whose device_kind "
            f"is {want or '?'}): {machine} computes on {want or '?'}, {name} prices "
            f"{kind or 'no device_kind'}; or {allow_key} to price it with another device",
        )
    return ProfileChoice(given, "")
