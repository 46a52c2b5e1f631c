"""`piper-sim study imbalance`: MFU and step time against routing skew, per migration policy.

Owns the points of the study (skew values x policies, each a multi-step simulation of one config; and the drift
run, step time over steps under a routing whose hot experts move, per policy), their checks before anything
runs (errors name the option that set the bad value), the CSVs and the plots. Each finished point is stored at
once in the ResultStore (piper_sim.points) under the output directory, keyed by points.keys.point_key (its resolved
config, the files it reads, the code version), and the CSVs are rewritten as points finish: a rerun recomputes
nothing finished while its key holds, and says how many points it reused and computed.
"""

from __future__ import annotations

import copy
import csv
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.ticker import MaxNLocator

from piper_sim.analysis import style
from piper_sim.analysis.run_report import Report
from piper_sim.analysis.tables import Col, render
from piper_sim.bounds import int_limit
from piper_sim.config import Config, load_config
from piper_sim.errors import ConfigError, named_by
from piper_sim.points.keys import KeyedPoint, keyed_point
from piper_sim.points.store import ResultStore
from piper_sim.progress import Eta
from piper_sim.simulator import simulate

SKEW_PARAM = {"zipf": "exponent", "dirichlet": "concentration", "hot": "share"}
COLUMNS = (
    "kind",
    "skew",
    "policy",
    "step_time_s",
    "mfu",
    "tflops_per_gpu",
    "lif",
    "experts_moved",
    "bytes_moved_per_group",
    "migration_time_fraction",
)
DRIFT_COLUMNS = ("policy", "step", "step_time_s")


def config_for(raw: dict, kind: str, skew: float | None, policy: str, steps: int, extra: dict | None = None) -> dict:
    out = copy.deepcopy(raw)
    routing = {"kind": kind, **(extra or {})}
    if skew is not None:
        routing[SKEW_PARAM[kind]] = skew
    out["routing"] = routing
    out["migration"] = {**(out.get("migration") or {}), "enabled": policy != "none", "policy": policy}
    out["sim"] = {**(out.get("sim") or {}), "steps": steps}
    return out


def summarize_run(report: Report) -> dict:
    steps = report.step_times_s
    steady = steps[1:] if len(steps) > 1 else steps  # step 0 runs on the unmigrated placement
    mig = report.migration or {}
    return {
        "step_time_s": float(np.mean(steady)),
        "mfu": report.mfu * report.step_time_s / np.mean(steady),
        "tflops_per_gpu": report.tflops_per_gpu * report.step_time_s / np.mean(steady),
        "lif": (report.imbalance or {}).get("overall", {}).get("lif", 1.0),
        "experts_moved": mig.get("experts_moved", 0),
        "bytes_moved_per_group": mig.get("bytes_moved_per_group", 0),
        "migration_time_fraction": mig.get("time_fraction", 0.0),
    }


@dataclass(frozen=True)
class Point:
    table: str  # "imbalance" or "drift"
    labels: dict  # the CSV columns that name the point
    config: Config

    def keyed(self) -> KeyedPoint:
        return keyed_point({"study": f"imbalance/{self.table}", "config": self.config.resolved()})


def _count(flag: str, value: int, low: int) -> int:
    limit = int_limit("sim.steps")
    if not low <= value <= limit:
        raise ConfigError(flag, value, f"an integer from {low} to {limit:,}")
    return value


def study_points(
    raw: dict, *, kind: str, skews: list[float], policies: list[str], steps: int, drift_steps: int, drift_rate: float
) -> list[Point]:
    """Every point of the study, its config resolved and checked; errors name the option that set the value."""
    if kind not in SKEW_PARAM:
        raise ConfigError("--kind", kind, f"one of {', '.join(SKEW_PARAM)}")
    _count("--steps", steps, 1)
    _count("--drift-steps", drift_steps, 0)
    if not (math.isfinite(drift_rate) and drift_rate >= 0):
        raise ConfigError("--drift-rate", drift_rate, "a finite number of experts per step, >= 0")
    for skew in skews:
        with named_by("--skews"):
            load_config(config_for(raw, kind, skew, "none", steps))
    for policy in policies:
        with named_by("--policies"):
            load_config(config_for(raw, kind, skews[0], policy, steps))
    points = [
        Point(
            "imbalance",
            {"kind": kind, "skew": skew, "policy": policy},
            load_config(config_for(raw, kind, skew, policy, steps)),
        )
        for skew in skews
        for policy in policies
    ]
    if drift_steps:
        with named_by("--drift-rate"):
            points += [
                Point(
                    "drift",
                    {"policy": policy},
                    load_config(config_for(raw, "drift", None, policy, drift_steps, {"rate": drift_rate})),
                )
                for policy in policies
            ]
    return points


def _result(point: Point) -> dict:
    report = simulate(point.config).report
    if point.table == "drift":
        return {"step_times_s": list(report.step_times_s)}
    return summarize_run(report)


def _rows(point: Point, result: dict) -> list[dict]:
    if point.table == "drift":
        return [{**point.labels, "step": step, "step_time_s": t} for step, t in enumerate(result["step_times_s"])]
    return [{**point.labels, **result}]


def run_points(points: list[Point], out: Path, log: Callable[[str], None]) -> dict[str, Path]:
    """Simulate the points not yet in the store, store each as it finishes, rewrite the CSVs after each point
    (imbalance.csv, drift.csv where the study has a drift run)."""
    store = ResultStore(out)
    tables = {"imbalance": (out / "imbalance.csv", COLUMNS), "drift": (out / "drift.csv", DRIFT_COLUMNS)}
    rows: dict[str, list[dict]] = {t: [] for t in tables if any(p.table == t for p in points)}
    keyed = [point.keyed() for point in points]
    stored = [store.get(k.digest, k.key) for k in keyed]
    eta = Eta(sum(1 for result in stored if result is None))
    for i, (point, key, result) in enumerate(zip(points, keyed, stored, strict=True)):
        what = ", ".join(f"{k}={v}" for k, v in point.labels.items())
        if result is None:
            log(f"[{i + 1}/{len(points)}] {point.table}: {what}" + (f" ({eta.text()})" if eta.computed else ""))
            result = _result(point)
            store.put(key.digest, key.key, result)
            eta.finished()
        else:
            log(f"[{i + 1}/{len(points)}] {point.table}: {what} (stored)")
        rows[point.table] += _rows(point, result)
        _write_csv(*tables[point.table], rows[point.table])
    for line in store.tally.lines("study imbalance"):
        log(line)
    return {t: tables[t][0] for t in rows}


def _write_csv(path: Path, columns: tuple[str, ...], rows: list[dict]) -> None:
    tmp = path.with_suffix(".csv.tmp")
    with tmp.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    tmp.replace(path)


IMBALANCE_COLUMNS = [
    Col("kind", "routing"),
    Col("skew", "skew", "num"),
    Col("policy", "migration"),
    Col("step_time_s", "step", "time"),
    Col("mfu", "MFU", "%"),
    Col("tflops_per_gpu", "TFLOPS/GPU", "TFLOPS"),
    Col("lif", "load imbalance", "x"),
    Col("experts_moved", "experts moved", "count"),
    Col("bytes_moved_per_group", "moved per EP group", "bytes"),
    Col("migration_time_fraction", "migration share", "%"),
]
DRIFT_SUMMARY = [
    Col("policy", "migration"),
    Col("steps", "steps", "count"),
    Col("first_s", "step 0", "time"),
    Col("mean_s", "mean after step 0", "time"),
    Col("last_s", "last step", "time"),
]


def study_context(points: list[Point]) -> str:
    """The context line of the study's plots: model, machine and tier (analysis/style.py)."""
    cfg = points[0].config
    return style.context(cfg.model.name, style.machine_label(cfg.topology, cfg.parallel.num_gpus), "des")


def tables_text(out: Path) -> str:
    """The printed tables of the study (analysis/tables.py): one row per (skew, policy), and the drift run per
    policy (its step 0 on the unmigrated placement, its mean after, its last step)."""
    parts = []
    if (out / "imbalance.csv").exists():
        parts.append(render(pd.read_csv(out / "imbalance.csv").to_dict("records"), IMBALANCE_COLUMNS))
    if (out / "drift.csv").exists():
        drift = pd.read_csv(out / "drift.csv")
        rows = [
            {
                "policy": policy,
                "steps": len(g),
                "first_s": g["step_time_s"].iloc[0],
                "mean_s": g["step_time_s"].iloc[1:].mean() if len(g) > 1 else None,
                "last_s": g["step_time_s"].iloc[-1],
            }
            for policy, g in drift.groupby("policy", sort=False)
        ]
        parts.append("drifting hot experts:\n" + render(rows, DRIFT_SUMMARY))
    return "\n\n".join(parts)


def write_plots(out: Path, context_line: str = "") -> list[Path]:
    import matplotlib  # matplotlib: heavy; only when the plots are written

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # once the backend is Agg (no display)

    paths = []
    if (out / "imbalance.csv").exists():
        df = pd.read_csv(out / "imbalance.csv")
        kind = df["kind"].iloc[0] if len(df) else ""
        unit, factor = style.seconds_scale(float(df["step_time_s"].max()) if len(df) else 0.0)
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
        for policy, group in df.groupby("policy", sort=False):
            for ax, values in zip(axes, (group["mfu"] * 100, group["step_time_s"] * factor), strict=True):
                ax.plot(group["skew"], values, "o-", color=style.color("policy", policy), label=policy)
        for ax, label in zip(axes, ("MFU (%)", f"step time ({unit})"), strict=True):
            ax.set_xlabel(f"{kind} {SKEW_PARAM.get(kind, 'skew')}")
            ax.set_ylabel(label)
            style.from_zero(ax)
            ax.legend(title="migration", loc="lower right")
        style.suptitle(fig, f"MFU and step time against {kind or 'routing'} skew, by migration policy", context_line)
        fig.tight_layout()
        paths.append(out / "imbalance.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    if (out / "drift.csv").exists():
        df = pd.read_csv(out / "drift.csv")
        unit, factor = style.seconds_scale(float(df["step_time_s"].max()) if len(df) else 0.0)
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for policy, group in df.groupby("policy", sort=False):
            ax.plot(
                group["step"], group["step_time_s"] * factor, "o-", color=style.color("policy", policy), label=policy
            )
        ax.set_xlabel("step")
        ax.set_ylabel(f"step time ({unit})")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        style.from_zero(ax)
        style.title(ax, "step time under drifting hot experts, by migration policy", context_line)
        ax.legend(title="migration", loc="lower right")
        fig.tight_layout()
        paths.append(out / "drift.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths
