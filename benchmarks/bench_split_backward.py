"""What the torch backend's split backward (ZB-H1) costs against one fused backward, per op.

    python benchmarks/bench_split_backward.py [--model validation/check-model.yaml] [--repeats 30]

For each op of one layer: the forward, then (a) one backward for inputs and weights together, as 1F1B
runs it, and (b) the executor's split: input gradients first (torch.autograd.grad, graph kept), then the
weight pass (torch.autograd.backward with inputs=the parameters). Prints median microseconds and the
ratio (b) / (a). The simulator prices each half of a split backward at half the fused backward; a ratio
well above 1 means the backend's weight pass walks the op's graph again. One thread.
"""

from __future__ import annotations

import argparse
import time

import torch

from piper_sim.calibrate.stage_ops import CHECK_OPS, prepare_stage
from piper_sim.torch_backend.op_autograd import forward_op


def _median_us(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2] * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="validation/check-model.yaml")
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(1)
    _, stage, before = prepare_stage(args.model)
    print(f"{'op':10s} {'fused us':>10s} {'input us':>10s} {'weight us':>10s} {'split / fused':>14s}")
    for op in CHECK_OPS:
        probe = forward_op(stage, op, dict(before[op]))
        keys = [k for k, v in probe.outputs.items() if v.requires_grad]
        if not keys:
            continue
        seeds = {k: torch.randn_like(probe.outputs[k]) for k in keys}
        params = [p for p in stage.parameters() if p.requires_grad]
        timed: dict[str, list[float]] = {"fused": [], "input": [], "weight": []}
        for _ in range(args.repeats):
            run = forward_op(stage, op, dict(before[op]))
            outs = [run.outputs[k] for k in keys]
            start = time.perf_counter()
            torch.autograd.backward(outs, [seeds[k] for k in keys])
            timed["fused"].append(time.perf_counter() - start)
            run = forward_op(stage, op, dict(before[op]))
            outs = [run.outputs[k] for k in keys]
            leaves = [v for v in run.inputs.values() if isinstance(v, torch.Tensor) and v.requires_grad]
            start = time.perf_counter()
            if leaves:
                torch.autograd.grad(outs, leaves, [seeds[k] for k in keys], retain_graph=True, allow_unused=True)
            mid = time.perf_counter()
            torch.autograd.backward(outs, [seeds[k] for k in keys], inputs=params)
            end = time.perf_counter()
            timed["input"].append(mid - start)
            timed["weight"].append(end - mid)
            stage.zero_grad(set_to_none=True)
        med = {k: sorted(v)[len(v) // 2] * 1e6 for k, v in timed.items()}
        ratio = (med["input"] + med["weight"]) / med["fused"]
        print(f"{op:10s} {med['fused']:10.1f} {med['input']:10.1f} {med['weight']:10.1f} {ratio:14.2f}")


if __name__ == "__main__":
    main()
