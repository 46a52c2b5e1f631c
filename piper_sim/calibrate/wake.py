"""Wake-up latency of a blocked rank while other processes keep the host's cores busy (CPU hosts).

Owns the benchmark: ranks 0 and 1 ping-pong a 16-byte message over the process group while K
competitor processes spin on the same cores, for K from 0 to three per core. Every message wakes a
blocked receiver, which then waits for a core. The profile records the mean and median one-way time at
each K (`measurements.wake_latency`), a fact about the host's scheduler. The simulator does not use
it: spinning competitors never block, a rank's competitors block every millisecond, and charged at the
processor-sharing load it moved predictions the wrong way (validation/README.md, "Known gaps").
Imports torch.
"""


from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

ROUNDS = 3
SECONDS_PER_WINDOW = 1.0
SPIN = "while True: pass"


def competitor_levels(cores: int) -> list[int]:
    """0, 1, 2, ... competitors up to one per core, then every half core up to three per core."""
    levels = list(range(cores + 1))
    step = max(1, cores // 2)
    while levels[-1] + step <= 3 * cores:
        levels.append(levels[-1] + step)
    return levels


def _ping_pong(rank: int, seconds: float) -> list[float]:
    """Round-trip seconds between ranks 0 and 1 for `seconds` (rank 0 decides when to stop)."""
    buf = torch.zeros(4)
    times: list[float] = []
    stop_at = time.monotonic() + seconds
    while True:
        t0 = time.perf_counter()
        if rank == 0:
            buf[0] = 1.0 if time.monotonic() > stop_at else 0.0
            dist.send(buf, 1)
            dist.recv(buf, 1)
        else:
            dist.recv(buf, 0)
            dist.send(buf, 0)
        times.append(time.perf_counter() - t0)
        if buf[0].item() == 1.0:
            return times


def bench_wake_latency(rank: int, world: int, progress: Callable[[str], None]) -> list[dict]:
    """Records (rank 0 only) of the one-way message time at each number of spinning competitors, over
    ROUNDS windows per level interleaved round by round (a slow phase of the machine does not land on one
    level): time_s the mean of all messages, median_s their median, window_means_s each window's mean."""
    if world < 2:
        return []
    cores = os.cpu_count() or 1
    levels = competitor_levels(cores)
    window_means: dict[int, list[float]] = {k: [] for k in levels}
    samples: dict[int, list[float]] = {k: [] for k in levels}
    for r in range(ROUNDS):
        for i, competitors in enumerate(levels):
            progress(f"wake-up latency round {r + 1}/{ROUNDS}, {i + 1}/{len(levels)}: {competitors} spinning "
                     "process(es)")
            spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(competitors if rank == 0 else 0)]
            try:
                time.sleep(0.2 if spinners else 0.0)
                dist.barrier()
                times = _ping_pong(rank, SECONDS_PER_WINDOW) if rank < 2 else []
                dist.barrier()
            finally:
                for p in spinners:
                    p.kill()
                    p.wait()
            one_way = [t / 2 for t in times[10:]]  # the first round trips warm the connection up
            if rank == 0:
                window_means[competitors].append(statistics.fmean(one_way))
                samples[competitors] += one_way
    if rank != 0:
        return []
    return [{"bench": "wake_latency", "competitors": k, "cores": cores, "time_s": statistics.fmean(samples[k]),
             "median_s": statistics.median(samples[k]), "window_means_s": window_means[k],
             "messages": len(samples[k])} for k in levels]
