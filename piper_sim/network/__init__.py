"""The flow network: flows between GPUs share link capacity max-min fairly, and collectives run on it.

What the engine (piper_sim.sim), the collective studies, the estimator and the SimGrid cross-check use is
exported here; the modules behind it:

- flows: FlowNetwork, the active flow sets on a SimPy clock and their completion events, with reservations;
- flow_set: a flow set (FlowSet) and its bytes left moved to a given time, a reservation (Reservation);
- fairshare: the max-min solves (progressive filling), the joined incidences kept for them, and a flow set's
  timeline alone on its links;
- kernels: the solves' compiled inner loops (numba);
- batch: flow sets that start at one instant, grouped by shared links and entered as one;
- mirror: timelines found again for the same flows relabelled or mirrored;
- phase_run: a collective's phases on the network (each phase's delay, and its start);
- recording: recorded runs of collectives alone on their links, that reservations stand in for;
- collective_runner: CollectiveRunner (routes, phases, reservations) and RouteCache;
- aggregate: exact reductions of a flow set (merging identical flows, lumping symmetric ones).

Imports numpy, numba, simpy (a flow network runs on an environment's clock), the topology and the collectives'
phases; never piper_sim.sim nor torch (tests/test_architecture.py).
"""

from piper_sim.network.aggregate import Lumped, dense_rows, lump, merge_identical
from piper_sim.network.batch import overlapping
from piper_sim.network.collective_runner import CollectiveRunner, RouteCache
from piper_sim.network.fairshare import EPS_BYTES, LATENCY_ONLY_S, Timeline, isolated_timeline, max_min_rates
from piper_sim.network.flows import FlowNetwork
from piper_sim.network.mirror import TimelineMemo
from piper_sim.network.phase_run import PhaseFlows, PhaseProcess, phase_delay_s, run_phase, start_phases
from piper_sim.network.recording import PhaseRecord, Recorder

__all__ = [
    "EPS_BYTES",
    "LATENCY_ONLY_S",
    "CollectiveRunner",
    "FlowNetwork",
    "Lumped",
    "PhaseFlows",
    "PhaseProcess",
    "PhaseRecord",
    "Recorder",
    "RouteCache",
    "Timeline",
    "TimelineMemo",
    "dense_rows",
    "isolated_timeline",
    "lump",
    "max_min_rates",
    "merge_identical",
    "overlapping",
    "phase_delay_s",
    "run_phase",
    "start_phases",
]
