"""Synthetic routing traces: record a routing model's decisions in the trace format (docs/routing.md).

Used for the shipped synthetic trace (traces/routing/make_synthetic.py) and for tests. Counts are the
routed rows before any capacity limit, as a router would report them. Must not import simpy or torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from piper_sim.routing.models import RoutingModel
from piper_sim.routing.trace import RoutingTrace


def synthesize_trace(
    routing: RoutingModel,
    *,
    model_name: str,
    layers: Sequence[int],
    steps: int,
    num_microbatches: int,
    num_sources: int,
    tokens_per_source: int,
    group: int = 0,
    per_source: bool = True,
    source: str = "",
) -> RoutingTrace:
    """Trace of `steps` steps: step s, layer l holds the routed rows of all microbatches and sources."""
    per = np.zeros((steps, len(layers), num_microbatches, num_sources, routing.num_experts), dtype=np.int64)
    for s in range(steps):
        for li, layer in enumerate(layers):
            for mb in range(num_microbatches):
                per[s, li, mb] = routing.route(s, layer, mb, group, num_sources, tokens_per_source).routed
    tokens = num_microbatches * num_sources * tokens_per_source
    made = source or (
        f"synthetic: routing kind {routing.kind} {dict(routing.params)} seed {routing.seed}, "
        f"{num_microbatches} microbatches x {num_sources} sources x {tokens_per_source} tokens"
    )
    return RoutingTrace(
        model=model_name,
        num_experts=routing.num_experts,
        top_k=routing.top_k,
        tokens_per_step=tokens,
        layers=np.asarray(layers, dtype=np.int64),
        counts=per.sum(axis=(2, 3)),
        steps=np.arange(steps, dtype=np.int64),
        source_counts=per if per_source else None,
        source=made,
    ).validate()
