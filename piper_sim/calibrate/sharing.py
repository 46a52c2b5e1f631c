"""CPU time of compute when more ranks than cores share a CPU host (time slicing costs cache state).

Owns the benchmark and its worker processes. K x cores worker processes each run forward and backward
of one layer of a model preset (the executor's op path, one intra-op thread, as the ranks of an
oversubscribed testbed run) for a window of wall time and report their CPU time per iteration. Each
time the kernel switches a core to another process, the one switched in finds the caches and TLB full
of the other's state and pays to refill them, so the same work costs more CPU time the more processes
take turns on a core. The factor at K per core is the CPU time per iteration there over the time at one
per core (all cores busy, no sharing: how the compute benchmarks run). The simulator slows its shared
cores by this factor at the number of ranks computing at once (workload/cost.py: core_sharing_factor).

Workers are persistent (`python -m piper_sim.calibrate.sharing --worker PRESET`): they build the layer
and warm up once, then answer 'run SECONDS' lines on stdin with a JSON line on stdout; idle workers
block on stdin. Levels are interleaved round by round, in alternating order (1..K, then K..1), so a slow
phase of the machine does not land on one level; the profile takes each level's factor over level 1 in
the same round and keeps the median over rounds (profile.core_sharing_summary). Imports torch (the workers).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

from piper_sim.errors import PiperError

LEVELS_FULL = (1, 2, 3, 4)  # processes per core
LEVELS_QUICK = (1, 2)
MAX_CORES = 8  # on bigger hosts the workers are pinned to the first 8 cores
WARMUP_ITERATIONS = 20


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


REFERENCE_ROUNDS = 3
REFERENCE_WINDOW_S = 1.0


def reference_speed(preset: str, progress: Callable[[str], None] = lambda _msg: None) -> dict:
    """The machine's speed now, as calibrate saw it: the core-sharing benchmark's level 1 (one process per
    core, forward + backward of one layer of the preset) for three 1-second windows. Returns
    {preset, cores, cpu_us_per_iteration (median of the windows), window_means_us}. Used by validate
    --remeasure before each round, so a measurement taken on a slower or faster machine than its profile
    shows (about 6 s)."""
    (record,) = run_levels(preset, (1,), REFERENCE_ROUNDS, REFERENCE_WINDOW_S, progress)
    means = [t * 1e6 for t in record["window_means_s"]]
    return {"preset": preset, "cores": record["cores"], "cpu_us_per_iteration": round(statistics.median(means), 1),
            "window_means_us": [round(t, 1) for t in means]}


def run_levels(preset: str, levels: tuple[int, ...], rounds: int, window_s: float,
               progress: Callable[[str], None], cold: bool = False) -> list[dict]:
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
                active = workers[:k * cores]
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
    return [{"bench": "core_sharing", "ranks_per_core": k, "cores": cores, "preset": preset,
             "time_s": statistics.fmean(per_round[k]), "window_means_s": per_round[k],
             "cores_used": round(statistics.fmean(used[k]), 3), "window_s": window_s} for k in levels]


def _start_worker(preset: str, cores: int) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, "-m", "piper_sim.calibrate.sharing", "--worker", preset,
                             "--cores", str(cores)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)


def _read_line(worker: subprocess.Popen, what: str) -> str:
    line = worker.stdout.readline()
    if not line:
        raise PiperError(f"calibrate: a core-sharing worker exited before its {what} (exit code {worker.poll()})")
    return line


def layer_iteration(preset: str) -> Callable[[], None]:
    """Forward and backward of one layer of the preset through the executor's op path (imports torch)."""
    import torch

    from piper_sim.calibrate.stage_ops import prepare_stage
    from piper_sim.torch_backend.op_autograd import backward_op, forward_op

    _, stage, before = prepare_stage(preset)
    ops = list(stage.forward_ops())

    def iteration() -> None:
        records = [forward_op(stage, op, dict(before[op])) for op in ops]
        for record in reversed(records):
            backward_op(record, {k: torch.ones_like(v) for k, v in record.outputs.items()})
        stage.zero_grad(set_to_none=True)

    return iteration


def pin_to_cores(cores: int) -> None:
    """Keep this process on the first `cores` cores (the benchmarks' view of a host with that many)."""
    if cores < (os.cpu_count() or 1) and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, range(cores))


def _worker(preset: str, cores: int) -> None:
    import torch

    from piper_sim.calibrate.timing import flush_caches

    torch.set_num_threads(1)
    pin_to_cores(cores)
    iteration = layer_iteration(preset)

    for _ in range(WARMUP_ITERATIONS):
        iteration()
    print("ready", flush=True)
    for line in sys.stdin:
        words = line.split()
        window_s, cold = float(words[1]), words[2:] == ["cold"]
        count, cpu_s, wall0 = 0, 0.0, time.perf_counter()
        while time.perf_counter() - wall0 < window_s:
            if cold:
                flush_caches()
            cpu0 = time.thread_time()
            iteration()
            cpu_s += time.thread_time() - cpu0
            count += 1
        print(json.dumps({"cpu_s": cpu_s, "wall_s": time.perf_counter() - wall0, "iterations": count}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description="core-sharing worker (started by piper-sim calibrate)")
    parser.add_argument("--worker", required=True, metavar="PRESET")
    parser.add_argument("--cores", type=int, required=True)
    args = parser.parse_args()
    _worker(args.worker, args.cores)


if __name__ == "__main__":
    main()
