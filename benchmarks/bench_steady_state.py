"""Long pipelines from short runs (piper_sim/steady_state.py): wall time and step against the full simulation, in
the same process (prints figures; no assertions).

For each published run named (default: three long pipelines of validation/published/), the DES figures as
`validate --published` and the planner take them (simulate_figures: a few short runs, extrapolated where the step
is affine in the micro-batch count) and the full simulation of the configured count, with the ratio of their walls
and the relative difference of their step times.

    python benchmarks/bench_steady_state.py [NAME ...]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from piper_sim.config import load_config
from piper_sim.simulator import simulate
from piper_sim.steady_state import simulate_figures
from piper_sim.validation.published import load_published

DEFAULT = (
    "megatron2021-t2-174p6b-768gpu",
    "megatron2021-t2-529p6b-1120gpu",
    "mcore-qwen3-235b-h100-256gpu-tp4-ep8",
)
PUBLISHED = Path(__file__).resolve().parents[1] / "validation" / "published"


def main(names: list[str]) -> None:
    print(f"{'run':<40} {'M':>5} {'simulated':>12} {'short s':>8} {'full s':>8} {'ratio':>6} {'step diff':>10}")
    for name in names:
        cfg = load_config(load_published(PUBLISHED / f"{name}.yaml").config)
        t0 = time.perf_counter()
        steady = simulate_figures(cfg)
        t1 = time.perf_counter()
        full = simulate(cfg)
        t2 = time.perf_counter()
        counts = ",".join(map(str, steady.report.microbatches_simulated or []))
        diff = steady.report.step_time_s / full.report.step_time_s - 1
        print(
            f"{name:<40} {cfg.parallel.num_microbatches:>5} {counts:>12} {t1 - t0:>8.1f} {t2 - t1:>8.1f} "
            f"{(t2 - t1) / (t1 - t0):>5.1f}x {diff:>10.1e}",
            flush=True,
        )


if __name__ == "__main__":
    main(sys.argv[1:] or list(DEFAULT))
