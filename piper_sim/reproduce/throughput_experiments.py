"""The throughput experiments of `piper-sim reproduce`: planned full-model throughput, Piper's plans against X-MoE's own
configuration, and weak scaling to 1.7T parameters. All on Frontier (MI250X profile), plans chosen by the planner;
nothing is tuned per experiment.

Owns their points (quick and full) and report sections, each with the figure its claim in reproduce/claims.yaml
is checked on (Dash and Wang 2026, arXiv 2605.05049), and the settings the training experiments share (SEQ,
GLOBAL_BATCH). training_experiments.py lists these experiments among its own, in the paper's order.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from piper_sim.analysis import style
from piper_sim.paths import data_dir
from piper_sim.reproduce.experiment import Experiment, Section, figure
from piper_sim.validation.published import load_published, measured_step_s

GIB = 2**30
SEQ = 4096
GLOBAL_BATCH = 1024  # sequences per step (the X-MoE comparison's batch)
FRONTIER = {"topology": "frontier", "profile": "mi250x"}


def _plan_payload(name: str, model, gpus: int, global_batch: int, top_k: int, seq_len: int | None = SEQ) -> dict:
    request = {
        "model": model,
        "num_gpus": gpus,
        "global_batch": global_batch,
        "seq_len": seq_len,
        "top_k": top_k,
        **FRONTIER,
    }
    return {"kind": "plan", "name": name, "request": request}


# ---- models ----------------------------------------------------------------------------------------------
MODEL_RUNS = (
    ("mixtral-8x7b", 64),
    ("mixtral-8x22b", 256),
    ("llama4-scout", 128),
    ("llama4-maverick", 512),
    ("deepseek-v2", 256),
)


def models_points(quick: bool) -> list[dict]:
    return [_plan_payload(name, name, n, GLOBAL_BATCH, 0 if quick else 2) for name, n in MODEL_RUNS]


def _plan_table(results: list[tuple[dict, dict]]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "model": p["name"],
                "GCDs": p["request"]["num_gpus"],
                "plan": r.get("plan", "none fits"),
                "tier": r.get("tier", ""),
                "TFLOPS/GCD": r.get("tflops_per_gpu", float("nan")),
                "MFU %": 100 * r.get("mfu", float("nan")),
                "peak GiB": r.get("peak_memory_bytes", float("nan")) / GIB,
            }
            for p, r in results
        ]
    )


def models_section(results: list[tuple[dict, dict]], out: Path) -> Section:
    table = _plan_table(results)
    plot = figure(out, "models", lambda ax: _bar(ax, table, "TFLOPS/GCD", "Planned full-model throughput"))
    return Section(
        table=table,
        plot=plot,
        prediction=", ".join(
            f"{m} {t:.0f} TFLOPS/GCD ({g} GCDs)"
            for m, t, g in zip(table["model"], table["TFLOPS/GCD"], table["GCDs"], strict=True)
        )
        + ".",
        mechanism="The planner keeps plans whose stage-0 memory fits (recomputation and ZeRO where needed), EP "
        "inside a switch, and ranks them by the estimated step: compute at the profile's efficiency for "
        "each GEMM's shape, the pipeline bubble, and the blocking all-to-alls.",
        notes=f"Sequence {SEQ}, global batch {GLOBAL_BATCH} sequences; GCD counts chosen here. tier: DES "
        "(simulated) or estimate.",
    )


def _bar(ax, table: pd.DataFrame, column: str, title: str) -> None:
    ax.bar(table["model"], table[column])
    ax.set_xlabel("model")
    ax.set_ylabel(column)
    style.title(ax, title, style.context(None, "frontier", None, "the planner's plans, simulated or estimated (tier)"))
    ax.tick_params(axis="x", rotation=30, labelsize=8)


# ---- vs-xmoe ---------------------------------------------------------------------------------------------
XMOE = (("x-moe-small", 8, 256), ("x-moe-medium", 32, 256), ("x-moe-large", 80, 256), ("x-moe-super", 512, 1024))
# X-MoE's own runs on 256 GCDs as `validate --published` scores them (validation/published/NAME.yaml); Super has no
# published run in the set and takes the Large's (same hidden size and experts) plan rule on 1024 GCDs
XMOE_RUNS = {
    "x-moe-small": "xmoe2025-small-frontier-256gcd",
    "x-moe-medium": "xmoe2025-medium-frontier-256gcd",
    "x-moe-large": "xmoe2025-large-frontier-256gcd",
    "x-moe-super": "xmoe2025-large-frontier-256gcd",
}


def baseline_config(model: str, gpus: int) -> tuple[dict, float | None]:
    """The X-MoE configuration of this model on `gpus` GCDs and the step time X-MoE measured where it published one.

    It is the config `validate --published` scores for X-MoE's run of the model (profile mi250x-xmoe, the RCCL
    all-to-all and all-reduce, no recomputation, X-MoE's launch script's plan); a model or GCD count without its own
    published run takes that run's config with the model swapped and the data-parallel degree and micro-batches
    scaled to the GCDs at the same global batch."""
    run = load_published(data_dir("validation") / "published" / f"{XMOE_RUNS[model]}.yaml")
    config = {**run.config, "model": {**run.config["model"], "preset": model}}
    if run.config["model"]["preset"] == model and int(run.measured["num_gpus"]) == gpus:
        return config, measured_step_s(run)
    par = dict(config["parallel"])
    per_replica = par["tp"] * par.get("pp", 1)
    batch = int(run.measured["global_batch"])
    par["dp"] = gpus // per_replica
    par["num_microbatches"] = max(1, batch // (par["dp"] * par["micro_batch_size"]))
    return {**config, "parallel": par}, None


def xmoe_points(quick: bool) -> list[dict]:
    out = []
    for model, piper_gpus, base_gpus in XMOE:
        config, measured = baseline_config(model, base_gpus)
        out.append(
            {**_plan_payload(model, model, piper_gpus, GLOBAL_BATCH, 0 if quick else 2, seq_len=None), "side": "piper"}
        )
        out.append(
            {
                "kind": "estimate" if quick else "simulate",
                "name": model,
                "side": "x-moe",
                "config": config,
                "measured_step_s": measured,
            }
        )
    return out


def xmoe_section(results: list[tuple[dict, dict]], out: Path) -> Section:
    piper = {p["name"]: (p, r) for p, r in results if p["side"] == "piper"}
    base = {p["name"]: (p, r) for p, r in results if p["side"] == "x-moe"}
    rows = []
    for model, (pp_, pr) in piper.items():
        bp, br = base[model]
        par, measured = bp["config"]["parallel"], bp.get("measured_step_s")
        rows.append(
            {
                "model": model,
                "Piper GCDs": pp_["request"]["num_gpus"],
                "Piper plan": pr.get("plan", "none fits"),
                "Piper MFU %": 100 * pr.get("mfu", float("nan")),
                "X-MoE GCDs": par["tp"] * par["dp"],
                "X-MoE plan": f"tp{par['tp']} ep{par['ep']} dp{par['dp']} z1 rccl",
                "X-MoE MFU %": 100 * br["mfu"],
                "X-MoE fits": br["fits_memory"],
                # the same model FLOPs over the step X-MoE measured (its published run; blank without one)
                "X-MoE measured MFU %": 100 * br["mfu"] * br["step_time_s"] / measured if measured else float("nan"),
                "X-MoE all-to-all %": 100 * br["all_to_all_fraction"],
            }
        )
    table = pd.DataFrame(rows)
    table["MFU ratio"] = table["Piper MFU %"] / table["X-MoE MFU %"]
    table["ratio to measured X-MoE"] = table["Piper MFU %"] / table["X-MoE measured MFU %"]
    ratio = table["MFU ratio"]
    optimism = (table["X-MoE MFU %"] / table["X-MoE measured MFU %"]).dropna()
    plot = figure(out, "vs-xmoe", lambda ax: _bar(ax, table, "MFU ratio", "Piper-style plan over X-MoE's MFU (x)"))
    return Section(
        table=table,
        plot=plot,
        figures={"piper_over_xmoe_mfu": (float(ratio.min()), float(ratio.max()))},
        prediction=f"Piper-style MFU over X-MoE's configuration: {ratio.min():.2f} to {ratio.max():.2f}x; over "
        f"X-MoE's measured runs: {table['ratio to measured X-MoE'].min():.2f} to "
        f"{table['ratio to measured X-MoE'].max():.2f}x.",
        mechanism="X-MoE's EP groups of 64 GCDs (Medium, Large) span 8 nodes, so each MoE layer's four all-to-alls "
        "cross the NICs through RCCL's per-peer rounds and block compute; Piper's plans keep EP inside a "
        "node or switch and pipeline the layers, trading a bubble for local all-to-alls.",
        versus_paper="Two mechanisms move the ratio. The X-MoE side is predicted faster than X-MoE measured "
        f"({optimism.min():.2f} to {optimism.max():.2f}x its measured MFU where it published a run; "
        "validate --published scores the same configs), which shrinks the ratio against the paper's "
        "measured one; and the Piper side is priced with the mi250x profile (best-of-search GEMMs) "
        "while X-MoE's side takes mi250x-xmoe (its stack's GEMMs at about 60% of peak and its gate and "
        "gather kernels), which widens it: a part of any ratio here is the software stack, not the plan."
        if len(optimism)
        else "",
        notes="Piper: the planner's choice at global batch 1024 (tier as in models). X-MoE: the configuration "
        "validate --published scores for X-MoE's run of the model on 256 GCDs (validation/published), "
        "simulated (estimated with --quick); Super, without a published run, takes the Large's plan rule on "
        "1024 GCDs.",
    )


# ---- weak-scaling ----------------------------------------------------------------------------------------
WEAK = ((64, 16), (128, 32), (256, 64), (512, 128), (1024, 256))
SEQUENCES_PER_GCD = 4


def weak_points(quick: bool) -> list[dict]:
    runs = (WEAK[0], WEAK[3], WEAK[4]) if quick else WEAK
    return [
        _plan_payload(f"E{e}", {"preset": "weak-110b", "num_experts": e}, n, SEQUENCES_PER_GCD * n, 0 if quick else 1)
        for n, e in runs
    ]


def weak_section(results: list[tuple[dict, dict]], out: Path) -> Section:
    table = _plan_table(results).rename(columns={"model": "experts"})
    table["efficiency %"] = 100 * table["TFLOPS/GCD"] / table["TFLOPS/GCD"].iloc[0]
    plot = figure(out, "weak-scaling", lambda ax: _weak_plot(ax, table))
    efficiency = float(table["efficiency %"].iloc[-1]) / 100
    return Section(
        table=table,
        plot=plot,
        figures={"weak_scaling_efficiency": (efficiency, efficiency)},
        versus_paper=_weak_versus_paper(table),
        prediction=f"Weak-scaling efficiency from {table['GCDs'].iloc[0]} to {table['GCDs'].iloc[-1]} GCDs: "
        f"{table['efficiency %'].iloc[-1]:.1f}% ({table['TFLOPS/GCD'].iloc[-1]:.1f} TFLOPS/GCD).",
        mechanism="With more experts per layer each expert keeps its rows (tokens x k / E per GCD stays), but the "
        "planner needs deeper pipelines or wider EP groups to fit the larger model: bubbles and "
        "all-to-alls over more nodes cost the efficiency.",
        notes=f"d 5120, d_ffn 20480, 32 layers, top-2; {SEQUENCES_PER_GCD} sequences of {SEQ} per GCD per step.",
    )


def _weak_versus_paper(table: pd.DataFrame) -> str:
    first, last = table.iloc[0], table.iloc[-1]
    return (
        f"The planner's plan on {first['GCDs']} GCDs ({first['plan']}, {first['tier']}) gives "
        f"{first['TFLOPS/GCD']:.1f} TFLOPS/GCD and on {last['GCDs']} ({last['plan']}, {last['tier']}) "
        f"{last['TFLOPS/GCD']:.1f}: the larger model needs a deeper pipeline or wider EP groups to fit its "
        "stage-0 memory, so its bubble grows and its all-to-alls leave the node; efficiency is taken against "
        "the smallest run as predicted here, not against the paper's base run, so an optimistic base (the "
        "MI250X runs validate --published scores are predicted fast) lowers it."
    )


def _weak_plot(ax, table: pd.DataFrame) -> None:
    ax.plot(table["GCDs"], table["TFLOPS/GCD"], "-", color="0.6", lw=1)
    for tier, rows in table.groupby("tier", sort=False):
        ax.plot(
            rows["GCDs"],
            rows["TFLOPS/GCD"],
            style.TIER_MARKERS.get(tier.lower(), "o"),
            color="tab:blue",
            label=style.TIER_WORDS.get(tier.lower(), tier),
        )
    style.count_axis(ax, list(table["GCDs"]))
    style.from_zero(ax)
    ax.set_xlabel("GCDs")
    ax.set_ylabel("TFLOPS per GCD")
    style.title(ax, "Weak scaling of the 110B to 1.7T family (predictions)", style.context(None, "frontier"))
    ax.legend(loc="lower left", fontsize=8)


EXPERIMENTS = [
    Experiment(
        name="models", title="Planned full-model training throughput", points=models_points, section=models_section
    ),
    Experiment(
        name="vs-xmoe", title="Piper's plans against the X-MoE configuration", points=xmoe_points, section=xmoe_section
    ),
    Experiment(
        name="weak-scaling",
        title="Weak scaling to 1.7T parameters on 1024 GCDs",
        points=weak_points,
        section=weak_section,
    ),
]
