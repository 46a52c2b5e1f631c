"""CPU time of compute when more ranks than cores share a CPU host (time slicing costs cache state).

Owns the benchmark's driver. K x cores worker processes each run forward and backward of one layer of
a model preset (the executor's op path, one intra-op thread, as the ranks of an oversubscribed testbed
run) for a window of wall time and report their CPU time per iteration. Each time the kernel switches a
core to another process, the one switched in finds the caches and TLB full of the other's state and pays
to refill them, so the same work costs more CPU time the more processes take turns on a core. The factor
at K per core is the CPU time per iteration there over the time at one per core (all cores busy, no
sharing: how the compute benchmarks run). The simulator slows its shared cores by this factor at the
number of ranks computing at once (workload/profile.py: HostProfile.core_sharing_factor).

Workers are persistent processes (sharing_worker.py): they build the layer and warm up once, then
answer 'run SECONDS' lines on stdin with a JSON line on stdout; idle workers block on stdin. Levels are
interleaved round by round, in alternating order (1..K, then K..1), so a slow phase of the machine does
not land on one level; the profile takes each level's factor over level 1 in the same round and keeps
the median over rounds (calibrate/record_fits.py: core_sharing_summary).

Also owns the scheduler-slice measurement (how long a CPU-bound process runs before the kernel switches a
core to another: two spinning processes on one core), which the blocking-wait benchmark records.
Imports no torch itself (the workers do), so the processes it spawns start light and
calibrate/reference_speed.py's reference_speed can drive level 1 from a process without torch. Must not import
piper_sim.calibrate.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from multiprocessing.queues import Queue

from piper_sim.errors import PiperError

LEVELS_FULL = (1, 2, 3, 4)  # processes per core
LEVELS_QUICK = (1, 2)
MAX_CORES = 8  # on bigger hosts the workers are pinned to the first 8 cores
GAP_S = 50e-6  # a spinning loop that sees this much time pass between two iterations was switched out


def num_rounds(quick: bool) -> int:
    return 1 if quick else 6


def num_items(quick: bool) -> int:
    """Progress items of the benchmark."""
    return num_rounds(quick) * len(LEVELS_QUICK if quick else LEVELS_FULL)


def bench_core_sharing(preset: str, quick: bool, progress: Callable[[str], None]) -> list[dict]:
    """One record per level: ranks_per_core, cores, time_s the CPU seconds per iteration (mean over workers
    and rounds), window_means_s each round's mean (round by round, the same rounds for every level), and
    cores_used the CPU the workers used per wall second."""
    levels = LEVELS_QUICK if quick else LEVELS_FULL
    return run_levels(preset, levels, num_rounds(quick), 0.5 if quick else 1.0, progress)


def run_levels(
    preset: str,
    levels: tuple[int, ...],
    rounds: int,
    window_s: float,
    progress: Callable[[str], None],
    cold: bool = False,
) -> list[dict]:
    """With cold, every iteration starts after a cache flush (timing.flush_caches, untimed): the CPU time of
    the layer as the framework benchmark prices its ops (benchmarks/bench_core_sharing_cold.py)."""
    cores = min(os.cpu_count() or 1, MAX_CORES)
    workers = [_start_worker(preset, cores) for _ in range(max(levels) * cores)]
    try:
        for w in workers:
            _read_line(w, "ready")
        per_round: dict[int, list[float]] = {k: [] for k in levels}
        used: dict[int, list[float]] = {k: [] for k in levels}
        for r in range(rounds):
            for i, k in enumerate(levels if r % 2 == 0 else levels[::-1]):
                progress(f"core sharing round {r + 1}/{rounds}, {i + 1}/{len(levels)}: {k} process(es) per core")
                active = workers[: k * cores]
                for w in active:
                    w.stdin.write(f"run {window_s}{' cold' if cold else ''}\n")
                    w.stdin.flush()
                results = [json.loads(_read_line(w, "result")) for w in active]
                per_round[k].append(statistics.fmean(x["cpu_s"] / x["iterations"] for x in results))
                used[k].append(sum(x["cpu_s"] for x in results) / max(x["wall_s"] for x in results))
    finally:
        for w in workers:
            w.stdin.close()
        for w in workers:
            try:
                w.wait(timeout=10)
            except subprocess.TimeoutExpired:
                w.kill()
    return [
        {
            "bench": "core_sharing",
            "ranks_per_core": k,
            "cores": cores,
            "preset": preset,
            "time_s": statistics.fmean(per_round[k]),
            "window_means_s": per_round[k],
            "cores_used": round(statistics.fmean(used[k]), 3),
            "window_s": window_s,
        }
        for k in levels
    ]


def _start_worker(preset: str, cores: int) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "piper_sim.torch_backend.bench.sharing_worker",
            "--worker",
            preset,
            "--cores",
            str(cores),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )


def _read_line(worker: subprocess.Popen, what: str) -> str:
    line = worker.stdout.readline()
    if not line:
        raise PiperError(f"calibrate: a core-sharing worker exited before its {what} (exit code {worker.poll()})")
    return line


def pin_to_cores(cores: int) -> None:
    """Keep this process on the first `cores` cores (the benchmarks' view of a host with that many)."""
    if cores < (os.cpu_count() or 1) and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, range(cores))


def _spin(seconds: float, queue: Queue) -> None:
    os.sched_setaffinity(0, {0})
    runs: list[float] = []
    t0 = start = last = time.perf_counter()
    while last - t0 < seconds:
        now = time.perf_counter()
        if now - last > GAP_S:
            runs.append(last - start)
            start = now
        last = now
    queue.put(runs[1:])


def measure_slice_s(seconds: float = 1.0) -> float:
    """Median time a CPU-bound process runs on a core shared with another before being switched out."""
    if not hasattr(os, "sched_setaffinity"):
        raise PiperError("calibrate: measuring the scheduler slice needs os.sched_setaffinity (Linux)")
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_spin, args=(seconds, queue)) for _ in range(2)]
    for p in procs:
        p.start()
    runs = [r for _ in procs for r in queue.get(timeout=seconds + 60)]
    for p in procs:
        p.join()
    if not runs:
        raise PiperError("calibrate: the two spinning processes were never switched out; no scheduler slice measured")
    return statistics.median(runs)
