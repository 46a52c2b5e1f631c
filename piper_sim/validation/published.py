"""`piper-sim validate --published`: the simulator against training runs published with their plans
(validation/published/NAME.yaml: name, source, measured, config, notes; validation/published/README.md).

Owns reading the runs, the measured step time of each (stated, or from a published throughput through the
publication's own FLOP formula, so no FLOP convention of piper-sim's enters the measured side), scoring and the
summary: error per run, MAPE, worst run, and the share of run pairs whose order by per-GPU throughput the
prediction keeps, and the same per family (hardware, dense or MoE, scale; analysis/band.py). Must not import
torch.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

import pandas as pd
import yaml

from piper_sim.analysis import style
from piper_sim.analysis.band import Family, family_of, leave_one_family_out
from piper_sim.analysis.tables import Col, render
from piper_sim.config import load_config
from piper_sim.errors import ConfigError, PiperError
from piper_sim.planning.estimate import config_estimator, estimate_config
from piper_sim.planning.estimate_budget import estimate_budget
from piper_sim.steady_state import simulate_figures
from piper_sim.validation.breakdown import predicted_breakdown

PUBLISHED_DIR = "published"


@dataclass(frozen=True, kw_only=True)
class PublishedRun:
    name: str
    source: str
    measured: dict
    config: dict
    breakdown: dict | None = None  # a published split of part of the run's time (validation/breakdown.py)

    @property
    def tokens_per_step(self) -> int:
        return int(self.measured["global_batch"]) * int(self.measured["seq_len"])


def find_published(names: list[str], root: Path) -> list[PublishedRun]:
    """The named runs (NAME or published/NAME), or every run under root."""
    if not names:
        paths = sorted(root.glob("*.yaml"))
    else:
        paths = []
        for name in names:
            path = root / f"{Path(name).name.removesuffix('.yaml')}.yaml"
            if not path.exists():
                raise ConfigError(
                    "validate --published",
                    name,
                    f"a run of {root} ({', '.join(p.stem for p in sorted(root.glob('*.yaml')))})",
                )
            paths.append(path)
    return [load_published(p) for p in paths]


def load_published(path: Path) -> PublishedRun:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise PiperError(f"{path}: not a readable YAML file ({type(exc).__name__})") from None
    for key in ("name", "source", "measured", "config"):
        if not isinstance(data, dict) or key not in data:
            raise ConfigError(f"{path.name}: {key}", None, "name, source, measured and config sections")
    source = data["source"]
    text = (
        f"{source.get('title', '')} ({source.get('year', '')}), {source.get('where', '')}"
        if isinstance(source, dict)
        else str(source)
    )
    return PublishedRun(
        name=str(data["name"]),
        source=text,
        measured=data["measured"],
        config=data["config"],
        breakdown=data.get("breakdown"),
    )


def measured_step_s(run: PublishedRun) -> float:
    """The published step time, or the FLOPs of one step by the publication's formula over its throughput."""
    m = run.measured
    if "iteration_time_s" in m:
        return float(m["iteration_time_s"])
    formula = FLOP_FORMULAS.get(m.get("flops_formula"))
    if formula is None:
        raise ConfigError(f"{run.name}: measured.flops_formula", m.get("flops_formula"), ", ".join(FLOP_FORMULAS))
    return formula(run) / (float(m["throughput_TFLOPS_per_gpu"]) * 1e12 * int(m["num_gpus"]))


def _narayanan2021(run: PublishedRun) -> float:
    """Narayanan et al. 2021, equation 3 (with activation recomputation): 96 B s l h^2 (1 + s/6h + V/16lh)."""
    model = load_config(run.config).model
    b, s, layers, h, v = (
        int(run.measured["global_batch"]),
        model.seq_len,
        model.num_layers,
        model.d_model,
        model.vocab_size,
    )
    return 96 * b * s * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))


def _megatron_core(run: PublishedRun) -> float:
    """Megatron-LM's num_floating_point_operations (megatron/training/training.py, 2024): 12 B s l h^2 x
    (attention ((1 + groups/heads + s/h) x q/h) + FFN (d_ffn/h x top_k x 3/2 for SwiGLU) + shared experts
    + logits V / (2 l h)), no recomputation counted."""
    return _megatron_core_count(run, score_share=1.0)


def _megatron_core_2025(run: PublishedRun) -> float:
    """The same count from Megatron-LM commit 8873b55 (March 2025) on: the attention scores and their product with
    V are counted for the causal half of the matrix only (s / 2h in place of s / h)."""
    return _megatron_core_count(run, score_share=0.5)


def _megatron_core_count(run: PublishedRun, score_share: float) -> float:
    model = load_config(run.config).model
    b, s, layers, h = int(run.measured["global_batch"]), model.seq_len, model.num_layers, model.d_model
    q_ratio = model.num_heads * model.attn_head_dim / h
    gated = 1.5 if model.expert_matrices == 3 else 1.0
    attention = (1 + model.kv_heads / model.num_heads + score_share * s / h) * q_ratio
    ffn = model.expert_ffn_dim / h * model.top_k * gated
    shared = model.num_shared_experts * model.shared_ffn_dim / h * gated
    return 12 * b * s * layers * h * h * (attention + ffn + shared + model.vocab_size / (2 * layers * h))


def _megatron_deepspeed(run: PublishedRun) -> float:
    """Megatron-DeepSpeed's throughput_calculator (megatron/utils.py, as in X-MoE's fork): multiply-accumulates of
    one forward, B s l ((2 + 2 // (heads / kv_heads)) h^2 + 2 s h_attn + matrices x d_ffn x h x top_k) + B s V h,
    times 3 (forward and backward) and 2 FLOPs each; no recomputation and no shared experts counted."""
    model = load_config(run.config).model
    b, s, layers, h, v = (
        int(run.measured["global_batch"]),
        model.seq_len,
        model.num_layers,
        model.d_model,
        model.vocab_size,
    )
    gqa = model.num_heads // model.kv_heads
    attention = (2 + 2 // gqa) * h * h + 2 * model.attn_head_dim * model.num_heads * s
    ffn = model.expert_matrices * model.expert_ffn_dim * h * model.top_k
    return 3 * 2 * b * s * (layers * (attention + ffn) + v * h)


def _palm(run: PublishedRun) -> float:
    """PaLM's model FLOPs (Chowdhery et al. 2023, Appendix B), the count the Llama 3 paper cites for its MFU:
    6 N + 12 L H Q T per token, N the parameters a token's matmuls use, the whole L H Q T score matrix of a layer
    counted (no causal half). N as torchtitan's get_nparams_and_flops takes it: every parameter but an untied
    input embedding, routed experts top_k of num_experts."""
    model = load_config(run.config).model
    input_embedding = 0 if model.tie_embeddings else model.vocab_size * model.d_model
    per_token = (
        6 * (model.active_params() - input_embedding)
        + 12 * model.num_layers * model.num_heads * model.attn_head_dim * model.seq_len
    )
    return per_token * run.tokens_per_step


FLOP_FORMULAS = {
    "narayanan2021-eq3": _narayanan2021,
    "megatron-core": _megatron_core,
    "megatron-core-2025": _megatron_core_2025,
    "megatron-deepspeed": _megatron_deepspeed,
    "palm": _palm,
}


TIERS = ("des", "estimate")


def score_published(run: PublishedRun, tier: str = "des") -> dict:
    """The run's config simulated (tier "des") or priced by the planner's estimator ("estimate"); its step time
    against the measured one."""
    t0 = time.perf_counter()
    cfg = load_config(run.config)
    if cfg.parallel.num_gpus != int(run.measured["num_gpus"]):
        raise ConfigError(
            f"{run.name}: config.parallel",
            cfg.parallel.num_gpus,
            f"the published GPU count ({run.measured['num_gpus']})",
        )
    if tier not in TIERS:
        raise ConfigError("--tier", tier, " or ".join(TIERS))
    figures = _simulated(cfg) if tier == "des" else _estimated(cfg)
    measured = measured_step_s(run)
    gpus = cfg.parallel.num_gpus
    family = family_of(cfg)
    return {
        "name": run.name,
        "num_gpus": gpus,
        "tier": tier,
        "measured_step_s": measured,
        **figures,
        "hardware": family.hardware,
        "moe": family.moe,
        "scale": family.scale,
        "error": figures["predicted_step_s"] / measured - 1,
        "measured_tokens_per_s_per_gpu": run.tokens_per_step / measured / gpus,
        "predicted_tokens_per_s_per_gpu": run.tokens_per_step / figures["predicted_step_s"] / gpus,
        "wall_s": time.perf_counter() - t0,
        "source": run.source,
    }


def _simulated(cfg) -> dict:
    run = simulate_figures(cfg)  # a long pipeline from a few short runs where its step is affine (steady_state.py)
    report, budget = run.report, run.budget
    return {
        "predicted_step_s": report.step_time_s,
        "predicted_mfu": report.mfu,
        "bubble_fraction": report.bubble_fraction,
        "exposed_comm_fraction": report.exposed_comm_fraction,
        "fits_memory": all(report.fits_memory or [True]),
        "microbatches_simulated": " ".join(map(str, report.microbatches_simulated or [])),
        "extrapolation": report.extrapolation or "",  # from short runs: exact, or near (steady_state.py)
        "budget": {k: v for k, v in budget.items() if k not in ("rank", "step_s")},
    }


def _estimated(cfg) -> dict:
    built = config_estimator(cfg)  # the machine built once for the estimate, its memory and its budget
    estimate, fits = estimate_config(cfg, built)
    _, budget = estimate_budget(*built)
    return {
        "predicted_step_s": estimate.step_time_s,
        "predicted_mfu": estimate.mfu,
        "bubble_fraction": estimate.bubble_s / estimate.step_time_s,
        "exposed_comm_fraction": float("nan"),
        "fits_memory": fits,
        "microbatches_simulated": "",  # the estimator simulates none
        "extrapolation": "",
        "budget": {k: v for k, v in budget.items() if k != "stage"},
    }


def breakdown_table(runs: list[PublishedRun]) -> pd.DataFrame:
    """Every published breakdown of these runs beside the prediction of the same pieces (validation/breakdown.py)."""
    rows = [row for run in runs if run.breakdown for row in predicted_breakdown(run.config, run.breakdown, run.name)]
    return pd.DataFrame(rows, columns=["name", "term", "published_s", "predicted_s", "where"])


def format_breakdowns(table: pd.DataFrame) -> str:
    """The published breakdowns beside their predictions, one line per term (ms)."""
    lines = [f"{'published breakdown':<38} {'term':<20} {'published ms':>12} {'predicted ms':>12}"]
    lines += [
        f"{r.name:<38} {r.term:<20} {1e3 * r.published_s:>12.2f} {1e3 * r.predicted_s:>12.2f}"
        for r in table.itertuples(index=False)
    ]
    return "\n".join(lines)


def budget_table(scores: list[dict]) -> pd.DataFrame:
    """Per run: the measured and predicted step, what the prediction misses (measured - predicted), and the
    predicted step split into its terms (seconds; the estimate tier splits compute by cost term, the DES tier
    gives one rank's step by what fills it: analysis/budget.py, planning/estimate_budget.py)."""
    return pd.DataFrame(
        [
            {
                "name": s["name"],
                "tier": s["tier"],
                "measured_step_s": s["measured_step_s"],
                "predicted_step_s": s["predicted_step_s"],
                "missing_s": s["measured_step_s"] - s["predicted_step_s"],
                **s["budget"],
            }
            for s in scores
        ]
    )


def summarize_published(scores: list[dict]) -> dict:
    errors = [abs(s["error"]) for s in scores]
    worst = max(scores, key=lambda s: abs(s["error"]))
    pairs = [
        (a, b)
        for a, b in combinations(scores, 2)
        if a["measured_tokens_per_s_per_gpu"] != b["measured_tokens_per_s_per_gpu"]
    ]
    kept = sum(
        (a["measured_tokens_per_s_per_gpu"] > b["measured_tokens_per_s_per_gpu"])
        == (a["predicted_tokens_per_s_per_gpu"] > b["predicted_tokens_per_s_per_gpu"])
        for a, b in pairs
    )
    return {
        "runs": len(scores),
        "mape": sum(errors) / len(errors),
        "worst": worst["name"],
        "worst_error": worst["error"],
        "beyond_30pct": sum(e > 0.30 for e in errors),
        "order_kept": kept / len(pairs) if pairs else 1.0,
        "pairs": len(pairs),
    }


def family_summary(scores: list[dict]) -> list[dict]:
    """Per family (hardware and dense or MoE; then by scale within it): runs, MAPE, mean signed error and the
    worst run, so that no family's bias hides in the overall MAPE."""
    rows = []
    for depth in (2, 3):
        groups: dict[str, list[dict]] = {}
        for s in scores:
            groups.setdefault(Family(s["hardware"], s["moe"], s["scale"]).label(depth), []).append(s)
        for label, members in sorted(groups.items()):
            worst = max(members, key=lambda s: abs(s["error"]))
            rows.append(
                {
                    "family": label,
                    "runs": len(members),
                    "mape": sum(abs(s["error"]) for s in members) / len(members),
                    "mean_signed": sum(s["error"] for s in members) / len(members),
                    "worst": worst["name"],
                    "worst_error": worst["error"],
                }
            )
    return rows


def band_coverage(scores: list[dict]) -> pd.DataFrame:
    """The error band of each run derived from the other families' runs of these scores (analysis/band.py)."""
    columns = ["name", "error", "hardware", "moe", "scale"]
    tier = scores[0]["tier"] if scores else "des"
    return leave_one_family_out(pd.DataFrame([{k: s[k] for k in columns} for s in scores], columns=columns), tier)


FAMILY_COLUMNS = [
    Col("family", "family"),
    Col("runs", "runs", "count"),
    Col("mape", "MAPE", "%"),
    Col("mean_signed", "mean error", "%", signed=True),
    Col("worst_error", "worst error", "%", signed=True),
    Col("worst", "worst run"),
]
RUN_COLUMNS = [
    Col("name", "run"),
    Col("num_gpus", "GPUs", "count"),
    Col("measured_step_s", "measured step", "time"),
    Col("predicted_step_s", "predicted step", "time"),
    Col("error", "error", "%", signed=True),
    Col("fits_memory", "fits", "yes/no"),
    Col("tier", "tier"),
]


def format_families(rows: list[dict]) -> str:
    return render(rows, FAMILY_COLUMNS)


def format_published(scores: list[dict], summary: dict) -> str:
    lines = render(scores, RUN_COLUMNS).splitlines()
    lines.append(
        f"MAPE {100 * summary['mape']:.1f}% over {summary['runs']} runs; worst {summary['worst']} "
        f"{100 * summary['worst_error']:+.1f}%; {summary['beyond_30pct']} beyond 30%; order by throughput "
        f"kept on {100 * summary['order_kept']:.0f}% of {summary['pairs']} pairs"
    )
    return "\n".join(lines)


def write_published(out: Path, scores: list[dict], summary: dict) -> None:
    import matplotlib  # matplotlib: heavy; only when the plots are written

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # once the backend is Agg (no display)

    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([{k: v for k, v in s.items() if k != "budget"} for s in scores]).to_csv(
        out / "published.csv", index=False
    )
    budget_table(scores).to_csv(out / "published_budget.csv", index=False)
    pd.DataFrame(family_summary(scores)).to_csv(out / "published_families.csv", index=False)
    band_coverage(scores).to_csv(out / "published_band_coverage.csv", index=False)
    (out / "published_summary.json").write_text(json.dumps(summary, indent=2))
    fig, ax = plt.subplots(figsize=(5.5, 5))
    measured = [s["measured_step_s"] for s in scores]
    ax.loglog(measured, [s["predicted_step_s"] for s in scores], "o")
    lo, hi = min(measured) / 1.5, max(measured) * 1.5
    ax.plot([lo, hi], [lo, hi], color="grey", lw=0.8, label="predicted = measured")
    ax.set_xlabel("measured step time (s)")
    ax.set_ylabel("predicted step time (s)")
    for axis in (ax.xaxis, ax.yaxis):
        style.plain_log_axis(axis)
    tiers = sorted({str(s["tier"]) for s in scores})
    style.title(
        ax,
        f"Published runs: MAPE {100 * summary['mape']:.1f}%",
        style.context(None, "each run's own machine", tiers[0] if len(tiers) == 1 else ", ".join(tiers)),
    )
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "published_vs_predicted.png", dpi=120)
    plt.close(fig)
