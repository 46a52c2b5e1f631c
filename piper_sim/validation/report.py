"""The output of `piper-sim validate`: the printed table and summary lines, and the files of --out
(validation.csv, phases.csv, concurrency.csv, summary.json, predicted_vs_measured.png).

Reads the scores (validation.scoring) and summary (validation.summary); computes nothing of its own. Must
not import torch or the CLI; matplotlib is imported only when --out writes the plot.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from piper_sim.analysis import style
from piper_sim.analysis.tables import Col, render


def format_validation(scores: list[dict], summary: dict) -> str:
    lines = _case_table(scores)
    lines += [
        "",
        f"MAPE {summary['mape'] * 100:.1f}%   max error {summary['max_error'] * 100:.1f}%   "
        f"rank correlation {summary['rank_correlation']:.3f}   same order: {summary['same_order']} "
        "(by the scored step times)",
    ]
    pooled = summary.get("pooled")
    if pooled:
        worst = pooled["worst_case"]
        lines.append(
            f"over every session's rounds (up to {pooled['sessions']} sessions, at least "
            f"{pooled['rounds_min']} rounds per case; the median of all): MAPE {pooled['mape'] * 100:.1f}%   "
            f"max error {pooled['max_error'] * 100:.1f}% ({worst} {pooled['errors'][worst] * 100:+.1f}%)"
        )
    lines += _order_lines(summary)
    spreads = [s["measured_spread"] for s in scores if not np.isnan(s.get("measured_spread", float("nan")))]
    if spreads:
        lines.append(
            f"measured runs (slowest / fastest - 1, column 'runs'): median {np.median(spreads) * 100:.0f}%, "
            f"max {max(spreads) * 100:.0f}%; the run with the median step time is scored"
        )
    lines += _reference_lines(summary.get("machine_speed")) + _concurrency_lines(summary.get("compute_concurrency"))
    if summary["memory_max_error"] is not None:
        lines.append(
            f"peak memory per stage: mean error {summary['memory_mean_error'] * 100:.1f}%, "
            f"max {summary['memory_max_error'] * 100:.1f}%"
        )
    for sp in summary["halo_over_flat"]:
        lines.append(
            f"HALO over flat [{sp['pair']}]: measured {sp['measured']:.2f}x, predicted {sp['predicted']:.2f}x "
            f"({sp['error'] * 100:+.1f}%)"
        )
    return "\n".join(lines)


CASE_COLUMNS = [
    Col("case", "case"),
    Col("predicted_step_s", "predicted step", "time"),
    Col("measured_step_s", "measured step", "time"),
    Col("error", "error", "%", signed=True),
    Col("within", "within tolerance", "yes/no"),
    Col("memory_error", "memory error", "%", signed=True),
    Col("measured_spread", "runs' spread", "%", digits=0),
    Col("worst_phase", "worst phase"),
]


def _case_table(scores: list[dict]) -> list[str]:
    """One row per case (analysis/tables.py): predicted and measured step time, errors, the runs' spread (slowest /
    fastest - 1; "-" for one run) and the worst phase."""
    rows = []
    for s in scores:
        ph = s["phases"].dropna(subset=["error"])
        worst = ph.loc[ph["error"].abs().idxmax()] if not ph.empty else None
        rows.append(
            {
                **s,
                "within": abs(s["error"]) <= s["tolerance"],
                "worst_phase": f"{worst.name} {worst['error'] * 100:+.0f}%" if worst is not None else "",
            }
        )
    return render(rows, CASE_COLUMNS).splitlines()


def _order_lines(summary: dict) -> list[str]:
    """The measured order of the cases, and every pair the prediction orders against the scored runs."""
    lines = []
    order = summary.get("measured_order")
    if order:
        lines.append(
            f"measured order: {order['ordered_pairs']} of {order['pairs']} pairs of cases ordered by the "
            f"measurement (one faster in every round both ran; {order['sessions']} session(s)), "
            f"{len(order['swapped'])} of them predicted the other way: same measured order: {order['same']}"
        )
    swaps = summary.get("order_swaps", [])
    lines += [
        f"  out of order: {sw['faster']} measured {sw['measured_gap'] * 100:.1f}% faster than {sw['slower']}"
        f"{_swap_evidence(sw)}, predicted slower"
        for sw in swaps
    ]
    if swaps:
        apart = sum(1 for sw in swaps if not sw.get("runs_overlap"))
        lines.append(
            f"  {apart} of {len(swaps)} swapped pairs were measured apart (runs not overlapping), "
            f"{sum(1 for sw in swaps if sw.get('ordered'))} ordered by the measurement"
        )
    return lines


def _reference_lines(speed: dict | None) -> list[str]:
    """The machine's hot and cold references during the measurement against the profile's."""
    if not speed:
        return []
    lines = [
        f"machine reference ({speed['preset']} layer forward + backward, one process per core): "
        f"{speed['calibrated_s'] * 1e6:.0f} us at calibration, {speed['measured_median_s'] * 1e6:.0f} us "
        f"during the measurement {_rounds_text(speed)} CPU time per iteration"
    ]
    cold = speed.get("cold")
    if cold:
        lines.append(
            f"cold reference ({cold['model']} layer ops, forward + backward, cold on {cold['ranks']} "
            f"ranks, {cold['tokens']} tokens): priced {cold['priced_s'] * 1e6:.0f} us by the profile, "
            f"measured {cold['measured_median_s'] * 1e6:.0f} us {_rounds_text(cold)}"
        )
    return lines


def _concurrency_lines(conc: dict | None) -> list[str]:
    """Ranks computing at once and compute tasks with a core to themselves, predicted and measured."""
    if not conc:
        return []
    mean_p, mean_m = conc["predicted_mean_ranks_computing"], conc["measured_mean_ranks_computing"]
    none_p, none_m = conc["predicted_share_none_computing"], conc["measured_share_none_computing"]
    lines = [
        f"ranks computing at once (mean over the cases): predicted {mean_p:.2f}, measured {mean_m:.2f}; "
        f"no rank computing {none_p * 100:.0f}% of the time predicted, {none_m * 100:.0f}% measured "
        "(concurrency.csv)"
    ]
    if "measured_share_uninterrupted" in conc:
        lines.append(
            f"compute tasks with a core to themselves (CPU >= 0.9 x wall; validation.csv): predicted "
            f"{conc['predicted_share_uninterrupted'] * 100:.0f}%, measured "
            f"{conc['measured_share_uninterrupted'] * 100:.0f}% (mean over the cases)"
        )
    return lines


def _rounds_text(ref: dict) -> str:
    """'(median of N rounds, MIN-MAX): +R%' of a machine reference (microseconds)."""
    return (
        f"(median of {ref['rounds']} rounds, {ref['measured_min_s'] * 1e6:.0f}-{ref['measured_max_s'] * 1e6:.0f}): "
        f"{(ref['ratio'] - 1) * 100:+.0f}%"
    )


def _swap_evidence(swap: dict) -> str:
    notes = []
    if swap.get("rounds_faster"):
        sessions = swap.get("sessions", 1)
        notes.append(
            "faster in {} of {} rounds".format(*swap["rounds_faster"])
            + (f" of {sessions} sessions" if sessions > 1 else "")
        )
    if swap.get("runs_overlap"):
        notes.append("their runs overlap")
    if swap.get("ordered"):
        notes.append("ORDERED BY THE MEASUREMENT")
    return f" ({'; '.join(notes)})" if notes else ""


def write_validation(out: Path, scores: list[dict], summary: dict) -> None:
    import matplotlib  # matplotlib: heavy; only when the plots are written

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # once the backend is Agg (no display)

    out.mkdir(parents=True, exist_ok=True)
    rows = [{k: v for k, v in s.items() if k not in ("phases", "prediction", "concurrency")} for s in scores]
    pd.DataFrame(rows).to_csv(out / "validation.csv", index=False)
    phases = pd.concat([s["phases"].assign(case=s["case"]) for s in scores])
    phases.reset_index(names="kind").to_csv(out / "phases.csv", index=False)
    if all(s.get("concurrency") is not None for s in scores):
        conc = pd.concat([s["concurrency"].add_suffix("_share").assign(case=s["case"]) for s in scores])
        conc.reset_index(names="ranks_computing").to_csv(out / "concurrency.csv", index=False)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    fig, ax = plt.subplots(figsize=(6, 6))
    meas = np.array([s["measured_step_s"] for s in scores]) * 1e3
    pred = np.array([s["predicted_step_s"] for s in scores]) * 1e3
    runs_ms = [np.array(s["measured_runs_s"] or [s["measured_step_s"]]) * 1e3 for s in scores]
    xerr = np.array([meas - [r.min() for r in runs_ms], [r.max() for r in runs_ms] - meas])  # the runs' range
    ax.errorbar(meas, pred, xerr=xerr, fmt="o", elinewidth=0.8, capsize=2)
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):
        style.plain_log_axis(axis)
    for s, x, y in zip(scores, meas, pred, strict=True):
        ax.annotate(s["case"], (x, y), fontsize=6)
    lo, hi = min(meas.min(), pred.min()) * 0.8, max(meas.max(), pred.max()) * 1.25
    ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
    ax.set_xlabel("measured step time (ms)")
    ax.set_ylabel("predicted step time (ms)")
    style.title(
        ax,
        f"validation cases: MAPE {summary['mape'] * 100:.1f}%, max {summary['max_error'] * 100:.1f}%",
        style.context(None, None, "des", "against measured runs"),
    )
    fig.tight_layout()
    fig.savefig(out / "predicted_vs_measured.png", dpi=110)
    plt.close(fig)
