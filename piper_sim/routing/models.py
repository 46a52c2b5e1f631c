"""Expert routing models: how many tokens each source rank sends to each expert.

RoutingModel gives, for (step, layer, microbatch, group), an int array counts[source EP rank, expert]
of the rows dispatched (kept after the capacity limit). route() also returns the dropped rows. Kinds
live in the ROUTING registry (kinds.py; synthetic ones in samplers.py, `trace` in replay.py). Seeded
and deterministic. Must not import simpy or torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from piper_sim.errors import ConfigError
from piper_sim.routing import replay as _replay  # noqa: F401  (registers kind "trace")
from piper_sim.routing import samplers as _samplers  # noqa: F401  (registers the synthetic kinds)
from piper_sim.routing.capacity import RoutedCounts, apply_capacity, even_split, expert_capacity
from piper_sim.routing.kinds import ROUTING, RoutingContext, RoutingKind, register_kind
from piper_sim.routing.samplers import sample_counts

__all__ = ["ROUTING", "RoutingModel", "even_split", "register_routing", "routing_from_config"]


@dataclass(frozen=True, kw_only=True)
class RoutingModel:
    """A routing kind with checked parameters (defaults filled in) for one model's experts."""

    kind: str
    params: Mapping[str, Any]
    num_experts: int
    top_k: int
    seed: int = 0
    _state: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        spec = ROUTING.get(self.kind, "routing.kind")
        if self.top_k > self.num_experts or self.top_k <= 0:
            raise ConfigError("model.top_k", self.top_k, f"between 1 and num_experts ({self.num_experts})")
        params = spec.read_params(dict(self.params))
        object.__setattr__(self, "params", params)
        if spec.setup is not None:
            object.__setattr__(self, "_state", spec.setup(params, self.num_experts, self.top_k))

    @property
    def spec(self) -> RoutingKind:
        return ROUTING.get(self.kind)

    @property
    def is_uniform(self) -> bool:
        """Counts are identical for every (step, layer, microbatch, group): callers may compute them once."""
        return self.spec.static

    @property
    def adjacent_experts(self) -> bool:
        """A token's top_k experts are adjacent in expert order (RoutingKind.adjacent_experts)."""
        return self.spec.adjacent_experts

    @property
    def capacity_factor(self) -> float | None:
        return self.params["capacity_factor"]

    def capacity(self, tokens_per_source: int) -> int | None:
        """Rows one source may send one expert per all-to-all; None in no-drop mode."""
        return expert_capacity(self.capacity_factor, tokens_per_source, self.top_k, self.num_experts)

    def context(
        self, step: int, layer: int, microbatch: int, group: int, num_sources: int, tokens_per_source: int
    ) -> RoutingContext:
        return RoutingContext(
            step=step,
            layer=layer,
            microbatch=microbatch,
            group=group,
            num_sources=num_sources,
            tokens_per_source=tokens_per_source,
            num_experts=self.num_experts,
            top_k=self.top_k,
            seed=self.seed,
            params=self.params,
            state=self._state,
        )

    def route(
        self, step: int, layer: int, microbatch: int, group: int, num_sources: int, tokens_per_source: int
    ) -> RoutedCounts:
        """Kept and dropped rows [source, expert] for one all-to-all; kept + dropped rows sum to tokens x top_k."""
        ctx = self.context(step, layer, microbatch, group, num_sources, tokens_per_source)
        raw = self.spec.counts(ctx)
        return apply_capacity(raw, self.capacity(tokens_per_source))

    def counts(
        self, step: int, layer: int, microbatch: int, group: int, num_sources: int, tokens_per_source: int
    ) -> np.ndarray:
        """counts[source, expert]: rows dispatched (after dropping); exact even split under uniform routing."""
        return self.route(step, layer, microbatch, group, num_sources, tokens_per_source).kept


def routing_from_config(raw: dict, num_experts: int, top_k: int, seed: int) -> RoutingModel:
    """The `routing:` section -> RoutingModel. Unknown keys are ConfigErrors naming routing.<key>."""
    if not isinstance(raw, dict) or "kind" not in raw:
        raise ConfigError("routing", raw, f"a mapping with kind: one of {', '.join(ROUTING.names())}")
    params = {k: v for k, v in raw.items() if k != "kind"}
    return RoutingModel(kind=str(raw["kind"]), params=params, num_experts=num_experts, top_k=top_k, seed=seed)


Sampler = Callable[[np.random.Generator, int, int, dict], np.ndarray]  # (rng, E, rows, params) -> probs


def register_routing(name: str, params: Mapping[str, Any] | None = None) -> Callable[[Sampler], Sampler]:
    """Register a popularity sampler (rng seeded per (seed, layer), E, rows, params) -> probabilities as a kind."""

    def add(sampler: Sampler) -> Sampler:
        def counts(ctx: RoutingContext) -> np.ndarray:
            probs = sampler(ctx.layer_rng(1000), ctx.num_experts, ctx.rows_per_source, dict(ctx.params))
            return sample_counts(ctx, probs)

        register_kind(RoutingKind(name=name, counts=counts, params=dict(params or {})))
        return sampler

    return add
