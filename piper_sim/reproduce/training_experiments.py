"""The training experiments of `piper-sim reproduce`: memory feasibility, one MoE layer's ceiling and expert
migration under skew, and in EXPERIMENTS, in the paper's order between them, the throughput experiments
(throughput_experiments.py: planned full-model throughput, Piper's plans against X-MoE's, weak scaling). All on
Frontier (MI250X profile); nothing is tuned per experiment.

Owns their points (quick and full) and report sections, each with the figure its claim in reproduce/claims.yaml
is checked on (Dash and Wang 2026, arXiv 2605.05049).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from piper_sim.analysis import style
from piper_sim.reproduce import throughput_experiments
from piper_sim.reproduce.experiment import Experiment, Section, figure
from piper_sim.reproduce.throughput_experiments import GIB, GLOBAL_BATCH, SEQ
from piper_sim.workload.presets import load_model

HBM_LINE_GIB = 64  # a MI250X GCD's HBM


# ---- memory-map ------------------------------------------------------------------------------------
MEMORY_MODELS = (("x-moe-super", 512), ("weak-1.7t", 1024))


def memory_points(quick: bool) -> list[dict]:
    models = MEMORY_MODELS[:1] if quick else MEMORY_MODELS
    return [
        {"kind": "memory_map", "model": m, "gpus": n, "global_batch": GLOBAL_BATCH, "recompute": rc}
        for m, n in models
        for rc in ("none", "full")
    ]


def memory_section(results: list[tuple[dict, dict]], out: Path) -> Section:
    rows = [
        {"model": p["model"], "GCDs": p["gpus"], "recompute": p["recompute"], **c}
        for p, r in results
        for c in r["cells"]
    ]
    cells = pd.DataFrame(rows)
    cells["stage 0 GiB"] = cells.pop("stage0_bytes") / GIB
    summary = (
        cells.assign(fits=cells["stage 0 GiB"] <= HBM_LINE_GIB)
        .groupby(["model", "GCDs", "recompute"], sort=False)
        .agg(meshes=("fits", "size"), under_64_GiB=("fits", "sum"), least_GiB=("stage 0 GiB", "min"))
        .reset_index()
    )
    first = cells[cells["model"] == cells["model"].iloc[0]]
    plot = figure(out, "memory-map", lambda ax: _memory_plot(ax, first))
    piped = cells[cells["pp"] > 1]
    share = float((piped["peak_stage"] == 0).mean()) if len(piped) else float("nan")
    return Section(
        table=summary,
        plot=plot,
        figures={"stage0_peak_share": (share, share)},
        versus_paper=_memory_versus_paper(piped),
        prediction="; ".join(
            f"{r.model} on {r.GCDs} GCDs, recompute {r.recompute}: {r.under_64_GiB} of {r.meshes} "
            f"PP x EP meshes under 64 GiB at stage 0 (least {r.least_GiB:.1f} GiB)"
            for r in summary.itertuples()
        ),
        mechanism="Under 1F1B stage i keeps min(PP - i, M) micro-batches of activations, so stage 0 peaks; "
        "more EP shrinks each rank's experts (training state 16 bytes per parameter), more PP shrinks "
        "its layers but not stage 0's activations; full recomputation keeps one input per chunk.",
        notes="1F1B, micro-batch 1, global batch 1024 sequences, no ZeRO, the model's own sequence length.",
    )


def _memory_versus_paper(piped: pd.DataFrame) -> str:
    later = piped[piped["peak_stage"] != 0]
    if later.empty:
        return ""
    last = int((later["peak_stage"] == later["pp"] - 1).sum())
    return (
        f"{len(later)} of {len(piped)} pipelined meshes peak at a later stage ({last} of them at the last): the "
        "last stage also holds the final norm, the head's weights and training state and the fp32 logits (4 "
        "bytes per token and vocabulary entry), which can outweigh stage 0's extra micro-batches of "
        "activations when few micro-batches are in flight."
    )


def _memory_plot(ax, cells: pd.DataFrame) -> None:
    for rc, rows in cells.groupby("recompute", sort=False):
        best = rows.groupby("pp")["stage 0 GiB"].min()
        ax.plot(best.index, best.values, marker="o", label=f"least over EP, recompute {rc}")
    ax.axhline(HBM_LINE_GIB, color="red", lw=0.8, label="64 GiB")
    style.count_axis(ax, list(cells["pp"]))
    ax.set_yscale("log")
    style.plain_log_axis(ax.yaxis)
    ax.set_xlabel("pipeline stages (PP)")
    ax.set_ylabel("stage-0 peak memory (GiB)")
    style.title(
        ax,
        "Stage-0 memory over PP x EP",
        style.context(cells["model"].iloc[0], "frontier (MI250X GCD)", None, "memory model"),
    )
    ax.legend(loc="best", fontsize=8)


# ---- layer-ceiling -------------------------------------------------------------------------------------
LAYER_MODELS = (
    "mixtral-8x7b",
    "mixtral-8x22b",
    "llama4-scout",
    "llama4-maverick",
    "arctic",
    "deepseek-v2",
    "deepseek-v3",
    "kimi-k2",
)


def layer_points(quick: bool) -> list[dict]:
    out = []
    for name in LAYER_MODELS[::2] if quick else LAYER_MODELS:
        model = {
            "preset": name,
            "num_layers": 1,
            "num_dense_layers": 0,
            "moe_layer_freq": 1,
            "moe_layer_offset": 0,
            "vocab_size": 256,
            "seq_len": SEQ,
        }
        config = {
            "model": model,
            "topology": "frontier",
            "cost": {"profile": "mi250x"},
            "collectives": {"all_to_all": "halo"},
            "parallel": {"pp": 1, "ep": 8, "num_microbatches": 2, "micro_batch_size": 1},
        }
        out.append({"kind": "simulate", "name": name, "config": config})
    return out


def layer_section(results: list[tuple[dict, dict]], out: Path) -> Section:
    rows = []
    for p, r in results:
        m = load_model(p["name"])
        rows.append(
            {
                "model": p["name"],
                "experts": m.num_experts,
                "top k": m.top_k,
                "d_ffn": m.expert_ffn_dim,
                "rows per expert": SEQ * m.top_k * 8 // m.num_experts,
                "TFLOPS/GCD": r["tflops_per_gpu"],
                "MFU %": 100 * r["mfu"],
                "all-to-all share %": 100 * r["all_to_all_fraction"],
            }
        )
    table = pd.DataFrame(rows).sort_values("rows per expert", ascending=False)
    plot = figure(out, "layer-ceiling", lambda ax: _layer_plot(ax, table))
    return Section(
        table=table,
        plot=plot,
        prediction=f"One MoE layer on a Frontier node: {table['TFLOPS/GCD'].max():.0f} TFLOPS/GCD "
        f"({table.iloc[table['TFLOPS/GCD'].argmax()]['model']}) down to {table['TFLOPS/GCD'].min():.0f} "
        f"({table.iloc[table['TFLOPS/GCD'].argmin()]['model']}).",
        mechanism="Coarse experts get thousands of rows each, GEMMs near the profile's large-GEMM efficiency; "
        "fine-grained experts get a few hundred (rows per expert = tokens x k / E per micro-batch of "
        "the node), skinny GEMMs at a fraction of it, and the all-to-all of k rows per token weighs more.",
        notes="One layer (attention and MoE), sequence 4096, 2 micro-batches of 1 sequence per GCD, EP 8 over one "
        "node, HALO (inside a node: the intra-node all-to-all).",
    )


def _layer_plot(ax, table: pd.DataFrame) -> None:
    ax.bar(table["model"], table["TFLOPS/GCD"])
    ax.set_xlabel("model")
    ax.set_ylabel("TFLOPS per GCD")
    style.title(ax, "One MoE layer's throughput", style.context(None, "frontier, 8 GCDs", "des"))
    ax.tick_params(axis="x", rotation=40, labelsize=8)


# ---- migration ---------------------------------------------------------------------------------------------
ROUTINGS = {"zipf 1.0": {"kind": "zipf", "exponent": 1.0}, "drifting hot": {"kind": "drift", "rate": 0.5}}


def migration_points(quick: bool) -> list[dict]:
    steps = 6 if quick else 12
    out = []
    for label, routing in ROUTINGS.items():
        for policy in ("none", "greedy"):
            config = {
                "model": "x-moe-small",
                "topology": "frontier",
                "cost": {"profile": "mi250x"},
                "collectives": {"all_to_all": "halo"},
                "routing": routing,
                "migration": {"enabled": policy != "none", "policy": policy},
                "sim": {"steps": steps},
                "parallel": {"pp": 1, "ep": 8, "num_microbatches": 4, "micro_batch_size": 1},
            }
            out.append({"kind": "simulate", "name": label, "policy": policy, "config": config})
    return out


def migration_section(results: list[tuple[dict, dict]], out: Path) -> Section:
    rows = []
    for p, r in results:
        steady = r["step_times_s"][1:] or r["step_times_s"]
        rows.append(
            {
                "routing": p["name"],
                "migration": p["policy"],
                "steps": len(r["step_times_s"]),
                "mean step s (after step 0)": sum(steady) / len(steady),
                "migration share %": 100 * (r["migration"] or {}).get("time_fraction", 0.0),
                "experts moved": (r["migration"] or {}).get("experts_moved", 0),
            }
        )
    table = pd.DataFrame(rows)
    plot = figure(out, "migration", lambda ax: _steps_plot(ax, results))
    with_m = table[table["migration"] != "none"]
    shares = with_m["migration share %"] / 100
    return Section(
        table=table,
        plot=plot,
        figures={"migration_share": (float(shares.min()), float(shares.max()))},
        versus_paper="Each greedy swap moves an expert's weights, gradients and Adam state (16 bytes per parameter) "
        "inside the node on the step's critical path; with few micro-batches per step that transfer "
        "is a larger share of a short step than of the paper's longer ones.",
        prediction="Migration's share of step time: "
        + ", ".join(
            f"{routing} {share:.2f}%"
            for routing, share in zip(with_m["routing"], with_m["migration share %"], strict=True)
        )
        + ".",
        mechanism="Greedy swaps move an expert's weights, gradients and optimizer state between the most and least "
        "loaded GCDs of an EP group once per step; the all-to-all and expert compute of the busiest GCD "
        "shrink when its load does.",
        notes="X-MoE Small on one Frontier node (EP 8), 4 micro-batches of one sequence per step.",
    )


def _steps_plot(ax, results: list[tuple[dict, dict]]) -> None:
    routings = list(dict.fromkeys(p["name"] for p, _ in results))
    unit, factor = style.seconds_scale(max(max(r["step_times_s"]) for _, r in results))
    for p, r in results:
        ax.plot(
            range(len(r["step_times_s"])),
            [t * factor for t in r["step_times_s"]],
            marker=".",
            color=style.color("policy", p["policy"]),
            ls=style.LINE_STYLES[routings.index(p["name"]) % len(style.LINE_STYLES)],
            label=f"{p['name']}, {p['policy']}",
        )
    ax.set_xlabel("step")
    ax.set_ylabel(f"step time ({unit})")
    style.from_zero(ax)
    style.title(
        ax,
        "Step time under skewed routing, with and without migration",
        style.context("x-moe-small", "frontier, 8 GCDs", "des"),
    )
    ax.legend(loc="best", fontsize=8)


EXPERIMENTS = [
    Experiment(
        name="memory-map", title="Stage-0 memory over PP x EP meshes", points=memory_points, section=memory_section
    ),
    Experiment(
        name="layer-ceiling",
        title="One MoE layer's throughput on one Frontier node",
        points=layer_points,
        section=layer_section,
    ),
    *throughput_experiments.EXPERIMENTS,
    Experiment(
        name="migration",
        title="Expert migration under skewed and drifting routing",
        points=migration_points,
        section=migration_section,
    ),
]
