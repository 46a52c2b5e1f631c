"""Timing of all-to-all algorithms on real ranks (local or testbed), for benchmarks and validation.

`time_all_to_all(rank, world, node_of, sizes_bytes, algorithms, repeats, out_path)` runs, for each
bytes-per-pair size and algorithm, a uniform all-to-all of float32 rows of width 256 and writes the
median wall time per (algorithm, size) measured on rank 0 between two barriers.
Only piper_sim.torch_backend may import torch.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

from .a2a_algorithms import all_to_all, prepare_groups

ROW_WIDTH = 256  # float32 values per row: 1 KiB rows


def time_all_to_all(
    rank: int,
    world: int,
    node_of: dict[int, int],
    sizes_bytes: list[int],
    algorithms: list[str],
    repeats: int,
    out_path: str,
) -> None:
    group = list(range(world))
    prepare_groups(group, node_of)
    results = []
    for size in sizes_bytes:
        rows_per_pair = max(1, size // (ROW_WIDTH * 4))
        data = torch.randn(rows_per_pair * world, ROW_WIDTH)
        splits = [rows_per_pair] * world
        for algorithm in algorithms:
            all_to_all(data, splits, group, node_of, algorithm)  # warm-up
            times = []
            for _ in range(repeats):
                dist.barrier()
                t0 = time.perf_counter()
                all_to_all(data, splits, group, node_of, algorithm)
                dist.barrier()
                times.append(time.perf_counter() - t0)
            results.append(
                {
                    "algorithm": algorithm,
                    "bytes_per_pair": rows_per_pair * ROW_WIDTH * 4,
                    "median_s": statistics.median(times),
                    "times_s": times,
                }
            )
    if rank == 0:
        Path(out_path).write_text(json.dumps(results, indent=1))
