"""`piper-sim study imbalance`: MFU and step time against routing skew, per migration policy.

Owns the sweep (skew values x policies, each a multi-step simulation of one config), the drift run
(step time over steps under a routing whose hot experts move, per policy), the incremental CSVs and
the plots. Writes only under the output directory; an interrupted sweep keeps its finished rows.
"""

from __future__ import annotations

import copy
import csv
from collections.abc import Callable
from pathlib import Path

import numpy as np

from piper_sim.analysis.report import Report
from piper_sim.config import load_config
from piper_sim.errors import ConfigError
from piper_sim.simulate import simulate

SKEW_PARAM = {"zipf": "exponent", "dirichlet": "concentration", "hot": "share"}
COLUMNS = ("kind", "skew", "policy", "step_time_s", "mfu", "tflops_per_gpu", "lif", "experts_moved",
           "bytes_moved_per_group", "migration_time_fraction")


def config_for(raw: dict, kind: str, skew: float | None, policy: str, steps: int, extra: dict | None = None) -> dict:
    out = copy.deepcopy(raw)
    routing = {"kind": kind, **(extra or {})}
    if skew is not None:
        routing[SKEW_PARAM[kind]] = skew
    out["routing"] = routing
    out["migration"] = {**out.get("migration", {}), "enabled": policy != "none", "policy": policy}
    out["sim"] = {**out.get("sim", {}), "steps": steps}
    return out


def summarize_run(report: Report) -> dict:
    steps = report.step_times_s
    steady = steps[1:] if len(steps) > 1 else steps  # step 0 runs on the unmigrated placement
    mig = report.migration or {}
    return {"step_time_s": float(np.mean(steady)), "mfu": report.mfu * report.step_time_s / np.mean(steady),
            "tflops_per_gpu": report.tflops_per_gpu * report.step_time_s / np.mean(steady),
            "lif": (report.imbalance or {}).get("overall", {}).get("lif", 1.0),
            "experts_moved": mig.get("experts_moved", 0), "bytes_moved_per_group": mig.get("bytes_moved_per_group", 0),
            "migration_time_fraction": mig.get("time_fraction", 0.0)}


def sweep(raw: dict, *, kind: str, skews: list[float], policies: list[str], steps: int, out: Path,
          log: Callable[[str], None]) -> Path:
    if kind not in SKEW_PARAM:
        raise ConfigError("--kind", kind, f"one of {', '.join(SKEW_PARAM)}")
    path = out / "imbalance.csv"
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS)
        writer.writeheader()
        total = len(skews) * len(policies)
        for i, (skew, policy) in enumerate((s, p) for s in skews for p in policies):
            log(f"[{i + 1}/{total}] {kind} {SKEW_PARAM[kind]}={skew} policy={policy}")
            result = simulate(load_config(config_for(raw, kind, skew, policy, steps)))
            writer.writerow({"kind": kind, "skew": skew, "policy": policy, **summarize_run(result.report)})
            fh.flush()
    return path


def drift(raw: dict, *, policies: list[str], steps: int, rate: float, out: Path, log: Callable[[str], None]) -> Path:
    """Step time of every step under drifting hot experts, per policy."""
    path = out / "drift.csv"
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["policy", "step", "step_time_s"])
        for policy in policies:
            log(f"drift: policy={policy}, {steps} steps")
            cfg = load_config(config_for(raw, "drift", None, policy, steps, {"rate": rate}))
            for step, t in enumerate(simulate(cfg).report.step_times_s):
                writer.writerow([policy, step, t])
            fh.flush()
    return path


def write_plots(out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    paths = []
    if (out / "imbalance.csv").exists():
        df = pd.read_csv(out / "imbalance.csv")
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for policy, group in df.groupby("policy"):
            axes[0].plot(group["skew"], group["mfu"] * 100, "o-", label=policy)
            axes[1].plot(group["skew"], group["step_time_s"] * 1e3, "o-", label=policy)
        kind = df["kind"].iloc[0] if len(df) else ""
        for ax, label in zip(axes, ("MFU (%)", "step time (ms)"), strict=True):
            ax.set_xlabel(f"{kind} {SKEW_PARAM.get(kind, 'skew')}")
            ax.set_ylabel(label)
            ax.legend()
        fig.tight_layout()
        paths.append(out / "imbalance.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    if (out / "drift.csv").exists():
        df = pd.read_csv(out / "drift.csv")
        fig, ax = plt.subplots(figsize=(7, 4))
        for policy, group in df.groupby("policy"):
            ax.plot(group["step"], group["step_time_s"] * 1e3, "o-", label=policy)
        ax.set_xlabel("step")
        ax.set_ylabel("step time (ms)")
        ax.set_title("drifting hot experts")
        ax.legend()
        fig.tight_layout()
        paths.append(out / "drift.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths
