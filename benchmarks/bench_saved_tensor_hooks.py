"""What saved-tensor hooks cost the ops of a forward pass (why the executor counts activations on step 0 only).

    python benchmarks/bench_saved_tensor_hooks.py [--model validation/check-model.yaml] [--repeats 40]

Runs one layer's forward ops in sequence with autograd on, as the executor does, without hooks and under
torch.autograd.graph.saved_tensors_hooks (an identity hook, and the executor's storage-counting hook),
and prints each op's median time and the ratio to the run without hooks. One thread; ratios inside one
process are steadier than absolute times on a shared machine.
"""

from __future__ import annotations

import argparse
import contextlib
import time

import torch

from piper_sim.torch_backend.bench.stage_ops import prepare_stage


def forward_times_us(stage, before: dict, hooks, repeats: int) -> dict[str, float]:
    """Median microseconds of each forward op, the ops run in sequence like the executor runs them."""
    times: dict[str, list[float]] = {}
    for _ in range(repeats):
        state = {"tokens": before["embed"]["tokens"], "targets": before["embed"]["targets"]}
        context = torch.autograd.graph.saved_tensors_hooks(*hooks) if hooks else contextlib.nullcontext()
        with torch.enable_grad(), context:
            for op in stage.forward_ops():
                if op.startswith("experts:"):  # ep = 1: the rows this rank sends are the rows it gets
                    state.update(
                        recv_rows=state["send_rows"],
                        recv_splits=list(state["send_splits"]),
                        recv_expert_ids=state["send_expert_ids"],
                    )
                if op.startswith("moe_out:"):
                    state["combined_rows"] = state["return_rows"]
                start = time.perf_counter()
                stage.run_op(op, state)
                times.setdefault(op, []).append(time.perf_counter() - start)
    return {op: sorted(v)[len(v) // 2] * 1e6 for op, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="validation/check-model.yaml")
    parser.add_argument("--repeats", type=int, default=40)
    args = parser.parse_args()
    torch.set_num_threads(1)
    _, stage, before = prepare_stage(args.model)
    saved: dict[int, int] = {}

    def count_storage(t: torch.Tensor) -> torch.Tensor:  # the executor's hook
        storage = t.untyped_storage()
        saved[storage.data_ptr()] = storage.nbytes()
        return t

    variants = {
        "no hooks": None,
        "identity hook": (lambda t: t, lambda t: t),
        "storage-counting hook": (count_storage, lambda t: t),
    }
    results = {name: forward_times_us(stage, before, hooks, args.repeats) for name, hooks in variants.items()}
    base = results["no hooks"]
    print(f"forward ops of {args.model}, median us over {args.repeats} passes (ratio to no hooks)")
    print(f"{'op':12s}" + "".join(f"{name:>26s}" for name in results))
    for op in base:
        cells = "".join(f"{r[op]:14.1f} ({r[op] / base[op]:4.2f}x)    " for r in results.values())
        print(f"{op:12s}  {cells}")
    total = {name: sum(r.values()) for name, r in results.items()}
    print("all ops       " + "".join(f"{t:14.1f} ({t / total['no hooks']:4.2f}x)    " for t in total.values()))


if __name__ == "__main__":
    main()
