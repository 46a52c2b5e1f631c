"""Expert routing models: how many tokens each source rank sends to each expert.

Owns the registry of routing models. A model gives, for (step, layer, microbatch, group), an int
array counts[source EP rank, expert] whose rows sum to tokens x top_k. Seeded and deterministic.
Must not import simpy or torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from piper_sim.errors import ConfigError
from piper_sim.registry import Registry

Sampler = Callable[[np.random.Generator, int, int, dict], np.ndarray]  # (rng, E, rows, params) -> probs
ROUTING: Registry[Sampler] = Registry("routing.kind")
register_routing = ROUTING.register


def even_split(total: int, num_parts: int) -> np.ndarray:
    """total split into num_parts integers differing by at most one (the first get the extra)."""
    base, extra = divmod(total, num_parts)
    out = np.full(num_parts, base, dtype=np.int64)
    out[:extra] += 1
    return out


@register_routing("uniform")
def uniform_probs(rng: np.random.Generator, num_experts: int, rows: int, params: dict) -> np.ndarray:
    return np.full(num_experts, 1.0 / num_experts)


@register_routing("zipf")
def zipf_probs(rng: np.random.Generator, num_experts: int, rows: int, params: dict) -> np.ndarray:
    """Expert popularity ~ 1 / rank^exponent, experts shuffled by the seed (which experts are hot)."""
    exponent = float(params.get("exponent", 1.0))
    weights = 1.0 / np.arange(1, num_experts + 1) ** exponent
    return rng.permutation(weights / weights.sum())


@dataclass(frozen=True, kw_only=True)
class RoutingModel:
    kind: str
    params: dict
    num_experts: int
    top_k: int
    seed: int = 0

    def __post_init__(self) -> None:
        ROUTING.get(self.kind, "routing.kind")

    @property
    def is_uniform(self) -> bool:
        return self.kind == "uniform"

    def counts(self, step: int, layer: int, microbatch: int, group: int, num_sources: int,
               tokens_per_source: int) -> np.ndarray:
        """counts[source, expert] for one all-to-all; exact even split under uniform routing."""
        rows = tokens_per_source * self.top_k
        if self.is_uniform:
            return np.tile(even_split(rows, self.num_experts), (num_sources, 1))
        rng = np.random.default_rng([self.seed, step, layer, microbatch, group])
        probs = ROUTING.get(self.kind)(np.random.default_rng([self.seed, layer]), self.num_experts, rows,
                                       self.params)
        return rng.multinomial(rows, probs, size=num_sources).astype(np.int64)


def routing_from_config(raw: dict, num_experts: int, top_k: int, seed: int) -> RoutingModel:
    if not isinstance(raw, dict) or "kind" not in raw:
        raise ConfigError("routing", raw, f"a mapping with kind: one of {', '.join(ROUTING.names())}")
    params = {k: v for k, v in raw.items() if k != "kind"}
    return RoutingModel(kind=str(raw["kind"]), params=params, num_experts=num_experts, top_k=top_k, seed=seed)
