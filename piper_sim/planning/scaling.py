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

from piper_sim.errors import ConfigError  # noqa: E402
from piper_sim.planning.planner import PlanRequest, plan  # noqa: E402


def parse_counts(text: str) -> list[int]:
    try:
        counts = [int(v) for v in text.split(",")]
    except ValueError:
        raise ConfigError("--gpus", text, "comma-separated positive integers, e.g. 64,128,256") from None
    if not counts or any(c <= 0 for c in counts):
        raise ConfigError("--gpus", text, "comma-separated positive integers, e.g. 64,128,256")
    return counts


def scaling_requests(base: PlanRequest, counts: list[int], *, weak: str | None, sequences_per_gpu: int | None
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
    return [replace(base, num_gpus=n, global_batch=sequences_per_gpu * n, model={**model, field: yaml.safe_load(v)})
            for n, v in zip(counts, vals, strict=True)]


def run_scaling(requests: list[PlanRequest], out: Path, *, weak: bool, scheduler: str | None = None,
                workers: int | None = None, progress: bool = True) -> pd.DataFrame:
    rows = []
    for i, request in enumerate(requests):
        if progress:
            print(f"[{i + 1}/{len(requests)}] planning on {request.num_gpus} GPUs ...", file=sys.stderr)
        result = plan(request, out / "store", scheduler=scheduler, workers=workers, progress=progress)
        best = result.best
        if best is None:
            rows.append({"gpus": request.num_gpus, "plan": "no plan fits", "fits": False})
            continue
        refined = bool(best["refined"])
        rows.append({"gpus": request.num_gpus, "model": result.model.name,
                     "params_b": result.model.total_params() / 1e9, "global_batch": request.global_batch,
                     "plan": best["label"], "fits": True, "refined": refined, "step_time_s": best["step_time_s"],
                     "tflops_per_gpu": best["sim_tflops_per_gpu"] if refined else best["est_tflops_per_gpu"],
                     "mfu": best["sim_mfu"] if refined else best["est_mfu"],
                     "tokens_per_s": request.global_batch * result.model.seq_len / best["step_time_s"],
                     "peak_memory_bytes": best["peak_memory_bytes"], "candidates": len(result.table)})
    table = pd.DataFrame(rows)
    fit = table[table["fits"]]
    if not fit.empty:
        first = fit.iloc[0]
        per_gpu = table["tokens_per_s"] / table["gpus"]
        table["scaling_efficiency"] = (table["tflops_per_gpu"] / first["tflops_per_gpu"] if weak
                                       else per_gpu / (first["tokens_per_s"] / first["gpus"]))
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "scaling.csv", index=False)
    plot_scaling(table, out / "scaling.png", weak)
    return table


def plot_scaling(table: pd.DataFrame, path: Path, weak: bool) -> None:
    t = table[table["fits"]] if "fits" in table else table
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for ax, column, label, scale in ((axes[0], "tflops_per_gpu", "TFLOPS per GPU", 1.0),
                                     (axes[1], "mfu", "MFU (%)", 100.0),
                                     (axes[2], "scaling_efficiency", "scaling efficiency (%)", 100.0)):
        if column in t:
            ax.plot(t["gpus"], t[column] * scale, "o-")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("GPUs")
        ax.set_ylabel(label)
        ax.set_xticks(list(t["gpus"]), [str(g) for g in t["gpus"]])
    fig.suptitle(f"{'weak' if weak else 'strong'} scaling: the planner's best plan at each GPU count")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
