"""Synthetic routing kinds: uniform, round_robin, zipf, dirichlet, hot, drift.

Each non-uniform kind defines an expert popularity (a probability per expert, which experts are
popular drawn from (seed, layer), and for drift also moving with the step), caps it at 1/top_k (an
expert gets at most one copy of each token), then samples each source's rows from a multinomial with
noise drawn from (seed, step, layer, microbatch, group). See docs/routing.md. No simpy, no torch.
"""

from __future__ import annotations

import numpy as np

from piper_sim.routing.capacity import cap_probabilities, cap_rows, even_split
from piper_sim.routing.kinds import (
    RoutingContext,
    RoutingKind,
    choice,
    fraction,
    non_negative_float,
    positive_float,
    register_kind,
)

# tags separating the popularity streams of different kinds under the same seed
_TAG = {"zipf": 0, "dirichlet": 1, "hot": 2, "drift": 3}


def sample_counts(ctx: RoutingContext, probs: np.ndarray) -> np.ndarray:
    """counts[source, expert]: multinomial rows from capped probabilities, overflow re-apportioned."""
    return _draw(ctx, cap_probabilities(probs, 1.0 / ctx.top_k))


def _draw(ctx: RoutingContext, probs: np.ndarray) -> np.ndarray:
    """sample_counts from probabilities already capped at 1 / top_k."""
    counts = ctx.rng().multinomial(ctx.rows_per_source, probs, size=ctx.num_sources).astype(np.int64)
    return cap_rows(counts, ctx.tokens_per_source, probs)


def zipf_weights(num_experts: int, exponent: float) -> np.ndarray:
    """Popularity of the expert of rank r (1-based): r^-exponent, normalized."""
    w = 1.0 / np.arange(1, num_experts + 1, dtype=np.float64) ** exponent
    return w / w.sum()


def hot_weights(num_experts: int, fraction: float, share: float) -> np.ndarray:
    """First n_hot = max(1, round(fraction x E)) positions share `share`; the rest share 1 - share."""
    n_hot = hot_count(num_experts, fraction)
    if n_hot == num_experts:
        return np.full(num_experts, 1.0 / num_experts)
    w = np.full(num_experts, (1.0 - share) / (num_experts - n_hot))
    w[:n_hot] = share / n_hot
    return w


def hot_count(num_experts: int, fraction: float) -> int:
    return min(num_experts, max(1, round(fraction * num_experts)))


def rotate(weights: np.ndarray, offset: float) -> np.ndarray:
    """Weights shifted forward by a fractional number of positions (linear between integer shifts)."""
    whole = int(np.floor(offset))
    part = offset - whole
    return (1.0 - part) * np.roll(weights, whole) + part * np.roll(weights, whole + 1)


def _permuted(ctx: RoutingContext, weights: np.ndarray, kind: str) -> np.ndarray:
    """Position weights to expert probabilities: position j is expert perm[j], perm drawn from (seed, layer)."""
    perm = ctx.layer_rng(_TAG[kind]).permutation(ctx.num_experts)
    probs = np.empty(ctx.num_experts)
    probs[perm] = weights
    return probs


# ---- popularity per kind ------------------------------------------------------------------------
def zipf_popularity(ctx: RoutingContext) -> np.ndarray:
    return _permuted(ctx, zipf_weights(ctx.num_experts, ctx.params["exponent"]), "zipf")


def dirichlet_popularity(ctx: RoutingContext) -> np.ndarray:
    alpha = np.full(ctx.num_experts, ctx.params["concentration"])
    probs = ctx.layer_rng(_TAG["dirichlet"]).dirichlet(alpha)
    if not np.all(np.isfinite(probs)) or probs.sum() <= 0:  # tiny concentrations can underflow
        probs = np.nan_to_num(probs)
        if probs.sum() <= 0:
            probs = np.eye(ctx.num_experts)[ctx.layer_rng(_TAG["dirichlet"] + 100).integers(ctx.num_experts)]
    return probs / probs.sum()


def hot_popularity(ctx: RoutingContext) -> np.ndarray:
    return _permuted(ctx, hot_weights(ctx.num_experts, ctx.params["fraction"], ctx.params["share"]), "hot")


def drift_popularity(ctx: RoutingContext) -> np.ndarray:
    p = ctx.params
    if p["shape"] == "zipf":
        base = zipf_weights(ctx.num_experts, p["exponent"])
    else:
        base = hot_weights(ctx.num_experts, p["fraction"], p["share"])
    return _permuted(ctx, rotate(base, p["rate"] * ctx.step), "drift")


POPULARITY_MEMO = 4096  # capped popularities kept per kind (one per layer, and per step for drift)


def _sampled(popularity, by_step: bool = False):
    """A kind's counts: its popularity (drawn per (seed, layer), and step where by_step), capped once and kept, then
    each all-to-all's own multinomial draw."""
    memo: dict[tuple, np.ndarray] = {}

    def counts(ctx: RoutingContext) -> np.ndarray:
        key = (
            ctx.seed,
            ctx.layer,
            ctx.step if by_step else 0,
            ctx.num_experts,
            ctx.top_k,
            tuple(sorted(ctx.params.items())),
        )
        probs = memo.get(key)
        if probs is None:
            if len(memo) >= POPULARITY_MEMO:
                memo.clear()
            probs = memo[key] = cap_probabilities(popularity(ctx), 1.0 / ctx.top_k)
        return _draw(ctx, probs)

    return counts


def _uniform_counts(ctx: RoutingContext) -> np.ndarray:
    return np.tile(even_split(ctx.rows_per_source, ctx.num_experts), (ctx.num_sources, 1))


POPULARITY = {
    "zipf": zipf_popularity,
    "dirichlet": dirichlet_popularity,
    "hot": hot_popularity,
    "drift": drift_popularity,
}


def popularity(kind: str, ctx: RoutingContext) -> np.ndarray:
    """Expected share of routed rows per expert (before the 1/top_k cap) for a synthetic kind."""
    if kind == "uniform":
        return np.full(ctx.num_experts, 1.0 / ctx.num_experts)
    return POPULARITY[kind](ctx)


register_kind(
    RoutingKind(
        name="uniform",
        counts=_uniform_counts,
        static=True,
        doc="every source splits its tokens x top_k rows evenly over the experts (exact, no noise)",
    )
)
register_kind(
    RoutingKind(
        name="round_robin",
        counts=_uniform_counts,  # rows t x top_k + j go to expert (t x top_k + j) mod E: the same even split
        static=True,
        adjacent_experts=True,
        doc=(
            "token t takes the top_k adjacent experts from (t x top_k) mod num_experts on, as NeMo AutoModel's "
            "FakeBalancedGate assigns them: every expert the same rows, each token's experts on the few GPUs "
            "holding its block"
        ),
    )
)
register_kind(
    RoutingKind(
        name="zipf",
        counts=_sampled(zipf_popularity),
        params={"exponent": non_negative_float(1.0)},
        doc="expert of popularity rank r gets a share ~ r^-exponent; ranks shuffled per (seed, layer)",
    )
)
register_kind(
    RoutingKind(
        name="dirichlet",
        counts=_sampled(dirichlet_popularity),
        params={"concentration": positive_float(1.0)},
        doc="expert shares ~ Dirichlet(concentration x 1), drawn per (seed, layer); small concentration = skewed",
    )
)
register_kind(
    RoutingKind(
        name="hot",
        counts=_sampled(hot_popularity),
        params={"fraction": fraction(0.125), "share": fraction(0.5, open_low=False)},
        doc="round(fraction x E) experts (at least one) chosen per (seed, layer) get `share` of the rows",
    )
)
register_kind(
    RoutingKind(
        name="drift",
        counts=_sampled(drift_popularity, by_step=True),
        params={
            "shape": choice("hot", ("hot", "zipf")),
            "fraction": fraction(0.125),
            "share": fraction(0.5, open_low=False),
            "exponent": non_negative_float(1.0),
            "rate": non_negative_float(0.25),
        },
        doc="a hot or zipf popularity whose hot positions move `rate` experts per step (fractional rates blend)",
    )
)
