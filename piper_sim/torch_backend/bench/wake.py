"""What a blocking exchange costs on a CPU host whose cores are shared by more ranks than cores.

Owns the blocking-wait benchmark. A rank that blocks in a
collective sleeps; when the last partner's data arrives, the library's threads and then the rank are
woken one after another, and each wake-up waits for a core if the cores are busy with other ranks'
compute. The benchmark reproduces that: K x cores processes (pinned to the host's first cores, one
intra-op thread each) in pairs, each running forward + backward of one layer of a model preset and then
a flat all-to-all with its partner through the torch backend, as ranks of a training run do. Per level
it records the mean time from the last member's arrival to a member's return (after_last), the mean
number of processes computing per core while it ran, the wall and the CPU time (the process's main
thread) of one iteration of the compute (recorded, not charged: the CPU a rank that blocks between
computes uses per iteration, at each load), and the same exchange back to back with nothing
else running (hot: what the profile's per-call host cost already prices). The simulator charges the
extra over hot, per library call, at the load it sees (workload/profile.py: HostProfile.blocking_wait_s).

The benchmark also records the scheduler slice (sharing.measure_slice_s: how long a CPU-bound process
runs before the kernel switches a core to another); the simulator averages its load over that time.
Imports torch; must not import piper_sim.calibrate.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from piper_sim.errors import PiperError
from piper_sim.torch_backend.a2a_algorithms import all_to_all
from piper_sim.torch_backend.groups import DEFAULT_GROUPS
from piper_sim.torch_backend.local_launch import run_local
from piper_sim.workload.presets import load_model

from .sharing import LEVELS_FULL, LEVELS_QUICK, MAX_CORES, measure_slice_s, pin_to_cores
from .sharing_worker import layer_iteration
from .stage_ops import MICRO_BATCH_SIZE

WARMUP_ITERATIONS = 10
HOT_EXCHANGES = 200
SKIPPED_EXCHANGES = 2  # each level's first exchanges wait for the partner to start
CALLS_PER_EXCHANGE = 2  # flat: the split sizes, then the rows (torch_backend/a2a_algorithms.py)
COUNT_BYTES = 2 * 8  # the split sizes' message: one int64 per member of the pair


def num_items(quick: bool) -> int:
    """Progress items of the benchmark: the run, one per level summarized, the slice."""
    return len(LEVELS_QUICK if quick else LEVELS_FULL) + 2


def num_rounds(quick: bool) -> int:
    return 1 if quick else 2


def bench_blocking_wait(
    preset: str, quick: bool, progress: Callable[[str], None], timeout_s: float = 300.0
) -> list[dict]:
    """Records: one 'blocking_wait' per level (ranks_per_core, computing_per_core, time_s the mean time from
    the last arrival to return, hot_s, exchanges) and one 'scheduler_slice' (time_s). Runs on the calling
    rank alone."""
    cores = min(os.cpu_count() or 1, MAX_CORES)
    levels = LEVELS_QUICK if quick else LEVELS_FULL
    world = _even(max(levels) * cores)
    rounds, window_s = num_rounds(quick), (0.5 if quick else 2.0)
    progress(
        f"blocking wait: {world} processes on {cores} core(s), {rounds} x {len(levels)} windows of "
        f"{window_s} s (about {20 + rounds * len(levels) * window_s:.0f} s)"
    )
    with tempfile.TemporaryDirectory(prefix="piper-wake-") as tmp:
        try:
            run_local(_member, world, preset, cores, levels, rounds, window_s, tmp, timeout_s=timeout_s)
        except TimeoutError:
            raise PiperError(f"calibrate: the blocking-wait benchmark did not finish in {timeout_s:.0f} s") from None
        logs = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(world)]
    hot_samples = _after_last(logs, 0, "hot")
    hot, hot_median = statistics.fmean(hot_samples), statistics.median(hot_samples)
    records = []
    row_bytes = logs[0]["row_bytes"]
    for k in levels:
        records.append(
            dict(
                _level_record(logs, k, cores, preset),
                hot_s=hot,
                hot_median_s=hot_median,
                count_bytes=COUNT_BYTES,
                row_bytes=row_bytes,
            )
        )
        progress(
            f"blocking wait: {k} process(es) per core: {records[-1]['time_s'] * 1e3:.2f} ms after the "
            f"last arrival (hot {hot * 1e3:.2f} ms)"
        )
    progress("blocking wait: scheduler slice")
    records.append({"bench": "scheduler_slice", "time_s": measure_slice_s()})
    return records


def _even(n: int) -> int:
    return n + n % 2


def _member(
    rank: int, world: int, preset: str, cores: int, levels: tuple[int, ...], rounds: int, window_s: float, out_dir: str
) -> None:
    """One process of the benchmark (spawned by run_local): pairs (0, 1), (2, 3), ..."""
    pin_to_cores(cores)
    iteration = layer_iteration(preset)
    spec = load_model(preset)
    pair = (rank - rank % 2, rank - rank % 2 + 1)
    node_of = dict.fromkeys(pair, 0)
    rows = torch.randn(MICRO_BATCH_SIZE * spec.seq_len * spec.top_k, spec.d_model + 1)
    half = rows.shape[0] // 2
    splits = [half, rows.shape[0] - half]
    DEFAULT_GROUPS.get(pair)

    def exchange() -> tuple[float, float]:
        arrive = time.perf_counter()
        all_to_all(rows, splits, pair, node_of)
        return arrive, time.perf_counter()

    solo = []
    for _ in range(WARMUP_ITERATIONS):
        t0 = time.perf_counter()
        iteration()
        solo.append(time.perf_counter() - t0)
        exchange()
    agreed = torch.tensor([statistics.median(solo)], dtype=torch.float64)
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX)  # every pair must run the same count of exchanges
    per_iteration_s = float(agreed)
    log: dict = {"hot": [], "levels": {}, "row_bytes": rows.numel() * rows.element_size()}
    if rank < 2:  # the same exchange back to back, nothing else running
        log["hot"] = [exchange() for _ in range(HOT_EXCHANGES)]
    for _ in range(rounds):
        for k in levels:
            active = _even(k * cores)
            # the window over the expected time per iteration (the same on every rank)
            count = max(4, int(window_s / (per_iteration_s * max(1.0, active / cores))))
            dist.barrier()
            if rank < active:
                entries = []
                for _ in range(count):
                    c0, cpu0 = time.perf_counter(), time.thread_time()
                    iteration()
                    c1, cpu1 = time.perf_counter(), time.thread_time()
                    entries.append((c0, c1, cpu1 - cpu0, *exchange()))
                log["levels"].setdefault(str(k), []).append(entries)
    dist.barrier()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(log))


def _after_last(logs: list[dict], pair_first: int, key: str, level: str | None = None, window: int = 0) -> list[float]:
    """Seconds from the later member's arrival to each member's return, for one pair's exchanges."""
    a, b = logs[pair_first], logs[pair_first + 1]
    ea, eb = (a[key], b[key]) if level is None else (a[key][level][window], b[key][level][window])
    out = []
    for x, y in list(zip(ea, eb, strict=True))[SKIPPED_EXCHANGES:]:
        last = max(x[-2], y[-2])
        out += [x[-1] - last, y[-1] - last]
    return out


def _level_record(logs: list[dict], k: int, cores: int, preset: str) -> dict:
    active = _even(k * cores)
    level = str(k)
    after, window_means, computing, wall, cpu = [], [], [], [], []
    for w in range(len(logs[0]["levels"][level])):
        window = [v for p in range(0, active, 2) for v in _after_last(logs, p, "levels", level, w)]
        window_means.append(statistics.fmean(window))
        after += window
        entries = [logs[r]["levels"][level][w] for r in range(active)]
        start = min(e[0][0] for e in entries)
        end = max(e[-1][-1] for e in entries)
        busy = sum(c1 - c0 for e in entries for c0, c1, *_ in e)
        wall += [c1 - c0 for e in entries for c0, c1, *_ in e[SKIPPED_EXCHANGES:]]
        cpu += [c for e in entries for _c0, _c1, c, *_ in e[SKIPPED_EXCHANGES:]]
        computing.append(busy / (end - start) / cores)
    return {
        "bench": "blocking_wait",
        "preset": preset,
        "ranks_per_core": k,
        "cores": cores,
        "processes": active,
        "computing_per_core": statistics.fmean(computing),
        "time_s": statistics.fmean(after),
        "median_s": statistics.median(after),
        "window_means_s": window_means,
        "exchanges": len(after) // 2,
        "iteration_s": statistics.fmean(wall),
        "iteration_cpu_s": statistics.fmean(cpu),
        "calls_per_exchange": CALLS_PER_EXCHANGE,
    }
