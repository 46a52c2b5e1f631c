"""The Adam step of a pipeline stage timed hot (in a loop, as calibrate times it) and after a cache flush.

    python benchmarks/bench_adam_cold.py [--model tiny-moe] [--layers 2,4] [--repeats 60]

Builds a first stage of the model with the given numbers of layers (its parameters, with gradients, as the
executor's torch.optim.Adam holds them), and prints the median step time hot and cold (each call after
calibrate's flush_caches) and their ratio. In a training step the optimizer runs after the backward has
evicted its state, so the cold time is the one a run pays. One thread; the ratio inside one process is
steadier than absolute times on a shared machine. Used by validation/README.md ("Known gaps").
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch

from piper_sim.torch_backend.bench.timing import flush_caches
from piper_sim.torch_backend.stage_modules import StageModule
from piper_sim.workload.presets import load_model


def median_step_us(opt: torch.optim.Optimizer, repeats: int, cold: bool) -> float:
    times = []
    for _ in range(repeats):
        if cold:
            flush_caches()
        start = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-moe")
    parser.add_argument("--layers", default="2,4", help="comma-separated numbers of layers in the stage")
    parser.add_argument("--repeats", type=int, default=60)
    args = parser.parse_args()
    torch.set_num_threads(1)
    base = load_model(args.model)
    for count in (int(x) for x in args.layers.split(",")):
        spec = dataclasses.replace(base, num_layers=max(base.num_layers, count))
        params = list(StageModule(spec, list(range(count)), first=True, last=False, seed=0).parameters())
        for p in params:
            p.grad = torch.randn_like(p)
        opt = torch.optim.Adam(params, lr=1e-6)
        for _ in range(10):
            opt.step()
        hot = median_step_us(opt, args.repeats * 3, cold=False)
        cold = median_step_us(opt, args.repeats, cold=True)
        print(
            f"{count} layer(s): {len(params)} tensors, {sum(p.numel() for p in params)} params: "
            f"hot {hot:.0f} us, cold {cold:.0f} us, cold / hot {cold / hot:.2f}"
        )


if __name__ == "__main__":
    main()
