"""Routing kind `trace`: replay a routing trace file (docs/routing.md, "Replay").

Simulated step s reads trace step (step_offset + s) mod S. Simulated layer l reads the trace layer with
the same model layer index (layers: exact, an error if absent) or trace layer position l mod L
(layers: wrap). When the trace has per-source counts for as many sources as the EP group, source r of
microbatch m replays source_counts[s, l, m mod M, r]; otherwise every source replays the layer's
aggregate counts[s, l]. Counts are scaled to the simulated rows per source (tokens_per_source x top_k)
by largest-remainder apportionment, so shares are kept and equal token counts replay exactly.
Replay is deterministic and ignores the seed and the EP group index. Must not import simpy or torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from piper_sim.errors import ConfigError
from piper_sim.paths import project_root
from piper_sim.routing.capacity import apportion, cap_rows
from piper_sim.routing.kinds import Param, RoutingContext, RoutingKind, choice, integer, register_kind
from piper_sim.routing.trace import RoutingTrace, TraceError, read_trace


def resolve_trace_path(path: str) -> Path:
    """Absolute paths as given; relative ones against the working directory, then the project root."""
    candidate = Path(path).expanduser()
    if candidate.is_absolute() or candidate.exists():
        return candidate
    rooted = project_root() / candidate
    return rooted if rooted.exists() else candidate


def load_trace(path: str, num_experts: int) -> RoutingTrace:
    """The trace a routing section replays, read (once: the config keeps the routing model built at load)."""
    resolved = resolve_trace_path(path)
    if not resolved.is_file():
        raise ConfigError(
            "routing.path",
            path,
            "an existing routing trace file (.npz; relative paths are looked "
            "up in the working directory, then the project root)",
        )
    try:
        trace = read_trace(resolved)
    except TraceError as exc:
        raise ConfigError(
            "routing.path", path, f"a routing trace (docs/routing.md); this file: {exc.message}"
        ) from None
    if trace.num_experts != num_experts:
        raise ConfigError(
            "routing.path",
            path,
            f"a trace with the model's {num_experts} experts (experts mismatch: the trace has {trace.num_experts})",
        )
    return trace


def _setup(params: Mapping[str, Any], num_experts: int, top_k: int) -> RoutingTrace:
    return load_trace(params["path"], num_experts)


def layer_position(trace: RoutingTrace, layer: int, mode: str, path: str) -> int:
    hits = np.flatnonzero(trace.layers == layer)
    if len(hits):
        return int(hits[0])
    if mode == "wrap":
        return layer % len(trace.layers)
    raise ConfigError(
        "routing.path",
        path,
        f"a trace with layer {layer} (missing layer: it has layers "
        f"{trace.layers.tolist()}); or set routing.layers: wrap",
    )


def replay_counts(ctx: RoutingContext) -> np.ndarray:
    trace: RoutingTrace = ctx.state
    s = (ctx.params["step_offset"] + ctx.step) % trace.num_steps
    pos = layer_position(trace, ctx.layer, ctx.params["layers"], ctx.params["path"])
    rows = ctx.rows_per_source
    per_source = trace.source_counts
    if per_source is not None and per_source.shape[3] == ctx.num_sources:
        block = per_source[s, pos, ctx.microbatch % per_source.shape[2]]
        counts = np.stack([apportion(rows, block[r]) for r in range(ctx.num_sources)])
        weights = block.sum(axis=0)
    else:
        weights = trace.counts[s, pos]
        counts = np.tile(apportion(rows, weights), (ctx.num_sources, 1))
    return cap_rows(counts, ctx.tokens_per_source, weights)


def _path_param() -> Param:
    def convert(value: Any) -> str:
        if not isinstance(value, str | Path) or not str(value):
            raise ValueError
        return str(value)

    return Param(default=..., allowed="the path of a routing trace (.npz)", convert=convert)


register_kind(
    RoutingKind(
        name="trace",
        counts=replay_counts,
        setup=_setup,
        params={"path": _path_param(), "layers": choice("exact", ("exact", "wrap")), "step_offset": integer(0)},
        doc="replay a routing trace file, scaled to the simulated tokens (docs/routing.md)",
    )
)
