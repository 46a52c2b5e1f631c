"""The Piper paper's claims (reproduce/claims.yaml: text, where in the paper, the figure and range each allows) and
the verdict of a run's predicted figure against one.

Owns Claim, load_claims() and verdict(). A claim agrees when the predicted [min, max] lies inside its range widened
by its tolerance, partly when the two overlap, and disagrees otherwise. Must not import torch.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import yaml

CLAIMS_FILE = Path(__file__).with_name("claims.yaml")
VERDICTS = ("agrees", "partly", "disagrees")


@dataclass(frozen=True, kw_only=True)
class Claim:
    text: str
    where: str
    figure: str  # the name in Section.figures
    low: float
    high: float
    tolerance: float = 0.0
    reading: str = ""

    @property
    def bounds(self) -> tuple[float, float]:
        """The range widened by the tolerance (relative)."""
        return self.low * (1 - self.tolerance), self.high * (1 + self.tolerance)

    def range_text(self) -> str:
        lo, hi = self.bounds
        return f"{lo:.3g} to {hi:.3g}" if lo != hi else f"{lo:.3g}"


@functools.cache
def load_claims() -> tuple[dict, dict[str, Claim]]:
    """(the paper's source record, {experiment name: Claim})."""
    data = yaml.safe_load(CLAIMS_FILE.read_text())
    claims = {}
    for name, c in data["claims"].items():
        low, high = (float(v) for v in c["range"])
        claims[name] = Claim(
            text=c["text"],
            where=c["where"],
            figure=c["figure"],
            low=low,
            high=high,
            tolerance=float(c.get("tolerance", 0.0)),
            reading=c.get("reading", ""),
        )
    return data["source"], claims


def citation() -> str:
    source, _ = load_claims()
    return f'{source["authors"]}, "{source["title"]}", arXiv {source["arxiv"]} ({source["year"]})'


def verdict(claim: Claim, predicted: tuple[float, float]) -> str:
    """agrees / partly / disagrees: the predicted [min, max] against the claim's widened range."""
    lo, hi = claim.bounds
    p_lo, p_hi = min(predicted), max(predicted)
    if p_lo != p_lo or p_hi != p_hi:  # NaN: nothing predicted
        return "disagrees"
    if lo <= p_lo and p_hi <= hi:
        return "agrees"
    if p_lo <= hi and lo <= p_hi:
        return "partly"
    return "disagrees"
