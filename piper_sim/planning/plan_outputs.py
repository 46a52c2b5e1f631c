"""The files and the terminal table of `piper-sim plan`: plans.parquet, plans.csv, best.yaml, pareto.png, why.md.

Owns how a PlanResult is shown. Must not import torch.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import yaml  # noqa: E402

from piper_sim.analysis import style  # noqa: E402
from piper_sim.analysis.tables import Col, render  # noqa: E402
from piper_sim.planning.plan_point import PlanPoint  # noqa: E402
from piper_sim.planning.planner import PlanResult  # noqa: E402
from piper_sim.workload.parallel import megatron_degrees  # noqa: E402
from piper_sim.workload.recompute import Recompute  # noqa: E402

GIB = 2.0**30
WHY_TOP = 5


def megatron_label(row: pd.Series | dict) -> str:
    """A plan as Megatron-core's flags count it (TP, PP, EP, ETP, DP = GPUs / (TP x PP), VPP; sequence parallelism,
    micro and global batch), then the schedule, all-to-all, recomputation and ZeRO stage as the plan's label."""
    point = PlanPoint(**{k: _plain(row[k]) for k in PlanPoint.__dataclass_fields__})
    degrees = megatron_degrees(point.parallel)
    extra = (f" rc-{point.recompute}" if point.recompute != Recompute.NONE else "") + point.sharding_label()
    return (
        " ".join(f"{k}{v}" for k, v in degrees.items() if k != "EDP")
        + (" SP" if point.sp else "")
        + f" MBS{point.micro_batch_size} GBS{point.parallel.sequences_per_step} {point.schedule} "
        f"{point.all_to_all}{' overlapped' if point.overlap_all_to_all else ''}{extra}"
    )


def _plain(value: object) -> object:
    return value.item() if hasattr(value, "item") else value


def labelled(table: pd.DataFrame, convention: str = "piper") -> pd.DataFrame:
    """The plans table with a `megatron` column (each plan's Megatron label) under convention megatron."""
    if convention != "megatron" or table.empty:
        return table
    return table.assign(megatron=[megatron_label(row) for _, row in table.iterrows()])


def write_plan(out: Path, result: PlanResult, convention: str = "piper") -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "parquet": out / "plans.parquet",
        "csv": out / "plans.csv",
        "best": out / "best.yaml",
        "pareto": out / "pareto.png",
        "why": out / "why.md",
    }
    table = labelled(result.table, convention)
    table.to_parquet(paths["parquet"], index=False)
    table.to_csv(paths["csv"], index=False)
    if result.best is not None:
        header = (
            f"# The plan `piper-sim plan` chose for {result.model.name} on {result.request.num_gpus} GPUs "
            f"(global batch {result.request.global_batch}); run it with `piper-sim simulate best.yaml`.\n"
        )
        paths["best"].write_text(header + yaml.safe_dump(result.best_config(), sort_keys=False))
    else:
        paths.pop("best")
    plot_pareto(result, paths["pareto"])
    paths["why"].write_text(why_markdown(result))
    return paths


def mfu_column(table: pd.DataFrame) -> pd.Series:
    return table["sim_mfu"].fillna(table["est_mfu"]) if "sim_mfu" in table else table["est_mfu"]


def plot_pareto(result: PlanResult, path: Path) -> None:
    t = result.table
    mfu = mfu_column(t) * 100
    fig, ax = plt.subplots(figsize=(7, 4.5))
    bad = ~t["fits"]
    ax.scatter(t.loc[bad, "peak_memory_bytes"] / GIB, mfu[bad], c="0.75", s=12, label="does not fit")
    ok = t["fits"] & ~t["refined"]
    ax.scatter(t.loc[ok, "peak_memory_bytes"] / GIB, mfu[ok], c="tab:blue", s=14, label="fits (estimated)")
    ref = t["refined"]
    ax.scatter(t.loc[ref, "peak_memory_bytes"] / GIB, mfu[ref], c="tab:orange", s=24, label="fits (simulated)")
    usable = (result.hbm_bytes - result.reserve_bytes) / GIB
    ax.axvline(usable, color="tab:red", ls="--", lw=1, label=f"usable HBM {usable:.1f} GiB")
    if result.best is not None:
        b = result.best
        ax.scatter(
            [b["peak_memory_bytes"] / GIB],
            [mfu.loc[b.name]],
            marker="*",
            s=160,
            c="tab:green",
            label="chosen",
            zorder=5,
        )
    ax.set_xlabel("peak memory per GPU (GiB, worst stage)")
    ax.set_ylabel("MFU (%)")
    style.title(
        ax,
        "MFU against peak memory, every candidate plan",
        style.context(
            result.model.name,
            style.machine_label(result.request.topology, result.request.num_gpus),
            None,
            "estimated; refined plans simulated",
        ),
    )
    ax.legend(fontsize=8, loc="best", framealpha=0.8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def why_markdown(result: PlanResult) -> str:
    """For the top plans: the terms that separate them (bubble, exposed all-to-all, p2p, memory headroom)."""
    t = result.table
    top = t[t["fits"]].head(WHY_TOP)
    usable = (result.hbm_bytes - result.reserve_bytes) / GIB
    lines = [
        f"# Why this plan: {result.model.name} on {result.request.num_gpus} GPUs",
        "",
        f"{len(t)} candidates, {int(t['fits'].sum())} fit in {usable:.1f} GiB usable per GPU "
        f"({result.hbm_bytes / GIB:.1f} GiB HBM less a {result.reserve_bytes / GIB:.1f} GiB reserve). "
        "Estimated terms per step (analytic tier); simulated step time where refined.",
        "",
    ]
    if top.empty:
        lines.append(
            "No plan fits. Closest: "
            + ", ".join(
                f"{r.label} ({r.why_not})"
                for r in t.sort_values("memory_headroom_bytes", ascending=False).head(3).itertuples()
            )
        )
        return "\n".join(lines) + "\n"
    lines += [
        "| rank | plan | step (s) | sim? | bubble (s) | all-to-all (s) | p2p (s) | grad reduce (s) | headroom (GiB) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in top.itertuples():
        lines.append(
            f"| {r.rank} | {r.label} | {r.step_time_s:.3f} | {'yes' if r.refined else 'no'} | "
            f"{r.est_bubble_s:.3f} | {r.est_all_to_all_s:.3f} | {r.est_p2p_s:.3f} | "
            f"{r.est_grad_reduce_s:.3f} | {r.memory_headroom_bytes / GIB:.1f} |"
        )
    best, rest = top.iloc[0], top.iloc[1:]
    lines.append("")
    for r in rest.itertuples():
        diffs = {
            "bubble": r.est_bubble_s - best["est_bubble_s"],
            "all-to-all": r.est_all_to_all_s - best["est_all_to_all_s"],
            "p2p": r.est_p2p_s - best["est_p2p_s"],
            "gradient reduction": r.est_grad_reduce_s - best["est_grad_reduce_s"],
            "compute": (r.est_pipeline_s - r.est_bubble_s - r.est_all_to_all_s - r.est_p2p_s)
            - (best["est_pipeline_s"] - best["est_bubble_s"] - best["est_all_to_all_s"] - best["est_p2p_s"]),
        }
        term, gap = max(diffs.items(), key=lambda kv: kv[1])
        lines.append(
            f"- rank {r.rank} ({r.label}) is {r.step_time_s - best['step_time_s']:+.3f} s per step behind; "
            f"the largest term against the chosen plan: {term} ({gap:+.3f} s)."
        )
    if not math.isnan(result.rank_correlation):
        lines.append(
            f"\nRank correlation of estimate and simulation on the refined plans: {result.rank_correlation:.2f}."
        )
    return "\n".join(lines) + "\n"


PLAN_COLUMNS = [
    Col("rank", "rank", "count"),
    Col("label", "plan"),
    Col("fits", "fits", "yes/no"),
    Col("peak_memory_bytes", "peak memory", "GiB"),
    Col("est_step_time_s", "estimated step", "time"),
    Col("sim_step_time_s", "simulated step", "time"),
    Col("tflops", "TFLOPS/GPU", "TFLOPS"),
    Col("mfu", "MFU", "%"),
]


def format_plan_table(result: PlanResult, rows: int = 10, convention: str = "piper") -> str:
    """The best plans (analysis/tables.py): simulated step where refined, TFLOPS and MFU of the tier that priced it;
    under convention megatron each plan is labelled with Megatron-core's flags."""
    t = labelled(result.table.head(rows), convention)
    if convention == "megatron":
        t = t.assign(label=t["megatron"])
    records = []
    for (_, r), mfu in zip(t.iterrows(), mfu_column(t), strict=True):
        refined = bool(r["refined"])
        records.append(
            {
                **r.to_dict(),
                "sim_step_time_s": r["sim_step_time_s"] if refined else None,
                "mfu": mfu,
                "tflops": r["sim_tflops_per_gpu"] if refined else r["est_tflops_per_gpu"],
            }
        )
    return render(records, PLAN_COLUMNS)
