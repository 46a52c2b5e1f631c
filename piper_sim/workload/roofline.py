"""The roofline of an op's work on a device profile: the time of its GEMMs, attention core, memory-bound kernels
and kernel launches, by term.

Time of one GEMM = max(FLOPs / (peak x sustained x eff(rows) x shape(rows, sqrt(k n))), bytes / (HBM x memory
efficiency)), the shape factor 1 where the profile has none, sustained the profile's gemm_sustained_factor (the share
of a single launch's rate a GEMM keeps back-to-back under the power limit); a fused attention core uses an efficiency
curve over sequence length, an unfused one its batched GEMMs (at measured batched rates where the profile has them)
and its softmax and dropout traffic; memory-bound kernels are bound by HBM bandwidth, at the share measured for their
kind (norm, activation...) where the profile has one (memory_bound_s); each kernel pays a launch overhead. A task of a
backward kind takes BACKWARD_FACTOR times its forward's GEMMs, attention and launches, and its op's own backward
memory-bound traffic (OpWork.backward_traffic, half of it in each pass of a split backward) at the shares measured
for the forward kernels. Pricing a task's ops with a profile's measured
framework costs, fp8 and memoization is cost.py's (TaskCoster). Must not import simpy or torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import overload

import numpy as np

from piper_sim.workload.flops import Elementwise, Gemm, OpWork, Traffic, UnfusedPass, traffic_bytes
from piper_sim.workload.profile import DeviceProfile
from piper_sim.workload.task_kinds import FORWARD_KINDS, RECOMPUTE_KINDS, TaskKind

K = TaskKind
BACKWARD_FACTOR = {
    K.FORWARD: 1.0,
    K.FORWARD_EXPERT: 1.0,
    K.BACKWARD: 2.0,
    K.BACKWARD_EXPERT: 2.0,
    K.BACKWARD_INPUT: 1.0,
    K.BACKWARD_EXPERT_INPUT: 1.0,
    K.BACKWARD_WEIGHT: 1.0,
    K.RECOMPUTE: 1.0,
    K.RECOMPUTE_EXPERT: 1.0,
}
_FORWARD_PASS = FORWARD_KINDS | RECOMPUTE_KINDS  # the kinds that take the forward's measured framework costs


def gemm_time_s(profile: DeviceProfile, gemm: Gemm[Elementwise], dtype_bytes: int, fp8: bool = False) -> Elementwise:
    """The roofline of a GEMM (of gemm.count identical ones); gemm.rows may be an array of row counts. fp8: its
    operands in fp8 (its output in the model's dtype), at the profile's fp8 peak times its bf16 efficiency at this
    shape times fp8_gemm_efficiency_ratio (workload/precision.py)."""
    peak = profile.peak_flops_per_s
    if fp8:
        assert profile.peak_fp8_flops_per_s is not None  # TaskCoster prices fp8 only with a profile that has one
        peak = profile.peak_fp8_flops_per_s * profile.fp8_gemm_efficiency_ratio
    rate = peak * profile.gemm_sustained_factor
    flop_time = gemm.flops / (rate * profile.gemm_efficiency_at(gemm.rows, gemm.k, gemm.n))
    nbytes = fp8_gemm_bytes(gemm, dtype_bytes) if fp8 else gemm_bytes(gemm, dtype_bytes)
    memory_time = nbytes / (profile.hbm_bytes_per_s * profile.memory_efficiency)
    if isinstance(flop_time, np.ndarray):
        return np.maximum(flop_time, memory_time)
    return max(flop_time, memory_time)


def gemm_bytes(gemm: Gemm[Elementwise], dtype_bytes: int) -> Elementwise:
    """HBM traffic of a GEMM (of gemm.count identical ones): both operands read and the output written once."""
    return gemm.count * dtype_bytes * (gemm.rows * gemm.k + gemm.k * gemm.n + gemm.rows * gemm.n)


def fp8_gemm_bytes(gemm: Gemm[Elementwise], output_bytes: int) -> Elementwise:
    """HBM traffic of an fp8 GEMM: both operands read at 1 byte, the output written in the model's dtype."""
    return gemm.count * (gemm.rows * gemm.k + gemm.k * gemm.n + output_bytes * gemm.rows * gemm.n)


@overload
def memory_bound_s(profile: DeviceProfile, traffic: Traffic, scale: float = 1.0) -> float: ...
@overload
def memory_bound_s(profile: DeviceProfile, traffic: Traffic, scale: np.ndarray) -> np.ndarray: ...
def memory_bound_s(profile: DeviceProfile, traffic: Traffic, scale: float | np.ndarray = 1.0) -> float | np.ndarray:
    """Seconds of memory-bound kernels' traffic (times scale: a pass's factor, a count of rows): each kind at the
    profile's measured share of HBM bandwidth for it (memory_kernel_efficiency), the kinds it has none for at
    memory_efficiency; a profile without the table prices all bytes at memory_efficiency in one sum."""
    shares = profile.memory_kernel_efficiency
    if not shares:
        return scale * traffic_bytes(traffic) / (profile.hbm_bytes_per_s * profile.memory_efficiency)
    return sum(
        scale * nbytes / (profile.hbm_bytes_per_s * shares.get(kind, profile.memory_efficiency))
        for kind, nbytes in traffic
    )


def batched_gemm_time_s(profile: DeviceProfile, gemm: Gemm, dtype_bytes: int, memory_share: float) -> float:
    """A batched GEMM of the unfused attention core at the profile's measured rate for its kind: the larger of its
    FLOPs at the rows curve's sustained rate (the batch's many heads fill the device, which the single-GEMM shape
    factor does not describe) and its traffic at the measured share of HBM bandwidth."""
    rate = profile.peak_flops_per_s * profile.gemm_sustained_factor * profile.gemm_efficiency(gemm.rows)
    return max(gemm.flops / rate, gemm_bytes(gemm, dtype_bytes) / (profile.hbm_bytes_per_s * memory_share))


def unfused_core_s(
    profile: DeviceProfile, core: UnfusedPass, dtype_bytes: int, gemm_s: Callable[[Gemm], float]
) -> float:
    """One pass of an attention core without flash attention: its batched GEMMs (at the profile's measured batched
    rates, or each as one GEMM of its shape where the profile has none) and the score traffic of the softmax and
    dropout kernels between them."""
    bmm = profile.attention_bmm_memory_efficiency
    if bmm is None:
        gemms = sum(gemm_s(g) for g in core.writes_scores + core.reads_scores)
    else:
        gemms = sum(batched_gemm_time_s(profile, g, dtype_bytes, bmm.writes_scores) for g in core.writes_scores)
        gemms += sum(batched_gemm_time_s(profile, g, dtype_bytes, bmm.reads_scores) for g in core.reads_scores)
    return gemms + memory_bound_s(profile, core.score_traffic)


def pass_of(kind: TaskKind) -> str:
    """The pass whose measured framework costs a task of this kind takes."""
    return "forward" if kind in _FORWARD_PASS else "backward"


def pass_memory_s(profile: DeviceProfile, work: OpWork, kind: TaskKind) -> float:
    """Seconds of an op's memory-bound traffic in a task of this kind: its forward kernels' traffic in a forward
    pass (a recomputation's included), its backward kernels' (OpWork.backward_traffic) in a backward, half of them
    in each pass of a split backward."""
    traffic, scale = pass_traffic(work, kind)
    return memory_bound_s(profile, traffic, scale)


def pass_traffic(work: OpWork, kind: TaskKind) -> tuple[Traffic, float]:
    """(traffic, scale) of an op's memory-bound kernels in a task of this kind (pass_memory_s)."""
    factor = BACKWARD_FACTOR[kind]
    if pass_of(kind) == "forward":
        return work.traffic, factor
    if work.backward_traffic is None:
        raise ValueError("a backward priced from work without backward_traffic (flops.op_work derives it)")
    return work.backward_traffic, factor / 2


def work_terms_s(
    profile: DeviceProfile,
    work: OpWork,
    dtype_bytes: int,
    gemm_s: Callable[[Gemm], float] | None = None,
    kind: TaskKind = K.FORWARD,
) -> dict[str, float]:
    """Time of an op's work by term (cost.COST_TERMS but framework) in a task of this kind: BACKWARD_FACTOR times the
    forward's, except an unfused attention core's backward and the memory-bound kernels' (pass_memory_s), priced
    from their own GEMMs and traffic (a split backward's two passes take half of them each, as they do of every
    other term); gemm_s: the time of one GEMM
    (gemm_time_s unless given, e.g. memoized)."""
    if gemm_s is None:

        def gemm_s(g: Gemm) -> float:
            return gemm_time_s(profile, g, dtype_bytes)

    factor = BACKWARD_FACTOR[kind]
    attention = 0.0
    if work.unfused_forward is not None and work.unfused_backward is not None:
        if pass_of(kind) == "forward":
            attention = factor * unfused_core_s(profile, work.unfused_forward, dtype_bytes, gemm_s)
        else:
            attention = factor / 2 * unfused_core_s(profile, work.unfused_backward, dtype_bytes, gemm_s)
    elif work.attention_flops:
        attention = (
            factor
            * work.attention_flops
            / (profile.peak_flops_per_s * profile.attention_efficiency(work.attention_seq_len))
        )
    return {
        "gemm": factor * sum(gemm_s(g) for g in work.gemms),
        "attention": attention,
        "memory_bound": pass_memory_s(profile, work, kind),
        "launch": factor * work.num_kernels * profile.kernel_launch_s,
    }


def work_time_s(
    profile: DeviceProfile,
    work: OpWork,
    dtype_bytes: int,
    gemm_s: Callable[[Gemm], float] | None = None,
    kind: TaskKind = K.FORWARD,
) -> float:
    """Time of an op's work in a task of this kind: the sum of its terms (work_terms_s)."""
    terms = work_terms_s(profile, work, dtype_bytes, gemm_s, kind)
    return terms["gemm"] + terms["attention"] + terms["memory_bound"] + terms["launch"]
