"""Compute micro-benchmarks run by every rank at once: per-op overhead, GEMMs, expert FFNs, attention,
memory-bound elementwise ops and the Adam step.

Owns the benchmark bodies; each returns records (flat dicts: bench, shape fields, work, time_s = this
rank's median seconds per call). Ops run the way training runs them: weights require grad, so the
forward records the autograd graph (its bookkeeping is part of every op's fixed cost). Imports torch;
must not import piper_sim.calibrate.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable

import torch
import torch.nn.functional as F

from piper_sim.torch_backend.layers import FFN, RMSNorm

from .calibration_inputs import MICRO_MODEL, Sweep, TimingPlan, layer_expert_counts
from .stage_ops import CHECK_OPS, EXCHANGE_OPS, exchange_samples, op_samples, op_times, pool_samples, prepare_stage
from .timing import Device, cold_calls, median_s, time_call

Record = dict[str, object]
Progress = Callable[[str], None]


def _time(fn: Callable[[], object], plan: TimingPlan, device: Device) -> float:
    return median_s(time_call(fn, plan, sync=device.sync, window=not device.is_cuda))


def _rand(device: Device, *shape: int, grad: bool = False) -> torch.Tensor:
    return torch.randn(*shape, device=device.torch_device, dtype=device.dtype).requires_grad_(grad)


def _rmsnorm_like(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight


def bench_tiny_ops(device: Device, plan: TimingPlan, progress: Progress) -> list[Record]:
    """Fixed per-op cost: one-element ops, with and without autograd recording. Many repeats (the
    sample is long compared with one call), median."""
    progress("per-op overhead (1-element ops)")
    plan = plan.scaled(2.0)
    out: list[Record] = []
    for grad in (False, True):
        a, b = _rand(device, 1, 1, grad=grad), _rand(device, 1, 1)
        w = _rand(device, 1, 1, grad=grad)
        x64, w64 = _rand(device, 1, 64, grad=grad), _rand(device, 64, 64, grad=grad)
        norm_w = _rand(device, 1, grad=grad)
        ops: dict[str, Callable[[], object]] = {
            "add": lambda a=a, b=b: a + b,
            "mul": lambda a=a, b=b: a * b,
            "softmax": lambda a=a: torch.softmax(a, -1),
            "linear": lambda b=b, w=w: F.linear(b, w),
            "linear_1x64x64": lambda x=x64, w=w64: F.linear(x, w),
            "rmsnorm_6ops": lambda a=a, w=norm_w: _rmsnorm_like(a, w),
            "view": lambda x=x64: x.view(-1),
            "transpose": lambda x=x64: x.transpose(0, 1),
        }
        for name, fn in ops.items():
            out.append({"bench": "tiny", "op": name, "autograd": grad, "time_s": _time(fn, plan, device)})
    return out


def bench_gemms(device: Device, sweep: Sweep, progress: Progress) -> list[Record]:
    """F.linear over rows x (k, n): one GEMM of 2 rows k n FLOPs."""
    out: list[Record] = []
    total = len(sweep.gemm_shapes) * len(sweep.gemm_rows)
    for i, shape in enumerate(sweep.gemm_shapes):
        w = _rand(device, shape.n, shape.k, grad=True)
        for j, rows in enumerate(sweep.gemm_rows):
            progress(f"gemm {i * len(sweep.gemm_rows) + j + 1}/{total}: rows {rows}, k {shape.k}, n {shape.n}")
            x = _rand(device, rows, shape.k)
            t = _time(lambda x=x, w=w: F.linear(x, w), sweep.timing, device)
            out.append(
                {
                    "bench": "gemm",
                    "rows": rows,
                    "k": shape.k,
                    "n": shape.n,
                    "label": shape.label,
                    "flops": 2.0 * rows * shape.k * shape.n,
                    "time_s": t,
                }
            )
    return out


def bench_ffns(device: Device, sweep: Sweep, progress: Progress) -> list[Record]:
    """Whole expert FFN (the torch backend's FFN module) and the sum of its GEMMs timed alone."""
    out: list[Record] = []
    total = len(sweep.ffn_shapes) * len(sweep.ffn_rows)
    count = 0
    for shape in sweep.ffn_shapes:
        ffn = FFN(shape.d_model, shape.ffn_dim, shape.num_matrices, device=device.torch_device, dtype=device.dtype)
        torch.nn.init.normal_(ffn.w1, std=shape.d_model**-0.5)
        torch.nn.init.normal_(ffn.w2, std=shape.ffn_dim**-0.5)
        if ffn.w3 is not None:
            torch.nn.init.normal_(ffn.w3, std=shape.d_model**-0.5)
        for rows in sweep.ffn_rows:
            count += 1
            progress(f"expert ffn {count}/{total}: {shape.label}, rows {rows}")
            x = _rand(device, rows, shape.d_model)
            h = _rand(device, rows, shape.ffn_dim)
            whole = _time(lambda x=x, f=ffn: f(x), sweep.timing, device)
            up = _time(lambda x=x, f=ffn: F.linear(x, f.w1), sweep.timing, device)
            down = _time(lambda h=h, f=ffn: F.linear(h, f.w2), sweep.timing, device)
            flops = 2.0 * rows * shape.d_model * shape.ffn_dim * shape.num_matrices
            out.append(
                {
                    "bench": "ffn",
                    "rows": rows,
                    "d_model": shape.d_model,
                    "ffn_dim": shape.ffn_dim,
                    "matrices": shape.num_matrices,
                    "label": shape.label,
                    "flops": flops,
                    "time_s": whole,
                    "gemm_sum_s": (shape.num_matrices - 1) * up + down,
                }
            )
    return out


def bench_attention(device: Device, sweep: Sweep, progress: Progress) -> list[Record]:
    """Causal scaled_dot_product_attention; useful (causal) FLOPs = 2 b s^2 h hd, as flops.py counts."""
    out: list[Record] = []
    total = len(sweep.attention_shapes) * len(sweep.attention_seq_lens)
    count = 0
    for shape in sweep.attention_shapes:
        for seq in sweep.attention_seq_lens:
            count += 1
            progress(f"attention {count}/{total}: seq {seq}, heads {shape.heads}, head dim {shape.head_dim}")
            q, k, v = (_rand(device, shape.batch, shape.heads, seq, shape.head_dim, grad=True) for _ in range(3))
            t = _time(
                lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v, is_causal=True), sweep.timing, device
            )
            flops = 2.0 * shape.batch * seq * seq * shape.heads * shape.head_dim
            out.append(
                {
                    "bench": "attention",
                    "seq_len": seq,
                    "batch": shape.batch,
                    "heads": shape.heads,
                    "head_dim": shape.head_dim,
                    "label": shape.label,
                    "flops": flops,
                    "time_s": t,
                }
            )
    return out


def bench_elementwise(device: Device, sweep: Sweep, progress: Progress) -> list[Record]:
    """Memory-bound ops over tensor sizes; bytes = the minimal traffic (add/mul: 2 reads + 1 write;
    softmax, RMSNorm and gather: 1 read + 1 write). RMSNorm is the model's (6 ops) for its fixed cost;
    gather is a row permutation x[index] of 256-wide rows, as the router and the combine do."""
    out: list[Record] = []
    elem = torch.empty((), dtype=device.dtype).element_size()
    total = 5 * len(sweep.elementwise_bytes)
    count = 0
    for size in sweep.elementwise_bytes:
        numel = max(1, size // elem)
        cols = min(numel, 1024)
        a, b = _rand(device, numel // cols, cols, grad=True), _rand(device, numel // cols, cols)
        norm = RMSNorm(cols, device=device.torch_device, dtype=device.dtype)
        torch.nn.init.ones_(norm.weight)
        rows = _rand(device, max(1, numel // 256), min(numel, 256), grad=True)
        index = torch.randperm(rows.shape[0], device=device.torch_device)
        ops = {
            "add": (lambda a=a, b=b: a + b, 3),
            "mul": (lambda a=a, b=b: a * b, 3),
            "softmax": (lambda a=a: torch.softmax(a, -1), 2),
            "rmsnorm": (lambda a=a, n=norm: n(a), 2),
            "gather": (lambda r=rows, i=index: r[i], 2),
        }
        for name, (fn, passes) in ops.items():
            count += 1
            progress(f"elementwise {count}/{total}: {name}, {a.numel() * elem / 1024:.0f} KiB")
            out.append(
                {
                    "bench": "elementwise",
                    "op": name,
                    "tensor_bytes": a.numel() * elem,
                    "bytes": passes * a.numel() * elem,
                    "time_s": _time(fn, sweep.timing, device),
                }
            )
    return out


def bench_optimizer(device: Device, sweep: Sweep, progress: Progress) -> list[Record]:
    """torch.optim.Adam step (defaults, as the executor builds it) over P parameters in T tensors. On CPU each
    step is timed after a cache flush (timing.cold_calls): in a training step the backward has evicted the
    optimizer's state by the time it runs (cold / hot was 1.45, 1.29 and 1.11 for a tiny-moe stage of 1, 2
    and 4 layers: benchmarks/bench_adam_cold.py)."""
    out: list[Record] = []
    for i, (num_params, num_tensors) in enumerate(sweep.optimizer_points):
        progress(f"adam step {i + 1}/{len(sweep.optimizer_points)}: {num_params} params in {num_tensors} tensors")
        params = [torch.nn.Parameter(_rand(device, num_params // num_tensors)) for _ in range(num_tensors)]
        for p in params:
            p.grad = torch.randn_like(p)
        opt = torch.optim.Adam(params, lr=1e-6)
        t = _time(opt.step, sweep.timing, device) if device.is_cuda else median_s(cold_calls(opt.step, sweep.timing))
        out.append(
            {
                "bench": "optimizer",
                "params": (num_params // num_tensors) * num_tensors,
                "tensors": num_tensors,
                "time_s": t,
            }
        )
    return out


def bench_framework(device: Device, sweep: Sweep, progress: Progress) -> list[Record]:
    """Fixed cost of real model code: each op of a micro MoE (d 8; next to no arithmetic) run with the
    executor's forward_op / backward_op at each of MICRO_SHAPES, with the ATen ops (kernels, views) it
    dispatched; then the same for one layer of each swept preset at its own dimensions (sweep.layers at
    sweep.layer_shapes). The experts op also runs with other numbers of experts (layer_expert_counts). Records carry
    the model's name. The whole list runs in sweep.framework_rounds rounds, each with a share of the samples, and
    each op's samples are pooled over the rounds: the machine drifts over minutes, and a slow stretch then
    spreads over every op instead of landing on the few measured in it. CPU only (the stage is built on the CPU)."""
    if device.is_cuda:
        return []
    runs = [
        (model, seq_len, batch, experts, CHECK_OPS if experts == model["num_experts"] else ("experts:0",))
        for model, (seq_len, batch) in sweep.framework_runs()
        for experts in layer_expert_counts(model)
    ]
    rounds = sweep.framework_rounds
    plan = dataclasses.replace(sweep.timing, num_samples=max(1, -(-sweep.timing.num_samples // rounds)))
    total = rounds * sum(len(ops) + (len(EXCHANGE_OPS) if ops == CHECK_OPS else 0) for *_, ops in runs)
    pooled: dict[tuple[int, str], dict] = {}
    done = 0
    for r in range(rounds):
        for index, (model, seq_len, batch, experts, ops) in enumerate(runs):
            _, stage, before = prepare_stage(dict(model, seq_len=seq_len, num_experts=experts), micro_batch_size=batch)
            for op in ops:
                done += 1
                progress(
                    f"framework {done}/{total} (round {r + 1}/{rounds}): {model['name']} {op} forward and "
                    f"backward, {seq_len * batch} tokens, {experts} experts"
                )
                key = (index, op)
                pooled[key] = pool_samples(pooled.get(key), op_samples(stage, op, before[op], plan))
            if ops == CHECK_OPS:  # the host work around the layer's exchanges (forward records only)
                done += len(EXCHANGE_OPS)
                progress(
                    f"framework {done}/{total} (round {r + 1}/{rounds}): {model['name']} exchange host work, "
                    f"{seq_len * batch} tokens"
                )
                for op, samples in exchange_samples(before, plan).items():
                    pooled[(index, op)] = pool_samples(pooled.get((index, op)), samples)
    out: list[Record] = []
    for index, (model, seq_len, batch, experts, ops) in enumerate(runs):
        layer = {} if model is MICRO_MODEL else {"layer": json.dumps(model, sort_keys=True)}
        for op in ops + (EXCHANGE_OPS if ops == CHECK_OPS else ()):
            samples = pooled[(index, op)]
            m = op_times(samples) if "all" in samples else {"fwd_s": median_s(samples["fwd"]), **samples["counts"]}
            for direction in ("fwd", "bwd", "bwd_input", "bwd_weight"):  # the last two: the zero-bubble split
                if f"{direction}_s" not in m:
                    continue
                counts = m.get(f"{direction}_kernels", 0), m.get(f"{direction}_views", 0)
                out.append(
                    {
                        "bench": "framework",
                        "model": model["name"],
                        **layer,
                        "op": op,
                        "pass": direction,
                        "seq_len": seq_len,
                        "micro_batch_size": batch,
                        "tokens": seq_len * batch,
                        "num_experts": experts,
                        "kernels": counts[0],
                        "views": counts[1],
                        "time_s": m[f"{direction}_s"],
                    }
                )
    return out


def run_compute(device: Device, sweep: Sweep, progress: Progress) -> list[Record]:
    records = bench_tiny_ops(device, sweep.timing, progress)
    for bench in (bench_framework, bench_gemms, bench_ffns, bench_attention, bench_elementwise, bench_optimizer):
        records += bench(device, sweep, progress)
    return records
