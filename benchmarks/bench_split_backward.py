"""What the torch backend's split backward (ZB-H1) costs against one fused backward, per op.

    python benchmarks/bench_split_backward.py [--model validation/check-model.yaml] [--repeats 30]

For each op of one layer: the forward, then (a) one backward for inputs and weights together, as 1F1B
runs it; (b) a split that walks the graph twice: input gradients (torch.autograd.grad, graph kept), then
the weights (torch.autograd.backward with inputs=the parameters); (c) the executor's split: one backward
with each linear's weight gradient deferred (layers.DeferredWeightGrads), then the deferred GEMMs.
Prints median microseconds and each split's total over (a). The simulator prices the two halves of a
split backward at half the fused backward each, so (c) should be near 1. One thread.
"""

from __future__ import annotations

import argparse
import time

import torch

from piper_sim.torch_backend.bench.stage_ops import CHECK_OPS, prepare_stage
from piper_sim.torch_backend.layers import DeferredWeightGrads
from piper_sim.torch_backend.op_autograd import forward_op


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="validation/check-model.yaml")
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(1)
    _, stage, before = prepare_stage(args.model)
    print(
        f"{'op':10s} {'fused us':>9s} {'twice: B':>9s} {'W':>8s} {'/ fused':>8s} {'deferred: B':>12s} {'W':>8s} "
        f"{'/ fused':>8s}"
    )
    for op in CHECK_OPS:
        probe = forward_op(stage, op, dict(before[op]))
        keys = [k for k, v in probe.outputs.items() if v.requires_grad]
        if not keys:
            continue
        seeds = [torch.randn_like(probe.outputs[k]) for k in keys]
        params = [p for p in stage.parameters() if p.requires_grad]
        timed: dict[str, list[float]] = {
            name: [] for name in ("fused", "twice_b", "twice_w", "deferred_b", "deferred_w")
        }

        def outputs(deferrable: bool, op: str = op, keys: list = keys) -> tuple[list, list]:
            DeferredWeightGrads.enabled = deferrable
            run = forward_op(stage, op, dict(before[op]))
            leaves = [v for v in run.inputs.values() if v.requires_grad]
            return [run.outputs[k] for k in keys], leaves

        for _ in range(args.repeats):
            outs, _ = outputs(False)
            t0 = time.perf_counter()
            torch.autograd.backward(outs, seeds)
            timed["fused"].append(time.perf_counter() - t0)
            outs, leaves = outputs(False)
            t0 = time.perf_counter()
            if leaves:
                torch.autograd.grad(outs, leaves, seeds, retain_graph=True, allow_unused=True)
            t1 = time.perf_counter()
            torch.autograd.backward(outs, seeds, inputs=params)
            timed["twice_b"].append(t1 - t0)
            timed["twice_w"].append(time.perf_counter() - t1)
            outs, _ = outputs(True)
            queue: list = []
            t0 = time.perf_counter()
            with DeferredWeightGrads.collect(queue):
                torch.autograd.backward(outs, seeds)
            t1 = time.perf_counter()
            DeferredWeightGrads.apply(queue)
            timed["deferred_b"].append(t1 - t0)
            timed["deferred_w"].append(time.perf_counter() - t1)
            stage.zero_grad(set_to_none=True)
        DeferredWeightGrads.enabled = False
        m = {k: sorted(v)[len(v) // 2] * 1e6 for k, v in timed.items()}
        print(
            f"{op:10s} {m['fused']:9.1f} {m['twice_b']:9.1f} {m['twice_w']:8.1f} "
            f"{(m['twice_b'] + m['twice_w']) / m['fused']:8.2f} {m['deferred_b']:12.1f} {m['deferred_w']:8.1f} "
            f"{(m['deferred_b'] + m['deferred_w']) / m['fused']:8.2f}"
        )


if __name__ == "__main__":
    main()
