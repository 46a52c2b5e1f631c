"""Cross-check of a profile: real StageModule ops timed on this machine vs CostProfile.work_time_s.

Owns `piper-sim calibrate --check PROFILE`: for each model preset, one layer's ops (embed, attn, router,
experts, moe_out, head) run through the torch backend's forward_op / backward_op exactly as the
executor runs them (autograd on, fp32 on CPU), on N ranks at once like the calibration, at the shipped
examples' micro-batch size; the real router's per-expert rows feed the prediction. Reported per op:
measured forward and backward, predicted (backward = 2 x forward, as the cost model has it), the
prediction split into FLOP, memory and launch terms, and the number of ATen ops the op dispatched
(the kernels a per-op overhead is paid for) next to flops.py's num_kernels. Imports torch.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from piper_sim.calibrate.runner import _threads
from piper_sim.calibrate.sweep import DEFAULT_PRESETS, TimingPlan
from piper_sim.calibrate.timing import median_s, time_call
from piper_sim.workload.cost import CostProfile, load_profile
from piper_sim.workload.flops import op_work

MICRO_BATCH_SIZE = 2  # examples/tiny-moe.yaml and examples/small-moe.yaml
CHECK_OPS = ("embed", "attn:0", "router:0", "experts:0", "moe_out:0", "head")


class _CountOps(TorchDispatchMode):
    """Counts the ATen ops dispatched below autograd (views included)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        self.count += 1
        return func(*args, **(kwargs or {}))


@dataclass(frozen=True)
class CheckJob:
    profile: str
    presets: tuple[str, ...]
    out_dir: str
    sample_s: float = 0.05


def _prepare(model_name: str, seed: int = 0):
    """A one-layer, all-experts stage of the model and the state before each checked op."""
    from piper_sim.torch_backend.model import StageModule
    from piper_sim.workload.presets import load_model

    spec = load_model(model_name)
    stage = StageModule(spec, [0], first=True, last=True, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, spec.vocab_size, (MICRO_BATCH_SIZE, spec.seq_len), generator=gen)
    state = {"tokens": tokens, "targets": torch.roll(tokens, -1, dims=1)}
    before: dict[str, dict] = {}
    for op in stage.forward_ops():
        if op.startswith("experts:"):
            state.update(recv_rows=state["send_rows"].detach(), recv_splits=list(state["send_splits"]),
                         recv_expert_ids=state["send_expert_ids"])
        if op.startswith("moe_out:"):
            state["combined_rows"] = state["return_rows"].detach()
        before[op] = dict(state)
        stage.run_op(op, state)
    return spec, stage, before


def _measure_op(stage, op: str, state: dict, plan: TimingPlan) -> dict:
    from piper_sim.torch_backend.op_autograd import backward_op, forward_op

    probe = forward_op(stage, op, dict(state))
    seeds = {k: torch.randn_like(v) for k, v in probe.outputs.items()}

    def fwd() -> None:
        forward_op(stage, op, dict(state))

    def fwd_bwd() -> None:
        backward_op(forward_op(stage, op, dict(state)), dict(seeds))

    with _CountOps() as counter:
        fwd()
    fwd_ops = counter.count
    with _CountOps() as counter:
        fwd_bwd()
    t_fwd = median_s(time_call(fwd, plan, window=True))
    t_all = median_s(time_call(fwd_bwd, plan, window=True))
    stage.zero_grad(set_to_none=True)
    return {"fwd_s": t_fwd, "bwd_s": max(t_all - t_fwd, 0.0), "fwd_aten_ops": fwd_ops,
            "bwd_aten_ops": counter.count - fwd_ops}


def check_worker(rank: int, world: int, job: CheckJob) -> None:
    torch.manual_seed(0)
    plan = TimingPlan(sample_s=job.sample_s, num_samples=7)
    rows = []
    for name in job.presets:
        spec, stage, before = _prepare(name)
        for op in CHECK_OPS:
            state = before[op]
            expert_rows = ()
            if op.startswith("experts:"):
                expert_rows = tuple(torch.bincount(state["recv_expert_ids"], minlength=spec.num_experts).tolist())
            rows.append({"model": name, "op": op, "tokens": MICRO_BATCH_SIZE * spec.seq_len,
                         "expert_rows": list(expert_rows), **_measure_op(stage, op, state, plan)})
    Path(job.out_dir, f"check-rank{rank}.json").write_text(json.dumps(rows))


def predict(profile: CostProfile, model_name: str, op: str, tokens: int, expert_rows: tuple[int, ...],
            dtype_bytes: int | None = None) -> dict:
    """The cost model's forward time of one op, and its parts."""
    from piper_sim.workload.presets import load_model

    spec = load_model(model_name)
    b = spec.dtype_bytes if dtype_bytes is None else dtype_bytes
    work = op_work(spec, op, tokens, expert_rows)
    gemm = sum(profile.gemm_time_s(g, b) for g in work.gemms)
    attention = work.attention_flops / (profile.peak_flops_per_s * profile.attention_efficiency(
        work.attention_seq_len)) if work.attention_flops else 0.0
    memory = work.elementwise_bytes / (profile.hbm_bytes_per_s * profile.memory_efficiency)
    launch = work.num_kernels * profile.kernel_launch_s
    return {"total_s": profile.work_time_s(work, b), "gemm_s": gemm, "attention_s": attention, "memory_s": memory,
            "launch_s": launch, "num_kernels": work.num_kernels, "dtype_bytes": b}


def crosscheck(profile_spec: str, *, presets: tuple[str, ...] = DEFAULT_PRESETS, ranks: int = 1,
               timeout_s: float = 1800.0) -> list[dict]:
    """Measured vs predicted per op (medians over ranks)."""
    from piper_sim.torch_backend.local_launch import run_local

    profile = load_profile(profile_spec)
    with tempfile.TemporaryDirectory(prefix="piper-check-") as tmp:
        job = CheckJob(profile=str(profile_spec), presets=presets, out_dir=tmp)
        run_local(check_worker, ranks, job, timeout_s=timeout_s, num_threads=_threads(ranks))
        per_rank = [json.loads(Path(tmp, f"check-rank{r}.json").read_text()) for r in range(ranks)]
    out = []
    for i, row in enumerate(per_rank[0]):
        fwd = float(torch.tensor([p[i]["fwd_s"] for p in per_rank]).median())
        bwd = float(torch.tensor([p[i]["bwd_s"] for p in per_rank]).median())
        pred = predict(profile, row["model"], row["op"], row["tokens"], tuple(row["expert_rows"]))
        out.append({**row, "fwd_s": fwd, "bwd_s": bwd, "pred": pred,
                    "pred_fp32": predict(profile, row["model"], row["op"], row["tokens"], tuple(row["expert_rows"]),
                                         dtype_bytes=4)})
    return out


def _err(pred: float, meas: float) -> str:
    return f"{100 * (pred - meas) / meas:+.0f}%" if meas > 0 else "n/a"


def format_table(rows: list[dict]) -> str:
    """Markdown table of measured vs predicted microseconds."""
    head = ("| model | op | measured fwd us | predicted fwd us | error | pred. parts gemm+attn / mem / launch us "
            "| kernels (flops.py / ATen fwd) | measured bwd us | predicted bwd us | error |")
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        p = r["pred"]
        parts = f"{(p['gemm_s'] + p['attention_s']) * 1e6:.1f} / {p['memory_s'] * 1e6:.1f} / {p['launch_s'] * 1e6:.1f}"
        lines.append(f"| {r['model']} | {r['op']} | {r['fwd_s'] * 1e6:.1f} | {p['total_s'] * 1e6:.1f} | "
                     f"{_err(p['total_s'], r['fwd_s'])} | {parts} | {p['num_kernels']} / {r['fwd_aten_ops']} | "
                     f"{r['bwd_s'] * 1e6:.1f} | {2 * p['total_s'] * 1e6:.1f} | {_err(2 * p['total_s'], r['bwd_s'])} |")
    return "\n".join(lines)
