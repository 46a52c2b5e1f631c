"""A collective's phases on the flow network: what a phase pays before its flows enter, and its start.

Owns the timing of a phase, the one implementation the engine (piper_sim.network.collective_runner.CollectiveRunner)
and the collective studies (piper_sim.studies.reduced_collective, on a reduced network) both run: start_phases starts
each phase once the phases in its `after` have ended; run_phase then pays phase_delay_s (the per-message
overhead once for each message its busiest source posts, plus the largest path latency among its flows,
times the sequential messages per flow) and lets its flows enter the network together. Must not import
torch.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np
import simpy

from piper_sim.collectives.algorithms import Phase
from piper_sim.network.flows import FlowNetwork

# A phase's SimPy process body; its value: each flow's finish time (None: a phase run that reports none)
PhaseProcess = Generator[simpy.Event, Any, np.ndarray | None]


def phase_delay_s(phase: Phase, overhead_s: float, latency_s: float) -> float:
    """What a phase pays before its flows enter the network: each source posts its messages one after
    another, so the busiest source's count of messages pays the per-message overhead (message count
    matters, not only bytes; an upper bound, since the posting is not overlapped with the transfers
    already under way), and each of the phase's sequential messages pays the largest path latency.
    A phase's own `overhead_s` replaces the topology's; its `delay_s` is added."""
    per_source = int(np.bincount(phase.src).max()) if phase.src.size else 0
    overhead = overhead_s if phase.overhead_s is None else phase.overhead_s
    return phase.delay_s + phase.messages * (overhead * per_source + latency_s)


@dataclass(frozen=True, slots=True)
class PhaseFlows:
    """A phase's flows as the network takes them (FlowNetwork.start)."""

    entry_flow: np.ndarray
    entry_link: np.ndarray
    sizes: np.ndarray
    weight: np.ndarray | None = None  # flows each one stands for (a reduced network, mean-field detours); None: 1
    key: Hashable | None = None  # names the route structure, for the network's memo

    @property
    def weights(self) -> np.ndarray:
        return np.ones(self.sizes.shape[0]) if self.weight is None else self.weight


def run_phase(
    env: simpy.Environment, network: FlowNetwork, waits: list[simpy.Event], delay_s: float, flows: PhaseFlows | None
) -> Generator[simpy.Event, Any, np.ndarray]:
    """One phase (a SimPy process body): wait for the phases before it, pay delay_s, start its flows
    together. Its value: each flow's finish time (seconds, absolute); an empty array for an empty phase
    (flows None), which pays nothing."""
    if waits:
        yield env.all_of(waits)
    if flows is None:
        return np.zeros(0)
    if delay_s > 0:
        yield env.timeout(delay_s)
    return (yield network.start(flows.entry_flow, flows.entry_link, flows.sizes, weight=flows.weight, key=flows.key))


def start_phases(
    env: simpy.Environment, phases: list[Phase], process: Callable[[int, Phase, list[simpy.Event]], PhaseProcess]
) -> list[simpy.Event]:
    """Start one process per phase, in order; process(index, phase, waits) gets the done events of the
    phases in the phase's `after`. Returns each phase's done event."""
    done: list[simpy.Event] = []
    for index, phase in enumerate(phases):
        done.append(env.process(process(index, phase, [done[a] for a in phase.after])))
    return done
