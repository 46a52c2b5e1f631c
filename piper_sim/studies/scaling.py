"""`piper-sim study scaling MODEL --gpus 64,...,1024 (--strong | --weak KEY=V1,...)`: the planner's best plan at
each GPU count, and the scaling curves.

Owns the points of a scaling study (strong: one model and global batch at every count; weak: the model key
given takes its i-th value at the i-th count and the global batch grows with the GPUs), running the planner
at each (its simulations on the shared store, so a rerun recomputes nothing), the table and the plots of
TFLOPS/GPU, MFU and scaling efficiency against GPUs. Efficiency: weak, TFLOPS/GPU over the first point's;
strong, (throughput / GPUs) over the first point's. Must not import torch.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import yaml  # noqa: E402

from piper_sim.analysis import style  # noqa: E402
from piper_sim.analysis.tables import Col, render  # noqa: E402
from piper_sim.bounds import GPUS_LIMIT  # noqa: E402
from piper_sim.errors import ConfigError  # noqa: E402
from piper_sim.machine import Machine  # noqa: E402
from piper_sim.planning.planner import PlanRequest, plan  # noqa: E402
from piper_sim.workload.model import ModelSpec  # noqa: E402


def parse_counts(text: str) -> list[int]:
    try:
        counts = [int(v) for v in text.split(",")]
    except ValueError:
        raise ConfigError("--gpus", text, "comma-separated positive integers, e.g. 64,128,256") from None
    if not counts or any(not 0 < c <= GPUS_LIMIT for c in counts):
        raise ConfigError("--gpus", text, f"comma-separated integers from 1 to {GPUS_LIMIT:,}, e.g. 64,128,256")
    return counts


def scaling_requests(
    base: PlanRequest, counts: list[int], *, weak: str | None, sequences_per_gpu: int | None
) -> list[PlanRequest]:
    """One planner request per GPU count."""
    if weak is None:
        return [replace(base, num_gpus=n) for n in counts]
    key, sep, values = weak.partition("=")
    if not sep or not key.startswith("model.") or not values:
        raise ConfigError("--weak", weak, "model.KEY=V1,V2,... (one value per GPU count)")
    vals = values.split(",")
    if len(vals) != len(counts):
        raise ConfigError("--weak", weak, f"{len(counts)} values, one per GPU count ({','.join(map(str, counts))})")
    if sequences_per_gpu is None or sequences_per_gpu <= 0:
        raise ConfigError("--sequences-per-gpu", sequences_per_gpu, "a positive integer (weak scaling)")
    model = base.model if isinstance(base.model, dict) else {"preset": base.model}
    field = key.removeprefix("model.")
    return [
        replace(base, num_gpus=n, global_batch=sequences_per_gpu * n, model={**model, field: yaml.safe_load(v)})
        for n, v in zip(counts, vals, strict=True)
    ]


def run_scaling(
    requests: list[PlanRequest],
    out: Path,
    *,
    weak: bool,
    machine: Machine | None = None,
    scheduler: str | None = None,
    workers: int | None = None,
    progress: bool = True,
) -> pd.DataFrame:
    """The scaling study: scaling.csv and scaling.png under out; returns the table as written, with model_label
    (the model each point built, by what it is) added for the printed table. machine: the first request's, where
    the caller built it (each other count's is built by its plan)."""
    rows, labels = [], []
    for i, request in enumerate(requests):
        if progress:
            print(f"[{i + 1}/{len(requests)}] planning on {request.num_gpus} GPUs ...", file=sys.stderr)
        result = plan(
            request,
            out / "store",
            machine=machine if i == 0 else None,
            scheduler=scheduler,
            workers=workers,
            progress=progress,
        )
        labels.append(model_label(request.model, result.model))
        best = result.best
        if best is None:
            rows.append({"gpus": request.num_gpus, "plan": "no plan fits", "fits": False})
            continue
        refined = bool(best["refined"])
        rows.append(
            {
                "gpus": request.num_gpus,
                "model": result.model.name,
                "params_b": result.model.total_params() / 1e9,
                "global_batch": request.global_batch,
                "plan": best["label"],
                "fits": True,
                "refined": refined,
                "step_time_s": best["step_time_s"],
                "tflops_per_gpu": best["sim_tflops_per_gpu"] if refined else best["est_tflops_per_gpu"],
                "mfu": best["sim_mfu"] if refined else best["est_mfu"],
                "tokens_per_s": request.global_batch * result.model.seq_len / best["step_time_s"],
                "peak_memory_bytes": best["peak_memory_bytes"],
                "candidates": len(result.table),
            }
        )
    table = pd.DataFrame(rows)
    fit = table[table["fits"]]
    if not fit.empty:
        first = fit.iloc[0]
        per_gpu = table["tokens_per_s"] / table["gpus"]
        table["scaling_efficiency"] = (
            table["tflops_per_gpu"] / first["tflops_per_gpu"]
            if weak
            else per_gpu / (first["tokens_per_s"] / first["gpus"])
        )
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "scaling.csv", index=False)
    table["model_label"] = labels
    plot_scaling(table, out / "scaling.png", weak, style.context(machine=style.machine_label(requests[0].topology)))
    return table


SHORT_KEYS = {
    "num_experts": "E",
    "top_k": "top",
    "num_layers": "L",
    "d_model": "d",
    "expert_ffn_dim": "dffn",
    "seq_len": "seq",
    "num_shared_experts": "shared",
}


def model_label(section: str | dict, model: ModelSpec) -> str:
    """The model a point built, by what it is: its preset and the keys set over it, and its total parameters,
    e.g. "weak-110b E128 (863B)" (not the preset's name alone when keys change its size)."""
    keys = {k: v for k, v in section.items() if k != "preset"} if isinstance(section, dict) else {}
    changes = " ".join(f"{SHORT_KEYS[k]}{v}" if k in SHORT_KEYS else f"{k}={v}" for k, v in keys.items())
    return f"{model.name}{' ' + changes if changes else ''} ({params_text(model.total_params())})"


def params_text(params: float) -> str:
    """Parameters in M, B or T: 4.2M, 10.9B, 111B, 1.70T."""
    billions = params / 1e9
    if billions < 1:
        return f"{params / 1e6:.1f}M"
    if billions >= 1000:
        return f"{billions / 1000:.2f}T"
    return f"{billions:.1f}B" if billions < 100 else f"{billions:.0f}B"


SCALING_COLUMNS = [
    Col("gpus", "GPUs", "count"),
    Col("model_label", "model"),
    Col("global_batch", "batch (seqs)", "count"),
    Col("plan", "plan"),
    Col("tier", "tier"),
    Col("step_time_s", "step", "time"),
    Col("tflops_per_gpu", "TFLOPS/GPU", "TFLOPS"),
    Col("mfu", "MFU", "%"),
    Col("tokens_per_s", "tokens/s", "count"),
    Col("peak_memory_bytes", "peak memory", "GiB"),
    Col("scaling_efficiency", "efficiency", "%"),
    Col("candidates", "plans considered", "count"),
]


def scaling_text(table: pd.DataFrame) -> str:
    """The printed table of a scaling study (analysis/tables.py); tier: how the point's step was priced."""
    rows = [
        {**r, "tier": "" if not r.get("fits") else "simulated" if r.get("refined") else "estimated"}
        for r in table.to_dict("records")
    ]
    return render(rows, SCALING_COLUMNS)


def plot_scaling(table: pd.DataFrame, path: Path, weak: bool, context_line: str = "") -> None:
    fig = scaling_figure(table, weak, context_line)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def scaling_figure(table: pd.DataFrame, weak: bool, context_line: str = "") -> plt.Figure:
    """TFLOPS/GPU, MFU and scaling efficiency against GPUs, from 0; simulated and estimated points marked apart."""
    t = table[table["fits"]] if "fits" in table else table
    tiers = t["refined"].map({True: "des", False: "estimate"}) if "refined" in t else pd.Series(dtype=str)
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.2))
    for ax, column, label, scale in (
        (axes[0], "tflops_per_gpu", "TFLOPS per GPU", 1.0),
        (axes[1], "mfu", "MFU (%)", 100.0),
        (axes[2], "scaling_efficiency", "scaling efficiency (%)", 100.0),
    ):
        if column in t:
            ax.plot(t["gpus"], t[column] * scale, "-", color="0.6", lw=1)
            for tier in dict.fromkeys(tiers):
                sel = tiers == tier
                ax.plot(
                    t.loc[sel, "gpus"],
                    t.loc[sel, column] * scale,
                    style.TIER_MARKERS[tier],
                    color="tab:blue",
                    label=style.TIER_WORDS[tier],
                )
            style.from_zero(ax)
        style.count_axis(ax, list(t["gpus"]))
        if weak and "model_label" in t:
            ax.set_xticks(
                list(t["gpus"]), [f"{g:,}\n{m}" for g, m in zip(t["gpus"], t["model_label"], strict=True)], fontsize=7
            )
        ax.set_xlabel("GPUs" + (" (model built at each count)" if weak else ""))
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    if len(tiers):
        axes[0].legend(fontsize=7, loc="lower left")
    scope = "weak" if weak else "strong"
    model = t["model_label"].iloc[0] if "model_label" in t and len(t) and not weak else None
    tier = tiers.iloc[0] if tiers.nunique() == 1 else "simulated and estimated points" if len(tiers) else None
    style.suptitle(
        fig,
        f"{scope} scaling: the planner's best plan at each GPU count (predictions, not measurements)",
        style.context(model, context_line, tier),
    )
    fig.tight_layout()
    return fig
