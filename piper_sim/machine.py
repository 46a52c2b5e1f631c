"""The machine a run is priced on, built once: the topology, where the ranks sit on it, and the device and host
profiles of its GPUs.

Owns Machine and its building from a Config's references (build_machine: cfg.topology, cfg.placement,
cfg.cost_profile) or from a topology already built (place_machine: the planner builds its topology before the
profile, to name the flag a bad one came from). Every consumer (simulate, measure, the planner and estimator,
validation, studies, reproduce) takes the Machine rather than reading the references again. The software stack
comes with these pieces: the communication libraries' measured parameters with the topology
(Topology.collectives), the framework's measured costs with the device profile; which algorithms a run uses is
the config's (Config.collectives). Checks of what a simulated run needs of the machine are simulator.py's.
No simpy, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from piper_sim.config import Config
from piper_sim.topology.graph import Topology
from piper_sim.topology.load import load_topology
from piper_sim.topology.placement import place
from piper_sim.workload.profile import DeviceProfile, HostProfile
from piper_sim.workload.profile_load import load_profiles


@dataclass(frozen=True, eq=False)
class Machine:
    """A built machine: its topology, the GPU of each rank, and the profiles that price its devices."""

    topology: Topology
    placement: tuple[str, ...]  # the GPU of each rank
    profile: DeviceProfile
    host_profile: HostProfile | None  # shared-core terms where calibrate measured them (CPU profiles), else None


def place_machine(topology: Topology, num_gpus: int, placement: str | list | dict, profile: str | dict) -> Machine:
    """The machine of a built topology: num_gpus ranks placed by `placement` (topology.placement), priced by
    `profile` (a profile name, YAML path or mapping; workload.profile_load)."""
    gpus = tuple(place(topology, num_gpus, placement))
    device, host = load_profiles(profile)
    return Machine(topology=topology, placement=gpus, profile=device, host_profile=host)


def build_machine(cfg: Config) -> Machine:
    """The config's machine: its topology sized for the job, its ranks placed, its cost profile loaded."""
    num_gpus = cfg.parallel.num_gpus
    return place_machine(load_topology(cfg.topology, num_gpus), num_gpus, cfg.placement, cfg.cost_profile)
