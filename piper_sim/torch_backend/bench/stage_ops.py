"""Timing of real StageModule ops the way the executor runs them, and counting the ATen ops they dispatch.

Owns: the ATen op counter (kernels vs views), preparing a one-layer all-experts stage and the state
before each op, and timing one op's forward (forward_op) and forward + backward (backward_op).
Used by the framework-overhead benchmark (a micro model whose ops do almost no work, so their time is
the per-op cost of the framework) and by the cross-check (the shipped presets). Imports torch; must not
import piper_sim.calibrate.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from piper_sim.torch_backend.a2a_algorithms import all_to_all, dispatch_rows
from piper_sim.torch_backend.layers import DeferredWeightGrads
from piper_sim.torch_backend.op_autograd import backward_op, forward_op
from piper_sim.torch_backend.stage_modules import StageModule
from piper_sim.workload.presets import load_model

from .calibration_inputs import TimingPlan
from .timing import cold_calls, median_s

MICRO_BATCH_SIZE = 2  # examples/tiny-moe.yaml and examples/small-moe.yaml
# "shared:0" on a model without shared experts runs no tensor op: its time is the executor's fixed
# per-op cost (forward_op / backward_op bookkeeping, StageModule.run_op dispatch)
CHECK_OPS = ("embed", "attn:0", "router:0", "shared:0", "experts:0", "moe_out:0", "head")
# the host work around a layer's all-to-alls, timed by exchange_samples (not model ops: no backward of their own)
EXCHANGE_OPS = ("dispatch:0", "combine:0")
# ATen ops that only make a new view or alias (no pass over the data)
VIEW_OPS = frozenset(
    {
        "detach",
        "view",
        "_unsafe_view",
        "t",
        "transpose",
        "unsqueeze",
        "squeeze",
        "slice",
        "expand",
        "split_with_sizes",
        "split",
        "lift_fresh",
        "alias",
        "as_strided",
        "permute",
        "select",
        "reshape",
        "unbind",
        "_reshape_alias",
    }
)


class CountOps(TorchDispatchMode):
    """Counts the ATen ops dispatched below autograd: views/aliases and the others (kernels)."""

    def __init__(self) -> None:
        super().__init__()
        self.kernels = 0
        self.views = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        if func.overloadpacket.__name__ in VIEW_OPS:
            self.views += 1
        else:
            self.kernels += 1
        return func(*args, **(kwargs or {}))


def prepare_stage(model: str | dict, seed: int = 0, micro_batch_size: int = MICRO_BATCH_SIZE):
    """(spec, stage, state before each op) for a one-layer stage holding all experts (ep = 1, fp32)."""
    spec = load_model(model)
    stage = StageModule(spec, [0], first=True, last=True, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, spec.vocab_size, (micro_batch_size, spec.seq_len), generator=gen)
    state = {"tokens": tokens, "targets": torch.roll(tokens, -1, dims=1)}
    before: dict[str, dict] = {}
    for op in stage.forward_ops():
        if op.startswith("experts:"):
            state.update(
                recv_rows=state["send_rows"].detach(),
                recv_splits=list(state["send_splits"]),
                recv_expert_ids=state["send_expert_ids"],
            )
        if op.startswith("moe_out:"):
            state["combined_rows"] = state["return_rows"].detach()
        before[op] = dict(state)
        stage.run_op(op, state)
    for op in CHECK_OPS:  # shared:0 of a model without shared experts: the state after the router
        before.setdefault(op, before["experts:0"])
    return spec, stage, before


def exchange_samples(before: dict, plan: TimingPlan) -> dict[str, dict]:
    """Cold samples of the host work around one MoE all-to-all as the executor runs it, in a group of one
    (every row stays, no library call): "dispatch:0" packs the expert ids into the rows and unpacks them
    (all_to_all.dispatch_rows); "combine:0" passes the returned rows, as the backward exchanges pass their
    gradients. Each {"counts", "fwd": seconds of single calls}, as op_samples' forward."""
    me = (dist.get_rank(),)
    node_of = {me[0]: 0}
    rows, ids = before["experts:0"]["send_rows"], before["experts:0"]["send_expert_ids"]
    back = before["moe_out:0"]["return_rows"].detach()
    calls = {
        "dispatch:0": lambda: dispatch_rows(rows, ids, [rows.shape[0]], me, node_of),
        "combine:0": lambda: all_to_all(back, [back.shape[0]], me, node_of),
    }
    out = {}
    for name, fn in calls.items():
        with CountOps() as count:
            fn()
        out[name] = {"counts": {"fwd_kernels": count.kernels, "fwd_views": count.views}, "fwd": cold_calls(fn, plan)}
    return out


def measure_op(stage, op: str, state: dict, plan: TimingPlan) -> dict:
    """Forward and backward seconds of one op (backward = forward+backward - forward), each call timed
    with cold caches (timing.cold_calls), and ATen op counts. All ranks must call this together."""
    return op_times(op_samples(stage, op, state, plan))


def op_samples(stage, op: str, state: dict, plan: TimingPlan) -> dict:
    """The cold samples behind measure_op: seconds of single calls of the forward ("fwd"), forward +
    backward ("all"), and the zero-bubble split as the executor runs it (_split_samples), with the ATen op
    counts. Samples of the same op taken at different times pool by concatenation (pool_samples)."""
    probe = forward_op(stage, op, dict(state))
    seeds = {k: torch.randn_like(v) for k, v in probe.outputs.items()}

    def fwd() -> None:
        forward_op(stage, op, dict(state))

    def fwd_bwd() -> None:
        backward_op(forward_op(stage, op, dict(state)), dict(seeds))

    with CountOps() as fwd_count:
        fwd()
    with CountOps() as all_count:
        fwd_bwd()
    out = {
        "counts": {
            "fwd_kernels": fwd_count.kernels,
            "fwd_views": fwd_count.views,
            "bwd_kernels": all_count.kernels - fwd_count.kernels,
            "bwd_views": all_count.views - fwd_count.views,
        },
        "fwd": cold_calls(fwd, plan),
        "all": cold_calls(fwd_bwd, plan),
        **_split_samples(stage, op, state, seeds, plan),
    }
    stage.zero_grad(set_to_none=True)
    return out


def pool_samples(a: dict | None, b: dict) -> dict:
    """Two op_samples of the same op, as one."""
    if a is None:
        return b
    return {k: (v + b[k] if isinstance(v, list) else v) for k, v in a.items()}


def op_times(samples: dict) -> dict:
    """measure_op's record from op_samples: median seconds per pass (a backward as the median forward +
    backward less the median forward, and likewise the input pass), and the ATen op counts."""
    med = {k: median_s(v) for k, v in samples.items() if isinstance(v, list)}
    return {
        "fwd_s": med["fwd"],
        "bwd_s": max(med["all"] - med["fwd"], 0.0),
        **samples["counts"],
        "bwd_input_s": max(med["split_input"] - med["split_fwd"], 0.0),
        "bwd_weight_s": med["split_weight"],
    }


def _split_samples(stage, op: str, state: dict, seeds: dict, plan: TimingPlan) -> dict:
    """The zero-bubble split of the op's backward as the executor runs it: the forward with deferrable
    linears, that forward + the input pass (backward with the linears' weight gradients deferred) and the
    weight pass (the deferred GEMMs), each cold."""
    queue: list = []

    def fwd() -> object:
        return forward_op(stage, op, dict(state))

    def fwd_input() -> None:
        record = fwd()
        keys = [k for k in seeds if k in record.outputs]
        with DeferredWeightGrads.collect(queue):
            if keys:
                torch.autograd.backward([record.outputs[k] for k in keys], [seeds[k] for k in keys])

    previous, DeferredWeightGrads.enabled = DeferredWeightGrads.enabled, True
    try:
        return {
            "split_fwd": cold_calls(fwd, plan),
            "split_input": cold_calls(fwd_input, plan, setup=queue.clear),
            "split_weight": cold_calls(lambda: DeferredWeightGrads.apply(queue), plan, setup=fwd_input),
        }
    finally:
        DeferredWeightGrads.enabled = previous
        queue.clear()
