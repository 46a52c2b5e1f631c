"""The core-sharing benchmark's worker process (sharing.py starts K x cores of them): one layer of a model
preset, forward and backward through the executor's op path on one intra-op thread, timed in windows of
CPU time on request.

Run as `python -m piper_sim.torch_backend.bench.sharing_worker --worker PRESET --cores N`: builds the layer
and warms up, prints 'ready', then answers each 'run SECONDS [cold]' line on stdin with one JSON line
{cpu_s, wall_s, iterations} on stdout. Imports torch; must not import piper_sim.calibrate.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable

import torch

from piper_sim.torch_backend.op_autograd import backward_op, forward_op

from .sharing import pin_to_cores
from .stage_ops import prepare_stage
from .timing import flush_caches

WARMUP_ITERATIONS = 20


def layer_iteration(preset: str) -> Callable[[], None]:
    """Forward and backward of one layer of the preset through the executor's op path."""
    _, stage, before = prepare_stage(preset)
    ops = list(stage.forward_ops())

    def iteration() -> None:
        records = [forward_op(stage, op, dict(before[op])) for op in ops]
        for record in reversed(records):
            backward_op(record, {k: torch.ones_like(v) for k, v in record.outputs.items()})
        stage.zero_grad(set_to_none=True)

    return iteration


def _worker(preset: str, cores: int) -> None:
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
