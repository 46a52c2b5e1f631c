"""Regenerate traces/routing/x-moe-small-drift-synthetic.npz (a synthetic routing trace; see README.md).

Run from the repository root: python traces/routing/make_synthetic.py
Deterministic: the same piper-sim version and numpy give the same file contents.
"""

from __future__ import annotations

from pathlib import Path

from piper_sim.routing.models import routing_from_config
from piper_sim.routing.synth import synthesize_trace
from piper_sim.routing.trace import write_trace
from piper_sim.workload.presets import load_model

OUT = Path(__file__).with_name("x-moe-small-drift-synthetic.npz")
ROUTING = {"kind": "drift", "shape": "zipf", "exponent": 0.8, "rate": 0.25}
SEED, STEPS, MICROBATCHES, SOURCES, TOKENS_PER_SOURCE = 7, 32, 4, 8, 2048


def main() -> None:
    spec = load_model("x-moe-small")
    routing = routing_from_config(dict(ROUTING), spec.num_experts, spec.top_k, SEED)
    trace = synthesize_trace(
        routing,
        model_name=spec.name,
        layers=list(spec.moe_layer_indices),
        steps=STEPS,
        num_microbatches=MICROBATCHES,
        num_sources=SOURCES,
        tokens_per_source=TOKENS_PER_SOURCE,
        per_source=False,
        source=(
            f"synthetic, not captured: piper-sim routing kind drift {ROUTING} seed {SEED} for the x-moe-small "
            f"preset; per step {MICROBATCHES} microbatches x {SOURCES} EP sources x {TOKENS_PER_SOURCE} tokens "
            "(one 2048-token sequence per source and microbatch); made by traces/routing/make_synthetic.py"
        ),
    )
    print(write_trace(trace, OUT), trace.counts.shape, f"{OUT.stat().st_size} bytes")


if __name__ == "__main__":
    main()
