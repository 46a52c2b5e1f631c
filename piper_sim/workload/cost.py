"""Compute cost model: time and FLOPs of a compute task from its ops' work and a device profile.

Owns TaskCoster, which prices a task's ops from a DeviceProfile (piper_sim.workload.profile; read from a file by
piper_sim.workload.profile_load) on the roofline of roofline.py, memoized: an op with a fixed cost the profile
measured for its code path (framework_s; the experts op's by number of experts, a split backward's share per pass)
takes it plus its arithmetic without per-kernel launches; the router and moe_out ops take the profile's measured MoE
path where it has one; experts ops are priced per expert row count for every rank at once. Under fp8
(model.fp8_recipe; workload/precision.py, docs/precision.md) the linears' GEMMs take the fp8 peak times
fp8_gemm_efficiency_ratio and their quantize kernels' traffic is added to memory_bound. Must not import simpy or torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

import numpy as np

from piper_sim.errors import ConfigError
from piper_sim.workload.flops import Gemm, OpWork, exchange_work, expert_gemms, experts_besides_gemms, op_work
from piper_sim.workload.model import ModelSpec
from piper_sim.workload.parallel import NO_SPLIT, TensorSplit
from piper_sim.workload.precision import cast_bytes_per_element, cast_elements, is_fp8_op
from piper_sim.workload.profile import DeviceProfile
from piper_sim.workload.roofline import (
    BACKWARD_FACTOR,
    gemm_time_s,
    memory_bound_s,
    pass_of,
    pass_traffic,
    work_terms_s,
    work_time_s,
)
from piper_sim.workload.task_kinds import SPLIT_BACKWARD_KINDS, Role, TaskKind


class ExchangeTask(Protocol):
    """What exchange_s reads of a schedule task (piper_sim.schedule.ir.Task; workload must not import schedule)."""

    @property
    def role(self) -> str: ...

    @property
    def in_forward(self) -> bool: ...


MOE_PATH_OPS = ("router:", "moe_out:")  # the ops a profile's measured MoE path prices (DeviceProfile.moe_path)
K = TaskKind


# The terms a compute task's time is made of (TaskCoster.cost_terms; an error budget's compute terms):
# gemm: the GEMMs of linears and experts; attention: the attention core (fused, or batched GEMMs and the score
# matrix's softmax and dropout traffic); memory_bound: the traffic of memory-bound kernels (norms, activations,
# dropout, permutations...) at HBM bandwidth, each kind at its measured share where the profile has one; launch: a
# kernel launch overhead per kernel; framework: the fixed costs a profile measured for an op's code path
# (framework_s) and its measured MoE path (gate, gather and scatter kernels)
COST_TERMS = ("gemm", "attention", "memory_bound", "launch", "framework")


class TaskCoster:
    """Time and FLOPs of compute tasks for one model, profile and micro-batch size, memoized."""

    def __init__(
        self,
        model: ModelSpec,
        profile: DeviceProfile,
        tokens_per_microbatch: int,
        split: TensorSplit = NO_SPLIT,
        flash_attention: bool = True,
    ) -> None:
        self.model, self.profile, self.tokens = model, profile.for_model(model), tokens_per_microbatch
        self.split, self.flash = split, flash_attention
        self.fp8 = bool(model.fp8_recipe)  # its linears' GEMMs in fp8 (workload/precision.py)
        if self.fp8 and self.profile.peak_fp8_flops_per_s is None:
            raise ConfigError(
                "cost.precision",
                "fp8",
                f"bf16 with cost profile {self.profile.name}: it has no "
                "peak_fp8_TFLOPS (its device has no fp8 GEMMs, or the profile does not give their rates)",
            )
        self._cast_bytes = cast_bytes_per_element(model, self.profile.fp8_transposed_copies)  # per element quantized
        self._cache: dict[tuple | str, tuple[float, float]] = {}  # by (kind, ops, expert rows); an exchange by op
        self._one_gemm_s: dict[tuple[int, int, int, bool], float] = {}  # a GEMM's time by shape and fp8, count 1
        self._one_expert = np.zeros((1, 2))  # [rows]: one expert's GEMMs (seconds, FLOPs); NaN: not priced yet

    def _gemm_s(self, gemm: Gemm, fp8: bool = False) -> float:
        """gemm_time_s, memoized by shape: a GEMM of count c takes c times one (skewed routing prices many expert
        row counts, each again on many ranks and micro-batches)."""
        key = (gemm.rows, gemm.k, gemm.n, fp8)
        one = self._one_gemm_s.get(key)
        if one is None:
            one = self._one_gemm_s[key] = gemm_time_s(self.profile, Gemm(*key[:3]), self.model.dtype_bytes, fp8)
        return gemm.count * one

    def _fp8_gemm_s(self, gemm: Gemm) -> float:
        return self._gemm_s(gemm, fp8=True)

    def _op_gemm_s(self, op: str) -> Callable[[Gemm], float]:
        """The time of one of this op's GEMMs: in fp8 where the op's linears run in fp8."""
        return self._fp8_gemm_s if is_fp8_op(self.model, op) else self._gemm_s

    def _cast_s(self, kind: TaskKind, op: str, gemms: tuple[Gemm[float], ...]) -> float:
        """The quantize kernels of an fp8 op in a task of this kind (precision.cast_elements): memory-bound traffic at
        the profile's memory_efficiency; 0 for an op that stays in the model's dtype."""
        if not is_fp8_op(self.model, op):
            return 0.0
        return float(memory_bound_s(self.profile, (("cast", cast_elements(op, gemms, kind) * self._cast_bytes),)))

    def _experts_cast_s(self, kind: TaskKind, rows: float | np.ndarray) -> float | np.ndarray:
        """The quantize kernels of an experts op over this many routed rows (per rank), as _cast_s prices them."""
        if not self.fp8:
            return 0.0 * rows
        per_row = cast_elements("experts:0", expert_gemms(self.model, 1, self.split.etp), kind) * self._cast_bytes
        return memory_bound_s(self.profile, (("cast", per_row),), rows)

    def fp8_weight_cast_s(self, fp8_params: float) -> float:
        """Quantizing a rank's fp8 linears' weights, once per step (TE caches them over the step's micro-batches):
        priced in its optimizer step; 0 in bf16."""
        if not self.fp8:
            return 0.0
        return float(memory_bound_s(self.profile, (("cast", fp8_params * self._cast_bytes),)))

    def cost(self, kind: TaskKind, ops: tuple[str, ...], expert_rows: tuple[int, ...] = ()) -> tuple[float, float]:
        """(seconds, flops) of a compute task of this kind running these ops."""
        key = (kind, ops, expert_rows)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        factor = BACKWARD_FACTOR[kind]
        seconds = flops = 0.0
        measured_experts = (pass_of(kind), "experts") in self.profile.framework_s
        for op in ops:
            if expert_rows and op.startswith("experts:") and not measured_experts:
                s, f = self.experts_cost(
                    kind, op, np.array([expert_rows], dtype=np.int64), np.array([len(expert_rows)])
                )
                seconds, flops = seconds + float(s[0]), flops + float(f[0])
                continue
            work = op_work(self.model, op, self.tokens, expert_rows, self.split, self.flash)
            on_path = self.profile.moe_path is not None and op.startswith(MOE_PATH_OPS)
            fixed = None if on_path else self._framework_s(kind, op, expert_rows, work)
            gemm_s = self._op_gemm_s(op)
            if on_path:
                seconds += self._moe_path_s(kind, op, work)
            elif fixed is None:
                seconds += work_time_s(self.profile, work, self.model.dtype_bytes, gemm_s, kind)
            else:  # measured fixed cost of the op's code path, plus its arithmetic without per-kernel launches
                arithmetic = replace(work, num_kernels=0)
                seconds += fixed + work_time_s(self.profile, arithmetic, self.model.dtype_bytes, gemm_s, kind)
            seconds += self._cast_s(kind, op, work.gemms)
            flops += factor * work.model_flops(self.split.tp)
        self._cache[key] = (seconds, flops)
        return seconds, flops

    def cost_terms(self, kind: TaskKind, ops: tuple[str, ...], expert_rows: tuple[int, ...] = ()) -> dict[str, float]:
        """The seconds of cost(kind, ops, expert_rows) by term (COST_TERMS), priced along the same branches; their
        sum is cost()'s seconds up to rounding (tests hold it). Not memoized: for reports, not the engine."""
        factor = BACKWARD_FACTOR[kind]
        terms = dict.fromkeys(COST_TERMS, 0.0)
        measured_experts = (pass_of(kind), "experts") in self.profile.framework_s
        for op in ops:
            if expert_rows and op.startswith("experts:") and not measured_experts:
                gemm, memory, launch, _ = self._experts_parts(
                    np.array([expert_rows], dtype=np.int64), np.array([len(expert_rows)]), kind
                )
                for term, value in (("gemm", factor * gemm), ("memory_bound", memory), ("launch", factor * launch)):
                    terms[term] += float(value[0])
                terms["memory_bound"] += float(self._experts_cast_s(kind, sum(expert_rows)))
                continue
            work = op_work(self.model, op, self.tokens, expert_rows, self.split, self.flash)
            if self.profile.moe_path is not None and op.startswith(MOE_PATH_OPS):
                terms["framework"] += self._moe_path_s(kind, op, work)
                continue
            fixed = self._framework_s(kind, op, expert_rows, work)
            if fixed is not None:
                terms["framework"] += fixed
                work = replace(work, num_kernels=0)
            for term, value in work_terms_s(
                self.profile, work, self.model.dtype_bytes, self._op_gemm_s(op), kind
            ).items():
                terms[term] += value
            terms["memory_bound"] += self._cast_s(kind, op, work.gemms)
        return terms

    def _experts_parts(self, rows: np.ndarray, num_local: np.ndarray, kind: TaskKind) -> tuple:
        """Per rank of an experts op, rows[m, j] the rows of rank m's j-th expert (zero past its num_local[m]
        experts): (forward GEMM seconds, this kind's traffic seconds, forward launch seconds, forward FLOPs). Each
        expert's GEMMs are priced once per row count (skewed routing gives every rank and micro-batch its own rows)
        and added expert by expert; the rest of the op is its traffic over the rows (the pass's own kernels:
        roofline.pass_memory_s) and a few kernels per expert (experts_besides_gemms)."""
        per_expert = self._one_expert_table(rows)
        seconds, flops = np.zeros(len(rows)), np.zeros(len(rows))
        for j in range(rows.shape[1]):  # expert by expert, as one rank's sum runs
            seconds += per_expert[:, j, 0]
            flops += per_expert[:, j, 1]
        rest = experts_besides_gemms(self.model, (1,), self.split.etp)  # one row's traffic, one expert's kernels
        traffic, scale = pass_traffic(rest, kind)
        memory = memory_bound_s(self.profile, traffic, scale * rows.sum(axis=1))
        launch = num_local * rest.num_kernels * self.profile.kernel_launch_s
        return seconds, memory, launch, flops

    def _one_expert_table(self, rows: np.ndarray) -> np.ndarray:
        """[..., 2]: (seconds, FLOPs) of one expert's GEMMs on each of these row counts (0 for none), from a table by
        row count filled as counts first appear."""
        table = self._one_expert
        top = int(rows.max(initial=0))
        if top >= len(table):
            grown = np.full((max(top + 1, 2 * len(table)), 2), np.nan)
            grown[: len(table)] = table
            table = self._one_expert = grown
        rows = np.maximum(rows, 0)
        per_expert = table[rows]
        unpriced = np.isnan(per_expert[..., 0])
        if unpriced.any():  # the new row counts at once (every count's price comes from here)
            counts = np.unique(rows[unpriced])
            gemms = expert_gemms(self.model, counts, self.split.etp)
            one = [
                g.count * gemm_time_s(self.profile, replace(g, count=1), self.model.dtype_bytes, self.fp8)
                for g in gemms
            ]
            table[counts, 0] = sum(one)
            table[counts, 1] = sum(g.flops for g in gemms)
            per_expert = table[rows]
        return per_expert

    def experts_cost(
        self, kind: TaskKind, op: str, rows: np.ndarray, num_local: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """(seconds, FLOPs) per rank of a compute task of this kind running one experts op (rows and num_local as
        _experts_parts takes them): cost(kind, (op,), rank's rows) for every rank at once."""
        if (pass_of(kind), "experts") in self.profile.framework_s:  # measured fixed costs: rank by rank
            priced = [self.cost(kind, (op,), tuple(r[:n].tolist())) for r, n in zip(rows, num_local, strict=True)]
            return np.array([p[0] for p in priced]), np.array([p[1] for p in priced])
        gemm, memory, launch, flops = self._experts_parts(rows, num_local, kind)
        factor = BACKWARD_FACTOR[kind]
        return factor * (gemm + launch) + memory + self._experts_cast_s(kind, rows.sum(axis=1)), factor * flops

    def _moe_path_s(self, kind: TaskKind, op: str, work: OpWork) -> float:
        """The router and moe_out ops as the profile's measured MoE path (DeviceProfile.moe_path): the router is
        the gate and the gather into the dispatch buffer, moe_out the scatter that combines it; their backward
        swaps gather and scatter and adds the gate's GEMM gradients (a split backward's weight pass: those alone)."""
        path = self.profile.moe_path
        assert path is not None  # cost() takes this path only where the profile has one
        routed = int(self.tokens * self.split.dispatch_share) * self.model.top_k
        buffer_bytes = routed * self.model.d_model * self.model.dtype_bytes
        gather_s, scatter_s = buffer_bytes / path.gather_bytes_per_s, buffer_bytes / path.scatter_bytes_per_s
        gate_gemms_s = sum(self._gemm_s(g) for g in work.gemms)
        if kind == K.BACKWARD_WEIGHT:
            return gate_gemms_s if op.startswith("router:") else 0.0
        if pass_of(kind) == "forward":
            return path.gate_s + gather_s if op.startswith("router:") else scatter_s
        if op.startswith("router:"):
            return BACKWARD_FACTOR[kind] * gate_gemms_s + scatter_s
        return gather_s

    def _framework_s(
        self, kind: TaskKind, op: str, expert_rows: tuple[int, ...], work: OpWork | None = None
    ) -> float | None:
        """Measured fixed cost of this op in this pass, or None when the profile has none.

        A split backward (zero bubble) defers only the linears' weight GEMMs (torch backend:
        layers.DeferredWeightGrads): each pass takes the share of the backward's fixed cost calibrate
        measured for it; without that measurement the input pass takes all of it and the weight pass one
        launch per GEMM. An experts op is a fixed part plus a part per expert that got rows, from the line
        over the numbers of experts calibrate ran (profiles with one number scale it).
        """
        name = op.partition(":")[0]
        pass_name = pass_of(kind)
        entry = self.profile.framework_s.get((pass_name, name))
        if entry is None:
            return None
        tokens, seconds = zip(*entry[1], strict=True)  # flat beyond the measured token counts
        base = float(np.interp(self.tokens, tokens, seconds))
        if name == "experts":
            active = sum(1 for r in expert_rows if r > 0)
            lines = self.profile.framework_expert_lines.get(pass_name)
            if not lines:  # one expert count measured: scale it
                base *= active / max(self.profile.framework_experts, 1)
            else:  # a fixed part and a part per expert, interpolated in tokens between the fitted lines
                at, fixed, per_expert = zip(*lines, strict=True)
                base = max(
                    float(np.interp(self.tokens, at, fixed) + np.interp(self.tokens, at, per_expert) * active), 0.0
                )
        if kind not in SPLIT_BACKWARD_KINDS:
            return base
        split = self.profile.framework_split.get(name)
        if not split:  # unmeasured: the input pass runs the whole backward, the weight pass its deferred GEMMs
            if kind != K.BACKWARD_WEIGHT:
                return base
            gemms = (work or op_work(self.model, op, self.tokens, expert_rows, self.split, self.flash)).gemms
            return self.profile.kernel_launch_s * sum(g.count for g in gemms)
        tokens, inputs, weights = zip(*split, strict=True)
        share = inputs if kind != K.BACKWARD_WEIGHT else weights
        return base * float(np.interp(self.tokens, tokens, share))

    def op_s(self, op: str, expert_rows: tuple[int, ...] = ()) -> tuple[float, float]:
        """Forward and backward seconds of one op alone (an experts op as forward_expert / backward_expert),
        as the simulator prices it; expert_rows are the rows each local expert gets (zeros dropped)."""
        expert = op.startswith("experts:")
        rows = tuple(r for r in expert_rows if r > 0) if expert else ()
        return (
            self.cost(K.FORWARD_EXPERT if expert else K.FORWARD, (op,), rows)[0],
            self.cost(K.BACKWARD_EXPERT if expert else K.BACKWARD, (op,), rows)[0],
        )

    def exchange_s(self, task: ExchangeTask) -> float:
        """Host work around one MoE all-to-all (dispatch or combine) besides its library calls: the fixed cost
        calibrate measured for it (the forward dispatch packs the expert ids into the rows and unpacks them;
        every other exchange passes its rows) plus its memory traffic; 0 where the profile did not measure it,
        and for expert migration."""
        if task.role not in (Role.DISPATCH, Role.COMBINE):
            return 0.0
        op = "dispatch:0" if task.in_forward and task.role == Role.DISPATCH else "combine:0"
        hit = self._cache.get(op)
        if hit is None:
            entry = self.profile.framework_s.get(("forward", op.partition(":")[0]))
            hit = (0.0, 0.0)
            if entry is not None:
                tokens, seconds = zip(*entry[1], strict=True)
                routed = int(self.tokens * self.split.dispatch_share)
                work = replace(exchange_work(self.model, op, routed), num_kernels=0)
                hit = (
                    float(np.interp(self.tokens, tokens, seconds))
                    + work_time_s(self.profile, work, self.model.dtype_bytes),
                    0.0,
                )
            self._cache[op] = hit
        return hit[0]

    def optimizer_time_s(self, num_params: float, num_tensors: int) -> float:
        """Adam over a rank's parameters: the fixed and per-tensor costs calibrate measured (the update
        runs tensor by tensor), plus the per-parameter traffic."""
        p = self.profile
        traffic = num_params * p.optimizer_bytes_per_param / (p.hbm_bytes_per_s * p.memory_efficiency)
        return p.optimizer_fixed_s + p.optimizer_per_tensor_s * num_tensors + traffic
