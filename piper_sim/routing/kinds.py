"""The registry of routing kinds and the checking of their parameters.

A routing kind turns a RoutingContext (one all-to-all: step, layer, microbatch, EP group, sources,
tokens per source) into raw routed rows counts[source, expert] (before any capacity limit); each row
sums to tokens_per_source x top_k. Kinds declare their parameters; routing.<key> not declared is a
ConfigError listing the allowed keys. Must not import simpy or torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from piper_sim.errors import ConfigError
from piper_sim.registry import Registry


@dataclass(frozen=True, kw_only=True)
class Param:
    """One routing parameter: default, a check/convert function and a description of allowed values."""

    default: Any
    allowed: str
    convert: Callable[[Any], Any]

    def read(self, key: str, value: Any) -> Any:
        try:
            return self.convert(value)
        except (TypeError, ValueError, OverflowError):
            raise ConfigError(f"routing.{key}", value, self.allowed) from None


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise TypeError
    return float(value)


def positive_float(default: Any) -> Param:
    def convert(value: Any) -> float:
        if (out := _number(value)) <= 0 or not np.isfinite(out):
            raise ValueError
        return out

    return Param(default=default, allowed="a positive number", convert=convert)


def non_negative_float(default: Any) -> Param:
    def convert(value: Any) -> float:
        if (out := _number(value)) < 0 or not np.isfinite(out):
            raise ValueError
        return out

    return Param(default=default, allowed="a number >= 0", convert=convert)


def fraction(default: Any, *, open_low: bool = True) -> Param:
    def convert(value: Any) -> float:
        out = _number(value)
        if not (0 < out <= 1 if open_low else 0 <= out <= 1):
            raise ValueError
        return out

    return Param(default=default, allowed="a number in (0, 1]" if open_low else "a number in [0, 1]", convert=convert)


def integer(default: Any, minimum: int = 0) -> Param:
    def convert(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
            raise ValueError
        return int(value)

    return Param(default=default, allowed=f"an integer >= {minimum}", convert=convert)


def choice(default: str, options: tuple[str, ...]) -> Param:
    def convert(value: Any) -> str:
        if value not in options:
            raise ValueError
        return str(value)

    return Param(default=default, allowed=f"one of {', '.join(options)}", convert=convert)


# a factor of num_experts / top_k or more already drops nothing; beyond this, sizes overflow
CAPACITY_FACTOR_LIMIT = 1e6


def capacity_param() -> Param:
    def convert(value: Any) -> float | None:
        if value is None:
            return None
        if not 0 < (out := _number(value)) <= CAPACITY_FACTOR_LIMIT:
            raise ValueError
        return out

    return Param(
        default=None,
        allowed=f"null (no dropping) or a positive number up to {CAPACITY_FACTOR_LIMIT:g}",
        convert=convert,
    )


COMMON_PARAMS: dict[str, Param] = {"capacity_factor": capacity_param()}


@dataclass(frozen=True, kw_only=True)
class RoutingContext:
    """Everything a kind may use to produce counts for one all-to-all."""

    step: int
    layer: int
    microbatch: int
    group: int
    num_sources: int
    tokens_per_source: int
    num_experts: int
    top_k: int
    seed: int
    params: Mapping[str, Any]
    state: Any = None  # what the kind's setup returned (a loaded trace, for kind trace)

    @property
    def rows_per_source(self) -> int:
        return self.tokens_per_source * self.top_k

    def rng(self, *extra: int) -> np.random.Generator:
        """Sampling noise: deterministic per (seed, step, layer, microbatch, group)."""
        return np.random.default_rng([self.seed, self.step, self.layer, self.microbatch, self.group, *extra])

    def layer_rng(self, tag: int) -> np.random.Generator:
        """Expert popularity: deterministic per (seed, layer); `tag` separates kinds."""
        return np.random.default_rng([self.seed, self.layer, tag])


@dataclass(frozen=True, kw_only=True)
class RoutingKind:
    """A registered routing kind.

    counts(ctx) -> int64 [num_sources, num_experts], rows summing to ctx.rows_per_source, each entry at
    most ctx.tokens_per_source (an expert gets at most one copy of each token). setup(params,
    num_experts, top_k) runs once per RoutingModel and returns state passed as ctx.state (or None).
    static: counts are the same for every (step, layer, microbatch, group).
    adjacent_experts: a token's top_k experts are adjacent in expert order (a round-robin gate), not a spread over
    all experts: how many GPUs and nodes a token reaches in an all-to-all that sends it once to each
    (collectives/deepep.py, Fanout).
    """

    name: str
    counts: Callable[[RoutingContext], np.ndarray]
    params: Mapping[str, Param] = field(default_factory=dict)
    setup: Callable[[Mapping[str, Any], int, int], Any] | None = None
    static: bool = False
    adjacent_experts: bool = False
    doc: str = ""

    def allowed_keys(self) -> list[str]:
        return sorted({*self.params, *COMMON_PARAMS})

    def read_params(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        """Checked parameters with defaults filled in; unknown or missing required keys are ConfigErrors."""
        spec = {**COMMON_PARAMS, **self.params}
        for key in raw:
            if key not in spec:
                raise ConfigError(
                    f"routing.{key}",
                    raw[key],
                    f"a parameter of routing kind {self.name!r}: one of {', '.join(self.allowed_keys())}",
                )
        out: dict[str, Any] = {}
        for key, param in spec.items():
            if key in raw:
                out[key] = param.read(key, raw[key])
            elif param.default is ...:
                raise ConfigError(f"routing.{key}", None, f"required for routing kind {self.name!r}: {param.allowed}")
            else:
                out[key] = param.default
        return out


ROUTING: Registry[RoutingKind] = Registry("routing.kind")


def register_kind(kind: RoutingKind) -> RoutingKind:
    return ROUTING.register(kind.name)(kind)
