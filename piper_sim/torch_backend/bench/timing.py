"""Timing of one benchmarked call, the same way on every rank, and the device the benchmarks run on.

Owns the measurement protocol: warm-up, an inner loop long enough for the clock (the count agreed by
all ranks, so they stay in step and contend for the machine together), several samples, the median.
Imports torch; must not import piper_sim.calibrate.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from .calibration_inputs import TimingPlan


@dataclass(frozen=True, kw_only=True)
class Device:
    """Where compute benchmarks run: CPU fp32, or one CUDA device in bf16."""

    torch_device: torch.device
    dtype: torch.dtype

    @property
    def is_cuda(self) -> bool:
        return self.torch_device.type == "cuda"

    def sync(self) -> None:
        if self.is_cuda:
            torch.cuda.synchronize(self.torch_device)

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")


def pick_device(rank: int) -> Device:
    if torch.cuda.is_available():
        index = rank % torch.cuda.device_count()
        torch.cuda.set_device(index)
        return Device(torch_device=torch.device("cuda", index), dtype=torch.bfloat16)
    return Device(torch_device=torch.device("cpu"), dtype=torch.float32)


def _agree_max(value: float) -> float:
    """The largest value over all ranks (every rank gets it); the value itself without a process group."""
    if not (dist.is_available() and dist.is_initialized()):
        return value
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _probe_s(fn: Callable[[], object], sync: Callable[[], None], collective: bool) -> float:
    """Rough seconds per call. Local calls: grow the loop until it lasts 1 ms. Collectives: one call
    (a collective must be called the same number of times on every rank)."""
    calls = 1
    while True:
        sync()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        elapsed = time.perf_counter() - start
        if collective or elapsed >= 1e-3 or calls >= 4096:
            return elapsed / calls
        calls *= 4


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def time_call(
    fn: Callable[[], object],
    plan: TimingPlan,
    *,
    sync: Callable[[], None] = lambda: None,
    collective: bool = False,
    window: bool = False,
) -> list[float]:
    """Seconds per call of fn, one value per sample (use the median). All ranks call this together for
    the same benchmark.

    window=True (CPU compute): every sample is a wall-clock window of plan.sample_s that all ranks start
    together (barrier) and fill with calls, so each rank is busy for the whole window and the time per
    call includes its share of the cores (contention averaged over many scheduler slices).
    Otherwise the ranks agree on an inner-loop count (collectives must be called equally often).
    """
    for _ in range(plan.warmup_calls):
        fn()
    sync()
    per_call = _agree_max(_probe_s(fn, sync, collective))
    if window and not collective:
        return _windows(fn, plan, stride=max(1, round(plan.sample_s / 20 / max(per_call, 1e-9))))
    calls = max(1, min(plan.max_calls, round(plan.sample_s / max(per_call, 1e-9))))
    samples = []
    for _ in range(plan.num_samples):
        sync()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        samples.append((time.perf_counter() - start) / calls)
    return samples


def _windows(fn: Callable[[], object], plan: TimingPlan, stride: int) -> list[float]:
    samples = []
    for _ in range(plan.num_samples):
        _barrier()
        calls, start = 0, time.perf_counter()
        while True:
            for _ in range(stride):
                fn()
            calls += stride
            elapsed = time.perf_counter() - start
            if elapsed >= plan.sample_s:
                break
        samples.append(elapsed / calls)
    return samples


COLD_CALLS_PER_SAMPLE = 6
_flush_buffer: list[torch.Tensor] = []


def last_level_cache_bytes() -> int:
    """Size of the CPU's largest cache (Linux sysfs), 32 MiB when it cannot be read."""
    sizes = []
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = path.read_text().strip().upper()
        try:
            sizes.append(int(text[:-1]) * {"K": 1 << 10, "M": 1 << 20}[text[-1]] if text[-1] in "KM" else int(text))
        except (ValueError, KeyError):
            continue
    return max(sizes, default=32 << 20)


def flush_caches() -> None:
    """Write a buffer twice the last-level cache, so the next call finds none of its code or data cached."""
    if not _flush_buffer:
        _flush_buffer.append(torch.zeros(2 * last_level_cache_bytes() // 4))
    _flush_buffer[0].add_(1.0)


def cold_calls(fn: Callable[[], object], plan: TimingPlan, setup: Callable[[], object] = lambda: None) -> list[float]:
    """Seconds of single calls of fn, each made after flush_caches(), as ops run inside a training step:
    the ops before them (and on a shared host the other ranks) have evicted their code and data. All
    ranks start together (barrier) and flush and call at the same time. setup runs before each call's
    flush, untimed."""
    for _ in range(plan.warmup_calls):
        setup()
        fn()
    _barrier()
    samples = []
    for _ in range(plan.num_samples * COLD_CALLS_PER_SAMPLE):
        setup()
        flush_caches()
        _barrier()
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


def median_s(samples: list[float]) -> float:
    return statistics.median(samples)
