"""The experts op alone, cold, on one rank: calibrate's model with E experts against an EP rank.

    python benchmarks/bench_expert_op_ep.py [--samples 60]

calibrate prices the experts op from one-layer models with 2, 4 and 8 experts (ep 1, all experts local;
torch_backend/bench/compute.py). An EP rank of the 8-expert model holds 8 / ep experts and runs the same op on rows
it received. This times both on tiny-moe's layer at the validation cases' size (seq 128, micro-batch 2,
top-2: 512 routed rows), each call after a cache flush (torch_backend/bench/timing.py), forward and backward
(forward + backward - forward), median of --samples calls. Used by validation/README.md ("Known gaps").
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from piper_sim.torch_backend.bench.stage_ops import prepare_stage
from piper_sim.torch_backend.bench.timing import flush_caches
from piper_sim.torch_backend.op_autograd import backward_op, forward_op
from piper_sim.torch_backend.stage_modules import StageModule
from piper_sim.workload.presets import load_model, spec_to_mapping

OP = "experts:0"


def cold_ms(stage: StageModule, state: dict, samples: int) -> tuple[float, float]:
    """Median forward and backward milliseconds of the experts op, each call cold."""
    fwd, both = [], []
    for _ in range(5):
        forward_op(stage, OP, dict(state))
    for _ in range(samples):
        flush_caches()
        t0 = time.perf_counter()
        forward_op(stage, OP, dict(state))
        fwd.append(time.perf_counter() - t0)
        flush_caches()
        t0 = time.perf_counter()
        record = forward_op(stage, OP, dict(state))
        backward_op(record, {k: torch.ones_like(v) for k, v in record.outputs.items()})
        both.append(time.perf_counter() - t0)
    f, fb = statistics.median(fwd), statistics.median(both)
    return f * 1e3, (fb - f) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=60)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = dict(spec_to_mapping(load_model("tiny-moe")), num_layers=1, seq_len=128)
    print("calibrate's model with E experts (ep 1)")
    for experts in (2, 4, 8):
        _, stage, before = prepare_stage(dict(model, num_experts=experts), micro_batch_size=2)
        state = before[OP]
        f, b = cold_ms(stage, state, args.samples)
        print(f"  {experts} experts, {state['recv_rows'].shape[0]} rows: forward {f:.2f} ms, backward {b:.2f} ms")
    spec = load_model(model)
    _, _, before = prepare_stage(model, micro_batch_size=2)
    rows = before[OP]["recv_rows"]
    gen = torch.Generator().manual_seed(0)
    print("an EP rank of the 8-expert model (rows spread evenly at random over its local experts)")
    for ep in (1, 2, 4, 8):
        stage = StageModule(spec, [0], first=True, last=True, ep_rank=0, ep_size=ep)
        local = spec.num_experts // ep
        state = dict(
            before[OP], recv_rows=rows.clone(), recv_expert_ids=torch.randint(0, local, (rows.shape[0],), generator=gen)
        )
        f, b = cold_ms(stage, state, args.samples)
        print(f"  ep {ep} ({local} local experts), {rows.shape[0]} rows: forward {f:.2f} ms, backward {b:.2f} ms")


if __name__ == "__main__":
    main()
