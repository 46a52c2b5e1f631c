"""The host model: what the machine around the devices adds to a simulated run.

Owns HostModel, the seam the engine asks (one method per decision) about lanes, compute, a collective's host-side
work and the wake-up of a rank blocked in a library call, its two implementations, and Asymmetry (lane members that
would diverge):
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

from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

import numpy as np
import simpy

from piper_sim.network import FlowNetwork
from piper_sim.topology.graph import Topology
from piper_sim.workload.profile import HostProfile

CORE_NS = 1e9  # compute work on shared cores is counted in core-nanoseconds


class Asymmetry(Exception):
    """Members of a lane would diverge: the run must use smaller lanes. axis: the group axis of the collective whose
    groups a member reached behind the simulated time (its groups ended apart), None for a transfer or the host."""

    def __init__(self, message: str, axis: str | None = None) -> None:
        super().__init__(message, axis)  # both in args: SimPy raises a failed event's exception anew from its args
        self.message, self.axis = message, axis

    def __str__(self) -> str:
        return self.message


class HostModel(Protocol):
    """What the engine asks the machine around the devices: one method per decision. The ones that may take
    simulated time return SimPy events for the lane's process to yield from (none where they take none); `clock`
    is each lane member's simulated time, moved on in place."""

    def attach_lanes(self, lane_sizes: list[int]) -> None:
        """The lanes the run simulates, once chosen: the ranks in each."""
        ...

    def lanes_may_differ(self) -> bool:
        """Whether a lane may hold members whose compute differs (each keeps a clock of its own); not where
        compute is timed per lane (its members move on together)."""
        ...

    def sync(self, clock: np.ndarray) -> Iterable[simpy.Event]:
        """Before the lane runs work on the host: its members' clocks brought together where the host times work
        per lane (at the later of them and now)."""
        ...

    def compute(self, lane_id: int, clock: np.ndarray, seconds: float | np.ndarray) -> Iterable[simpy.Event]:
        """A compute task of `seconds` of each member's work (one value, or one per member), from clock."""
        ...

    def host_work(self, lane_id: int, clock: np.ndarray, seconds: float) -> Iterable[simpy.Event]:
        """A collective's host-side work of `seconds` as it is issued: run on the rank's cores, or nothing here
        (flow_delay_s then delays its flows by it)."""
        ...

    def flow_delay_s(self, host_s: float) -> float:
        """What a collective's host-side work delays its flows by (0 where host_work ran it)."""
        ...

    def chains_collectives(self) -> bool:
        """Whether a collective right after another may join as its groups of the other end; not where its host
        work runs on the cores (the lane waits for the other collective first)."""
        ...

    def joins_as_transfers_land(self) -> bool:
        """Whether a collective after transfers may let each group join as its members' transfers land; not where
        compute is timed per lane or a woken rank waits for a core."""
        ...

    def woken(self, clock: np.ndarray) -> Iterable[simpy.Event]:
        """The lane woken from a wait on a transfer: its wait for a core, if any (clock moved to its end)."""
        ...

    def blocking_calls(self, count: Callable[[], int]) -> int:
        """The blocking library calls whose wake-ups a collective's end charges (wake_wait_s): count() where the
        host charges wake-ups, else 0 (count is not asked)."""
        ...

    def wake_wait_s(self, calls: int) -> float:
        """What a rank woken from `calls` blocking library calls waits before it runs again."""
        ...


class DedicatedDevice:
    """Each rank on a device of its own: no sharing, no wake-up cost; a collective's host work delays its flows."""

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env

    def attach_lanes(self, lane_sizes: list[int]) -> None:
        pass

    def lanes_may_differ(self) -> bool:
        return True

    def sync(self, clock: np.ndarray) -> Iterable[simpy.Event]:
        return ()

    def compute(self, lane_id: int, clock: np.ndarray, seconds: float | np.ndarray) -> Iterable[simpy.Event]:
        clock += seconds  # no event: each member's clock moves on by its own compute
        return ()

    def host_work(self, lane_id: int, clock: np.ndarray, seconds: float) -> Iterable[simpy.Event]:
        return ()

    def flow_delay_s(self, host_s: float) -> float:
        return host_s

    def chains_collectives(self) -> bool:
        return True

    def joins_as_transfers_land(self) -> bool:
        return True

    def woken(self, clock: np.ndarray) -> Iterable[simpy.Event]:
        return ()

    def blocking_calls(self, count: Callable[[], int]) -> int:
        return 0

    def wake_wait_s(self, calls: int) -> float:
        return 0.0


class SharedCores:
    """Ranks as processes on `cores` shared cores, with the host profile's measured terms (none measured:
    processor sharing alone). Compute is timed per lane, so a lane's members must agree (sync)."""

    def __init__(self, env: simpy.Environment, cores: int, profile: HostProfile | None) -> None:
        self.env, self.cores, self.profile = env, cores, profile or HostProfile()
        self.charges_wakeups = bool(self.profile.blocking_wait)  # none measured: none charged
        self.num_lanes = 0
        self.cpu: FlowNetwork | None = None  # the cores as a flow network, once the lanes are known
        self._computing = 0  # ranks computing now
        self._recent_load, self._load_at_s = 0.0, 0.0  # per core, averaged over the last slice; as of when

    def attach_lanes(self, lane_sizes: list[int]) -> None:
        """Link i = lane i's cores (one per member), last link = the machine; work in core-nanoseconds,
        capacities in core-nanoseconds per second (well above the network's byte-sized completion threshold)."""
        self.num_lanes = len(lane_sizes)
        capacity = np.array([float(n) for n in lane_sizes] + [float(self.cores)]) * CORE_NS
        slowdown = self._core_sharing_slowdown if self.profile.core_sharing else None  # none measured: none
        self.cpu = FlowNetwork(self.env, capacity, slowdown=slowdown, latency_only_s=0.0)  # cores, not links

    def lanes_may_differ(self) -> bool:
        return False

    def sync(self, clock: np.ndarray) -> Iterator[simpy.Event]:
        """The members' clocks must agree; the lane goes on at the later of them and now (a rank that waited on an
        event that had already happened goes on at once)."""
        t = float(clock.max())
        if float(clock.min()) < t - 1e-12 * max(t, 1e-9):
            raise Asymmetry("lane members' clocks differ on shared cores")
        if t > self.env.now:
            yield self.env.timeout(t - self.env.now)
        clock[:] = self.env.now

    def compute(self, lane_id: int, clock: np.ndarray, seconds: float | np.ndarray) -> Iterator[simpy.Event]:
        """A compute task of the longest member's `seconds` on one core each, at their fair share of the cores."""
        members = len(clock)
        self._count_computing(members)
        yield self._run(lane_id, members, float(np.max(seconds)))
        self._count_computing(-members)
        clock[:] = self.env.now

    def host_work(self, lane_id: int, clock: np.ndarray, seconds: float) -> Iterator[simpy.Event]:
        """The calls' host-side work on the rank's cores."""
        yield from self.sync(clock)
        yield self._run(lane_id, len(clock), seconds)
        clock[:] = self.env.now

    def flow_delay_s(self, host_s: float) -> float:
        return 0.0  # the host work already ran on the rank's share of the cores

    def chains_collectives(self) -> bool:
        return False

    def joins_as_transfers_land(self) -> bool:
        return False

    def woken(self, clock: np.ndarray) -> Iterator[simpy.Event]:
        if self.charges_wakeups:
            yield self.env.timeout(self.wake_wait_s(1))
            np.maximum(clock, self.env.now, out=clock)

    def blocking_calls(self, count: Callable[[], int]) -> int:
        return count() if self.charges_wakeups else 0

    def wake_wait_s(self, calls: int) -> float:
        """What a rank woken from `calls` blocking library calls waits for a core (profile.blocking_wait)."""
        return calls * self.profile.blocking_wait_s(self._load_now())

    def _run(self, lane_id: int, members: int, seconds: float) -> simpy.Event:
        """`seconds` of one rank's work on one core, run by each of the lane's `members` ranks at their fair share
        of the cores."""
        if seconds <= 0:
            return self.env.timeout(seconds)
        assert self.cpu is not None, "attach_lanes first"
        links = np.array([lane_id, self.num_lanes], dtype=np.int64)
        return self.cpu.start(
            np.zeros(2, dtype=np.int64), links, np.array([seconds * CORE_NS]), weight=np.array([float(members)])
        )

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


def host_model(env: simpy.Environment, topology: Topology, profile: HostProfile | None) -> HostModel:
    """SharedCores where the topology says its ranks share a machine's cores, else a dedicated device; the engine
    attaches the lanes once it has chosen them (lanes_may_differ)."""
    cores = topology.params.shared_cores
    return SharedCores(env, cores, profile) if cores else DedicatedDevice(env)
