"""How sure a prediction is: an error band from the residuals of the published runs of the nearest family.

Owns Family (hardware: the profile's device_kind; dense or MoE; scale: GPU count bucket), the family of a config
and of a published run, ErrorBand and the rule that derives it, and its leave-one-family-out check.

The rule (docs/metrics.md, "Error band"): the published runs' scores of the same tier (validation/published/
scores-TIER.csv, written by `validate --published --out`) are the residuals e = predicted / measured - 1 of step
time. The nearest family with at least MIN_RUNS scored runs is taken, widening in this order: same hardware, dense
or MoE and scale; same hardware and dense or MoE; same hardware; every run (hardware first: a device's software
stack moves every run on it, dense or MoE). Over its runs the measured step
relative to the predicted one, 1 / (1 + e) - 1, ranges from `low` to `high`: the band says the measured step is
expected between (1 + low) and (1 + high) times the prediction. Must not import torch.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from piper_sim.paths import data_dir
from piper_sim.workload.profile_file import profile_device_kind

MIN_RUNS = 3
SCALES = ((64, "<=64 GPUs"), (512, "65-512 GPUs"), (None, ">512 GPUs"))


def scale_of(num_gpus: int) -> str:
    for limit, label in SCALES:
        if limit is None or num_gpus <= limit:
            return label
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class Family:
    hardware: str  # the profile's device_kind (mi250x, a100, h100, cpu, ...); "" when the profile names none
    moe: bool
    scale: str

    def label(self, depth: int = 3) -> str:
        """Words for the first `depth` of (hardware, dense or MoE, scale); depth 0: every run."""
        parts = [self.hardware or "unnamed hardware", "MoE" if self.moe else "dense", self.scale][:depth]
        return " ".join(parts) if parts else "every published run"

    def key(self, depth: int) -> tuple:
        return (self.hardware, self.moe, self.scale)[:depth]


def family_of(cfg) -> Family:
    """The family of a resolved Config."""
    model = cfg.model
    return Family(
        hardware=profile_device_kind(cfg.cost_profile),
        moe=model.num_experts > 1 and bool(model.moe_layer_indices),
        scale=scale_of(cfg.parallel.num_gpus),
    )


@dataclass(frozen=True, kw_only=True)
class ErrorBand:
    low: float  # measured step / predicted step - 1, lowest over the family's runs
    high: float  # ... highest
    family: str  # the family whose runs gave it, in words
    runs: int
    tier: str

    def to_dict(self) -> dict:
        return {"low": self.low, "high": self.high, "family": self.family, "runs": self.runs, "tier": self.tier}


def published_root() -> Path:
    return data_dir("validation") / "published"


@functools.cache
def scored_families(tier: str, root: Path | None = None) -> pd.DataFrame:
    """The shipped scores of a tier with each run's family (columns name, error, hardware, moe, scale), as
    `validate --published --out` writes them; empty where the file or its family columns are missing."""
    path = (root or published_root()) / f"scores-{tier}.csv"
    columns = ["name", "error", "hardware", "moe", "scale"]
    scores = pd.read_csv(path) if path.exists() else pd.DataFrame(columns=columns)
    if not set(columns) <= set(scores.columns):
        return pd.DataFrame(columns=columns)
    scores["hardware"] = scores["hardware"].fillna("")
    return scores[columns].astype({"moe": bool})


def band_from(family: Family, scored: pd.DataFrame, tier: str) -> ErrorBand | None:
    """The band of the nearest family with at least MIN_RUNS runs in `scored` (None when scored is empty)."""
    if scored.empty:
        return None
    for depth in (3, 2, 1, 0):
        key = family.key(depth)
        mask = pd.Series(True, index=scored.index)
        for column, value in zip(("hardware", "moe", "scale"), key, strict=False):
            mask &= scored[column] == value
        chosen = scored[mask]
        if len(chosen) >= MIN_RUNS or depth == 0:
            measured_over_predicted = 1 / (1 + chosen["error"]) - 1
            return ErrorBand(
                low=float(measured_over_predicted.min()),
                high=float(measured_over_predicted.max()),
                family=family.label(depth),
                runs=len(chosen),
                tier=tier,
            )
    raise AssertionError("unreachable")


def error_band(cfg, tier: str = "des") -> ErrorBand | None:
    """The expected error band of a prediction of this config at this tier (None without shipped scores)."""
    return band_from(family_of(cfg), scored_families(tier), tier)


def band_dict(cfg, tier: str) -> dict | None:
    """report.json's error_band of a prediction of this config (None without shipped scores)."""
    band = error_band(cfg, tier)
    return band.to_dict() if band else None


def with_band(report, cfg, tier: str):
    """The report (analysis.run_report.Report) with its error band: what simulate's report.json carries. The band is
    added where a prediction is shown, not inside simulate(), so that a stored point does not read the scores."""
    return replace(report, error_band=band_dict(cfg, tier))


def band_text(band: dict) -> str:
    """A band (report.json's error_band) in words, as the commands print it."""
    return (
        f"{100 * band['low']:+.0f}% / {100 * band['high']:+.0f}% of the predicted step (measured/predicted - 1 "
        f"over {band['runs']} published runs: {band['family']}, {band['tier']} tier; docs/metrics.md)"
    )


def leave_one_family_out(scored: pd.DataFrame, tier: str) -> pd.DataFrame:
    """Per scored run (columns name, error, hardware, moe, scale): the band derived without any run of its own
    family (hardware and dense or MoE), and whether it covers the run's measured step."""
    rows = []
    for run in scored.itertuples(index=False):
        family = Family(run.hardware, bool(run.moe), run.scale)
        others = scored[~((scored["hardware"] == run.hardware) & (scored["moe"] == run.moe))]
        band = band_from(family, others, tier)
        actual = 1 / (1 + run.error) - 1
        rows.append(
            {
                "name": run.name,
                "family": family.label(2),
                "measured_over_predicted": actual,
                "band_low": band.low if band else float("nan"),
                "band_high": band.high if band else float("nan"),
                "band_family": band.family if band else "",
                "covered": bool(band and band.low <= actual <= band.high),
            }
        )
    return pd.DataFrame(rows)


def format_coverage(table: pd.DataFrame) -> str:
    """One line: how many runs the band covers under leave-one-family-out, overall and per family."""
    if table.empty:
        return ""
    per = table.groupby("family", sort=True)["covered"].agg(["sum", "size"])
    return (
        f"error band, leave-one-family-out: covers {int(table['covered'].sum())} of {len(table)} runs ("
        + ", ".join(f"{family} {int(r['sum'])}/{int(r['size'])}" for family, r in per.iterrows())
        + ")"
    )
