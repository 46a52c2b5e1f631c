"""Device and host profiles: the fitted numbers the cost model and the host model read.

Owns DeviceProfile (what one GPU-like device does: peak FLOP/s, efficiency curves, memory size and
bandwidth, kernel launch and framework costs per op, collective and p2p call costs, the optimizer's
traffic) and HostProfile (only for ranks that are processes sharing a machine's cores, as on the
emulated testbed: how shared cores slow compute and how long a woken rank waits for a core). Both hold
fitted values only; reading a profile file and fitting its measurements is piper_sim.workload.profile_load's.
Pure data and lookups: must not import simpy or torch.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field, fields, replace

import numpy as np

from piper_sim.workload.flops import Elementwise
from piper_sim.workload.model import ModelSpec


@dataclass(frozen=True, kw_only=True)
class Curve:
    """Piecewise-linear efficiency in log2(x); flat beyond the ends."""

    x: tuple[float, ...]
    efficiency: tuple[float, ...]
    _seen: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # value -> efficiency
    _log_x: tuple[float, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_log_x", log2_grid(self.x))

    def __call__(self, value: Elementwise) -> Elementwise:
        if isinstance(value, np.ndarray):  # many values at once (np.interp: the same arithmetic as interp)
            return np.interp(np.log2(np.maximum(value, 1.0)), self._log_x, self.efficiency)
        hit = self._seen.get(value)
        if hit is None:
            hit = self._seen[value] = interp(math.log2(max(value, 1.0)), self._log_x, self.efficiency)
        return hit


@dataclass(frozen=True, kw_only=True)
class ShapeFactor:
    """A GEMM's efficiency relative to a wide GEMM of the same rows, over (rows, width = sqrt(k x n)):
    bilinear in (log2 rows, log2 width), flat beyond the edges. factor[i][j] is at rows[i], width[j]."""

    rows: tuple[float, ...]
    width: tuple[float, ...]
    factor: tuple[tuple[float, ...], ...]
    _seen: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # (rows, width) -> factor
    _by_width: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # width -> factor per row
    _log_rows: tuple[float, ...] = field(default=(), init=False, repr=False, compare=False)
    _log_width: tuple[float, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_log_rows", log2_grid(self.rows))
        object.__setattr__(self, "_log_width", log2_grid(self.width))

    def __call__(self, rows: Elementwise, width: float) -> Elementwise:
        if isinstance(rows, np.ndarray):
            return np.interp(np.log2(np.maximum(rows, 1.0)), self._log_rows, self._line(width))
        hit = self._seen.get((rows, width))
        if hit is None:
            hit = self._seen[(rows, width)] = interp(math.log2(max(rows, 1.0)), self._log_rows, self._line(width))
        return hit

    def _line(self, width: float) -> tuple[float, ...]:
        """The factor at this width for each row of the table (few widths: a model's GEMMs)."""
        line = self._by_width.get(width)
        if line is None:
            w = math.log2(max(width, 1.0))
            line = self._by_width[width] = tuple(interp(w, self._log_width, row) for row in self.factor)
        return line


def log2_grid(values: tuple[float, ...]) -> tuple[float, ...]:
    return tuple(float(v) for v in np.log2(values))


def interp(x: float, xp: tuple[float, ...], fp: tuple[float, ...]) -> float:
    """np.interp of one value (xp ascending; flat beyond the ends) with the same arithmetic, without an array call:
    the cost model asks for one value at a time, many thousand times under skewed routing."""
    if x <= xp[0]:
        return fp[0]
    if x >= xp[-1]:
        return fp[-1]
    j = bisect.bisect_right(xp, x) - 1
    slope = (fp[j + 1] - fp[j]) / (xp[j + 1] - xp[j])
    return slope * (x - xp[j]) + fp[j]


@dataclass(frozen=True, kw_only=True)
class MoePath:
    """A framework's own MoE token path, measured: its gate (a fixed time per call: small kernels and the host
    syncs of uneven split sizes) and the token permutation's effective rates over the routed buffer (rows x top-k x
    d_model x dtype bytes): the gather that fills the dispatch buffer and the scatter that combines it. The
    backward of a gather is a scatter and the other way round."""

    gate_s: float
    gather_bytes_per_s: float
    scatter_bytes_per_s: float


@dataclass(frozen=True, kw_only=True)
class AttentionBmmEfficiency:
    """The unfused attention core's batched GEMMs (many heads' GEMMs in one launch), measured: the share of HBM
    bandwidth each kind reaches over its traffic. writes_scores: the GEMM that writes the score matrix (Q K^T; the
    backward's dO V^T), whose short inner dimension leaves it bound by its output; reads_scores: those that read
    it (softmax(scores) V; the backward's P^T dO, dS K, dS^T Q)."""

    writes_scores: float
    reads_scores: float


@dataclass(frozen=True, kw_only=True)
class FrameworkReserve:
    """HBM a training process holds besides its tensors, by communicator (a profile's `framework_reserve`): the
    runtime's context, the first communicator's buffers and each further communicator's."""

    context_bytes: float
    first_communicator_bytes: float
    per_communicator_bytes: float

    def bytes_for(self, communicators: int) -> float:
        """The reserve of a process that opens this many communicators."""
        if communicators <= 0:
            return self.context_bytes
        return self.context_bytes + self.first_communicator_bytes + (communicators - 1) * self.per_communicator_bytes


@dataclass(frozen=True, kw_only=True)
class DeviceProfile:
    name: str
    device: str
    peak_flops_per_s: float
    hbm_bytes: float
    hbm_bytes_per_s: float
    memory_efficiency: float
    kernel_launch_s: float
    gemm_efficiency: Curve  # over GEMM rows (tokens), for GEMMs at least as wide as gemm_shape_factor's widest
    attention_efficiency: Curve  # over sequence length
    optimizer_bytes_per_param: float  # HBM traffic of one Adam update per parameter
    collective_overhead_s: float = 0.0  # host-side cost of one collective call (launch, split exchange)
    p2p_overhead_s: float = 0.0  # host-side cost of posting one send/recv pair
    source: str = ""
    framework_reserve_bytes: float | None = None  # the stack's context and library buffers (memory.reserve_bytes)
    framework_reserve: FrameworkReserve | None = None  # the same by communicator (replaces framework_reserve_bytes)
    # measured by calibrate: fixed framework cost per (pass, op name) -> (op, ((tokens, seconds), ...)), net of
    # the measured model's own arithmetic
    framework_s: dict = field(default_factory=dict)
    framework_experts: int = 0  # experts of the model framework_s was measured on
    # the experts op's fixed cost as a line over the number of experts that got rows, fitted at each token
    # count: {pass: ((tokens, fixed seconds, seconds per expert), ...)}
    framework_expert_lines: dict = field(default_factory=dict)
    # the zero-bubble split of each op's backward: {op name: ((tokens, input pass / backward, weight pass /
    # backward), ...)}
    framework_split: dict = field(default_factory=dict)
    # per-call collective overhead by group size {kind: ((group size, seconds), ...)}
    collective_overheads: dict = field(default_factory=dict)
    optimizer_fixed_s: float = 0.0  # measured: time = fixed + per_tensor x tensors + per_param x params
    optimizer_per_tensor_s: float = 0.0
    # the framework fields measured on one layer of a preset at its own dimensions: ((layer_key, {field:
    # table}), ...); a model with that key is priced with them (for_model) instead of the micro model's
    framework_by_layer: tuple = ()
    # a narrower GEMM's share of gemm_efficiency (rows, sqrt(k x n)); None: every width as the rows curve
    gemm_shape_factor: ShapeFactor | None = None
    # the framework's measured gate and token permutation (router and moe_out ops); None: priced from their work
    moe_path: MoePath | None = None
    # the share of the GEMM curves' FLOP rate a GEMM keeps back-to-back in training (clocks held down by the power
    # limit under training-like data), where the curves time single launches; 1: the curves as measured
    gemm_sustained_factor: float = 1.0
    # the unfused attention core's batched GEMMs at measured rates; None: each priced as one GEMM of its shape
    attention_bmm_memory_efficiency: AttentionBmmEfficiency | None = None
    # measured shares of hbm_bytes_per_s by memory-bound kernel kind (workload.flops.MEMORY_KINDS: norm, activation,
    # ...); a kind not here, and every kind where the table is empty, runs at memory_efficiency
    memory_kernel_efficiency: dict = field(default_factory=dict)
    # fp8 (workload/precision.py): the dense fp8 peak (None: the device has no fp8 GEMMs), an fp8 GEMM's share of it
    # over a bf16 GEMM's share of peak_flops_per_s at the same shape (fp8_gemm_efficiency_ratio: the bf16 curves
    # times it price fp8 GEMMs), and whether its fp8 GEMMs need transposed copies of their operands (Hopper)
    peak_fp8_flops_per_s: float | None = None
    fp8_gemm_efficiency_ratio: float = 1.0
    fp8_transposed_copies: bool = True
    # the device's streaming multiprocessors (CUs): a collective's kernels that hold some of them slow the compute
    # beside them (sim/busy_units.py); None: not modelled
    compute_units: int | None = None

    def gemm_efficiency_at(self, rows: Elementwise, k: int, n: int) -> Elementwise:
        """Efficiency of one (rows x k) @ (k x n) GEMM: the rows curve, times the shape factor where the profile
        has one (skinny GEMMs: small k or n); rows: one count, or an array of them."""
        eff = self.gemm_efficiency(rows)
        if self.gemm_shape_factor is not None:
            eff *= self.gemm_shape_factor(rows, math.sqrt(k * n))
        return eff

    def for_model(self, model: ModelSpec) -> DeviceProfile:
        """This profile with the framework tables measured on this model's layer, when calibrate ran one."""
        key = layer_key(model)
        for layer, tables in self.framework_by_layer:
            if layer == key:
                return replace(self, **tables)
        return self

    def collective_call_s(self, kind: str, group_size: int) -> float:
        """Host cost of one collective call of this kind and group size (interpolated in group size)."""
        table = self.collective_overheads.get(kind)
        if not table:
            return self.collective_overhead_s
        sizes, seconds = zip(*table, strict=True)
        return float(np.interp(group_size, sizes, seconds))


@dataclass(frozen=True, kw_only=True)
class HostProfile:
    """Shared-core terms of a machine whose ranks are processes taking turns on its cores (calibrate measures
    them on CPU hosts; GPU profiles have none)."""

    # (ranks per core, CPU time factor), ...; 1 at one rank per core
    core_sharing: tuple[tuple[float, float], ...] = ()
    # (ranks computing per core, extra seconds per library call of a blocking exchange), ...; and the
    # scheduler slice the simulator averages that load over
    blocking_wait: tuple[tuple[float, float], ...] = ()
    scheduler_slice_s: float = 0.0
    # the machine's speed when calibrated: CPU seconds per iteration of one layer's forward + backward, one
    # process per core (core_sharing at 1 per core, median over rounds); validate compares its runs' (0: none)
    reference_cpu_s: float = 0.0
    reference_preset: str = ""

    def core_sharing_factor(self, ranks_per_core: float) -> float:
        """How much more CPU time the same compute takes when this many ranks take turns on each core
        (measured; flat beyond the largest level measured, 1 where nothing was measured)."""
        if not self.core_sharing or ranks_per_core <= 1.0:
            return 1.0
        levels, factors = zip(*self.core_sharing, strict=True)
        return float(np.interp(ranks_per_core, levels, factors))

    def blocking_wait_s(self, computing_per_core: float) -> float:
        """Extra wait of one library call of a blocking exchange when this many ranks per core are computing
        (measured from load 0; linear between the levels, flat beyond the last; 0 where nothing was measured)."""
        if not self.blocking_wait:
            return 0.0
        levels, extra = zip(*self.blocking_wait, strict=True)
        return float(np.interp(computing_per_core, levels, extra))


# ModelSpec fields a layer's op times do not depend on (or that vary by run: tokens, experts per rank)
NOT_IN_LAYER_KEY = frozenset(
    {
        "name",
        "num_layers",
        "seq_len",
        "num_experts",
        "num_dense_layers",
        "moe_layer_freq",
        "moe_layer_offset",
        "published_params",
        "published_active_params",
        "source",
    }
)


def layer_key(model: ModelSpec) -> tuple:
    """What a layer's op times depend on besides tokens and experts per rank: two models with the same
    key run the same ops on tensors of the same sizes."""
    return tuple((f.name, getattr(model, f.name)) for f in fields(model) if f.name not in NOT_IN_LAYER_KEY)
