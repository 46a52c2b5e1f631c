"""Cross-check of a profile: real StageModule ops timed on this machine vs the cost model's work_time_s.

Owns `piper-sim calibrate --check PROFILE`: for each model preset, one layer's ops (embed, attn, router,
experts, moe_out, head) run through the torch backend's forward_op / backward_op exactly as the
executor runs them (autograd on, fp32 on CPU), on N ranks at once like the calibration, at the shipped
examples' micro-batch size; the real router's per-expert rows feed the prediction. Reported per op:
measured forward and backward, predicted (as the cost model has it: roofline.work_time_s of each pass), the
prediction split into FLOP, memory and launch terms, and the number of ATen ops the op dispatched
(the kernels a per-op overhead is paid for) next to flops.py's num_kernels. The measuring is
piper_sim.torch_backend.bench.check (measure_ops); this module prices and compares, and must not import torch.
"""

from __future__ import annotations

import statistics

import yaml

from piper_sim.calibrate.sweep import DEFAULT_PRESETS
from piper_sim.workload.cost import TaskCoster
from piper_sim.workload.flops import op_work
from piper_sim.workload.presets import load_model
from piper_sim.workload.profile import DeviceProfile
from piper_sim.workload.profile_file import profile_path
from piper_sim.workload.profile_load import load_profile
from piper_sim.workload.roofline import gemm_time_s, memory_bound_s, work_time_s
from piper_sim.workload.task_kinds import TaskKind


def predict(
    profile: DeviceProfile,
    model_name: str,
    op: str,
    tokens: int,
    expert_rows: tuple[int, ...],
    dtype_bytes: int | None = None,
) -> dict:
    """The cost model's forward time of one op, and its parts."""
    spec = load_model(model_name)
    b = spec.dtype_bytes if dtype_bytes is None else dtype_bytes
    work = op_work(spec, op, tokens, expert_rows)
    gemm = sum(gemm_time_s(profile, g, b) for g in work.gemms)
    attention = (
        work.attention_flops / (profile.peak_flops_per_s * profile.attention_efficiency(work.attention_seq_len))
        if work.attention_flops
        else 0.0
    )
    memory = memory_bound_s(profile, work.traffic)
    launch = work.num_kernels * profile.kernel_launch_s
    return {
        "total_s": work_time_s(profile, work, b),
        "backward_s": work_time_s(profile, work, b, kind=TaskKind.BACKWARD),
        "gemm_s": gemm,
        "attention_s": attention,
        "memory_s": memory,
        "launch_s": launch,
        "num_kernels": work.num_kernels,
        "dtype_bytes": b,
    }


def simulator_s(
    profile: DeviceProfile, model_name: str, op: str, tokens: int, expert_rows: tuple[int, ...]
) -> tuple[float, float]:
    """Forward and backward seconds of one op as the simulator prices it (TaskCoster)."""
    return TaskCoster(load_model(model_name), profile, tokens).op_s(op, expert_rows)


def _measurements(profile_spec: str) -> dict:
    return yaml.safe_load(profile_path(profile_spec).read_text()).get("measurements") or {}


def _view_overhead_s(measurements: dict) -> float:
    """Per-view fixed cost from the profile's measurements (autograd view/transpose), else 0."""
    tiny = measurements.get("per_op_overhead", {}).get("autograd", {})
    views = [tiny[k] for k in ("view_us", "transpose_us") if k in tiny]
    return 1e-6 * sum(views) / len(views) if views else 0.0


def _framework_s(measurements: dict, direction: str, aten_ops: int) -> float | None:
    """Fixed cost of an op that dispatches aten_ops ATen ops, from the micro-model fit (None without one)."""
    fw = (measurements.get("framework_overhead") or {}).get(direction)
    return None if not fw else 1e-6 * (fw["per_op_us"] + fw["per_aten_op_us"] * aten_ops)


def crosscheck(
    profile_spec: str,
    *,
    presets: tuple[str, ...] = DEFAULT_PRESETS,
    ranks: int = 1,
    timeout_s: float = 1800.0,
    threads: int | None = None,
) -> list[dict]:
    """Measured vs predicted per op (medians over ranks). Each row also carries the prediction with the
    counted ATen ops in place of flops.py's num_kernels (kernels x kernel_launch + views x view cost;
    backward: the backward's work terms plus its own counted ops)."""
    from piper_sim.torch_backend.bench.check import measure_ops  # torch: loaded only when measuring

    profile = load_profile(profile_spec)
    measurements = _measurements(profile_spec)
    view_s = _view_overhead_s(measurements)
    per_rank = measure_ops(profile_spec, presets, ranks, timeout_s, threads)
    out = []
    for i, row in enumerate(per_rank[0]):
        fwd = statistics.median(p[i]["fwd_s"] for p in per_rank)
        bwd = statistics.median(p[i]["bwd_s"] for p in per_rank)
        pred = predict(profile, row["model"], row["op"], row["tokens"], tuple(row["expert_rows"]))
        work_s = pred["total_s"] - pred["launch_s"]
        launch = profile.kernel_launch_s
        counted_fwd = work_s + row["fwd_kernels"] * launch + row["fwd_views"] * view_s
        bwd_work_s = pred["backward_s"] - 2 * pred["launch_s"]  # a backward pays its forward's launches twice
        counted_bwd = bwd_work_s + row["bwd_kernels"] * launch + row["bwd_views"] * view_s
        fw_fwd = _framework_s(measurements, "forward", row["fwd_kernels"] + row["fwd_views"])
        fw_bwd = _framework_s(measurements, "backward", row["bwd_kernels"] + row["bwd_views"])
        sim_fwd, sim_bwd = simulator_s(profile, row["model"], row["op"], row["tokens"], tuple(row["expert_rows"]))
        out.append(
            {
                **row,
                "fwd_s": fwd,
                "bwd_s": bwd,
                "pred": pred,
                "view_s": view_s,
                "simulator_fwd_s": sim_fwd,
                "simulator_bwd_s": sim_bwd,
                "counted_fwd_s": counted_fwd,
                "counted_bwd_s": counted_bwd,
                "framework_fwd_s": None if fw_fwd is None else work_s + fw_fwd,
                "framework_bwd_s": None if fw_bwd is None else bwd_work_s + fw_bwd,
            }
        )
    return out


def _err(pred: float, meas: float) -> str:
    return f"{100 * (pred - meas) / meas:+.0f}%" if meas > 0 else "n/a"


def format_table(rows: list[dict]) -> str:
    """Markdown tables (microseconds): the bare cost model, with the counted ATen ops, with the fitted
    framework overhead, and as the simulator prices each op."""
    lines = [
        "As the cost model is (flops.py num_kernels x kernel_launch; the backward as work_time_s prices it):",
        "",
        "| model | op | measured fwd | predicted fwd | error | parts: gemm+attn / memory / launch "
        "| measured bwd | predicted bwd | error |",
        "|" + "---|" * 9,
    ]
    for r in rows:
        p = r["pred"]
        parts = f"{(p['gemm_s'] + p['attention_s']) * 1e6:.1f} / {p['memory_s'] * 1e6:.1f} / {p['launch_s'] * 1e6:.1f}"
        lines.append(
            f"| {r['model']} | {r['op']} | {r['fwd_s'] * 1e6:.1f} | {p['total_s'] * 1e6:.1f} | "
            f"{_err(p['total_s'], r['fwd_s'])} | {parts} | {r['bwd_s'] * 1e6:.1f} | "
            f"{p['backward_s'] * 1e6:.1f} | {_err(p['backward_s'], r['bwd_s'])} |"
        )
    lines += [
        "",
        "With the ATen ops each op really dispatches (kernels x kernel_launch + views x view cost):",
        "",
        "| model | op | kernels flops.py / ATen fwd (+views) | predicted fwd | error "
        "| ATen bwd kernels (+views) | predicted bwd | error |",
        "|" + "---|" * 8,
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['op']} | {r['pred']['num_kernels']} / {r['fwd_kernels']} "
            f"(+{r['fwd_views']}) | {r['counted_fwd_s'] * 1e6:.1f} | {_err(r['counted_fwd_s'], r['fwd_s'])} | "
            f"{r['bwd_kernels']} (+{r['bwd_views']}) | {r['counted_bwd_s'] * 1e6:.1f} | "
            f"{_err(r['counted_bwd_s'], r['bwd_s'])} |"
        )
    if all(r["framework_fwd_s"] is not None for r in rows):
        lines += [
            "",
            "Work terms + the framework overhead fitted on the micro model (per op + per ATen op):",
            "",
            "| model | op | measured fwd | predicted fwd | error | measured bwd | predicted bwd | error |",
            "|" + "---|" * 8,
        ]
        for r in rows:
            lines.append(
                f"| {r['model']} | {r['op']} | {r['fwd_s'] * 1e6:.1f} | {r['framework_fwd_s'] * 1e6:.1f} | "
                f"{_err(r['framework_fwd_s'], r['fwd_s'])} | {r['bwd_s'] * 1e6:.1f} | "
                f"{r['framework_bwd_s'] * 1e6:.1f} | {_err(r['framework_bwd_s'], r['bwd_s'])} |"
            )
    lines += [
        "",
        "As the simulator prices it (TaskCoster: the profile's framework cost at the op's tokens + work):",
        "",
        "| model | op | measured fwd | simulator fwd | error | measured bwd | simulator bwd | error |",
        "|" + "---|" * 8,
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['op']} | {r['fwd_s'] * 1e6:.1f} | {r['simulator_fwd_s'] * 1e6:.1f} | "
            f"{_err(r['simulator_fwd_s'], r['fwd_s'])} | {r['bwd_s'] * 1e6:.1f} | "
            f"{r['simulator_bwd_s'] * 1e6:.1f} | {_err(r['simulator_bwd_s'], r['bwd_s'])} |"
        )
    return "\n".join(lines)
