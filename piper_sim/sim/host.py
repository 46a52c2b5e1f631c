"""The host model: what the machine around the devices adds to a simulated run.

Owns HostModel, the seam the engine calls for compute, a collective's host-side work and the wake-up
of a rank blocked in a library call, and its two implementations:
- DedicatedDevice (the default): every rank has a device of its own; compute takes the time the cost
  model prices, a collective's host work delays its flows, and nothing waits for a core.
- SharedCores: the ranks are processes taking turns on a machine's cores (the emulated CPU testbed:
  topology params.shared_cores > 0). Compute is processor-shared over the cores (a flow network whose
  links are each lane's cores and the machine), slowed by the profile's measured core_sharing factor;
  a collective's host work runs on the rank's share of the cores; a rank woken from a blocking call
  waits for a core by the profile's blocking_wait at the load averaged over the scheduler slice.
Must not import torch.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import simpy

from piper_sim.network import FlowNetwork
from piper_sim.topology.graph import Topology
from piper_sim.workload.profile import HostProfile

CORE_NS = 1e9  # compute work on shared cores is counted in core-nanoseconds


class HostModel(Protocol):
    # True: a collective's host work runs as compute on the rank's cores; False: it delays the flows
    runs_host_work: bool
    # True: a rank woken from a blocking library call pays a wait (wake_wait_s), so calls are counted
    charges_wakeups: bool

    def compute(self, lane_id: int, members: int, seconds: float) -> simpy.Event:
        """A compute task of `seconds` of one rank's work, run by each of the lane's `members` ranks."""
        ...

    def begin_compute(self, ranks: int) -> None: ...

    def end_compute(self, ranks: int) -> None: ...

    def wake_wait_s(self, calls: int) -> float:
        """What a rank woken from `calls` blocking library calls waits before it runs again."""
        ...


class DedicatedDevice:
    """Each rank on a device of its own: no sharing, no wake-up cost."""

    runs_host_work = False
    charges_wakeups = False

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env

    def compute(self, lane_id: int, members: int, seconds: float) -> simpy.Event:
        return self.env.timeout(seconds)

    def begin_compute(self, ranks: int) -> None:
        pass

    def end_compute(self, ranks: int) -> None:
        pass

    def wake_wait_s(self, calls: int) -> float:
        return 0.0


class SharedCores:
    """Ranks as processes on `cores` shared cores, with the host profile's measured terms (none measured:
    processor sharing alone)."""

    runs_host_work = True

    def __init__(self, env: simpy.Environment, cores: int, lane_sizes: list[int], profile: HostProfile | None
                 ) -> None:
        self.env, self.cores, self.profile = env, cores, profile or HostProfile()
        self.num_lanes = len(lane_sizes)
        # link i = lane i's cores (one per member), last link = the machine; work in core-nanoseconds,
        # capacities in core-nanoseconds per second (well above the network's byte-sized completion threshold)
        capacity = np.array([float(n) for n in lane_sizes] + [float(cores)]) * CORE_NS
        slowdown = self._core_sharing_slowdown if self.profile.core_sharing else None  # none measured: none
        self.cpu = FlowNetwork(env, capacity, slowdown=slowdown, latency_only_s=0.0)  # cores, not links
        self.charges_wakeups = bool(self.profile.blocking_wait)  # none measured: none charged
        self._computing = 0  # ranks computing now
        self._recent_load, self._load_at_s = 0.0, 0.0  # per core, averaged over the last slice; as of when

    def compute(self, lane_id: int, members: int, seconds: float) -> simpy.Event:
        """A compute task of `seconds` on one core, run at its fair share of the cores."""
        if seconds <= 0:
            return self.env.timeout(seconds)
        links = np.array([lane_id, self.num_lanes], dtype=np.int64)
        return self.cpu.start(np.zeros(2, dtype=np.int64), links, np.array([seconds * CORE_NS]),
                              weight=np.array([float(members)]))

    def begin_compute(self, ranks: int) -> None:
        self._count_computing(ranks)

    def end_compute(self, ranks: int) -> None:
        self._count_computing(-ranks)

    def wake_wait_s(self, calls: int) -> float:
        """What a rank woken from `calls` blocking library calls waits for a core (profile.blocking_wait)."""
        return calls * self.profile.blocking_wait_s(self._load_now())

    def _count_computing(self, ranks: int) -> None:
        if self.charges_wakeups:
            self._load_now()
            self._computing += ranks

    def _load_now(self) -> float:
        """Ranks computing per core, averaged over the last scheduler slice (exponentially). The kernel's
        time slicing keeps ranks out of the lockstep that processor sharing puts them in, so a woken rank
        meets the machine's recent load, not the instant's."""
        keep = np.exp(-(self.env.now - self._load_at_s) / self.profile.scheduler_slice_s)
        self._recent_load = self._recent_load * keep + self._computing / self.cores * (1.0 - keep)
        self._load_at_s = self.env.now
        return self._recent_load

    def _core_sharing_slowdown(self, load: np.ndarray) -> np.ndarray:
        """Ranks taking turns on the cores pay for each other's cache state: the machine's cores deliver
        1 / factor of their time as work at load / cores ranks per core (the profile's core_sharing)."""
        divisor = np.ones(load.shape[0])
        divisor[-1] = self.profile.core_sharing_factor(load[-1] / self.cores)
        return divisor


def host_model(env: simpy.Environment, topology: Topology, profile: HostProfile | None,
               lane_sizes: list[int]) -> HostModel:
    """SharedCores where the topology says its ranks share a machine's cores, else a dedicated device."""
    cores = topology.params.shared_cores
    return SharedCores(env, cores, lane_sizes, profile) if cores else DedicatedDevice(env)
