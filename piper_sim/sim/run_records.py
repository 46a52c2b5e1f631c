"""The records of a simulated run, as the engine fills them.

Owns SimRecords: per stage arrays [step, rank within stage, task index] of each task's start and end, FLOPs, bytes
and host work, each rank's peak memory, the bytes per link and the network's counts (flows, solves, lanes,
reservations, mirror images). The simulator (piper_sim/simulator.py) turns them into a RunTrace.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(kw_only=True)
class SimRecords:
    """Per stage arrays indexed [step, rank within stage, task index]."""

    start_s: list[np.ndarray]
    end_s: list[np.ndarray]
    flops: list[np.ndarray]
    bytes: list[np.ndarray]
    cpu_s: list[np.ndarray]  # the work priced for a blocking task on one unshared core (NaN: send/recv)
    peak_memory_bytes: np.ndarray  # per rank
    first_step_peak_memory_bytes: np.ndarray  # per rank, over step 0 only (what a run that counts it on step 0 sees)
    link_bytes: np.ndarray
    num_flows: int
    num_solves: int
    num_lanes: int
    num_reserved: int = 0  # collectives run as reservations (piper_sim.network.collective_runner)
    num_broken: int = 0  # of those, turned into their flow sets when other flows came onto their links
    num_mirrored: int = 0  # phase timelines taken from a mirror image solved before (piper_sim.network.mirror)
