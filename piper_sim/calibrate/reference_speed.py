"""The machine's reference speed: how fast this host runs the core-sharing benchmark's level 1 now.

Owns reference_speed, which `validate --remeasure` times before each round so that a measurement taken on
a slower or faster machine than its profile shows. The benchmark itself is
piper_sim.torch_backend.bench.sharing: only its worker processes load torch; this module and the driver
it calls do not.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

from piper_sim.torch_backend.bench.sharing import run_levels

REFERENCE_ROUNDS = 3
REFERENCE_WINDOW_S = 1.0


def reference_speed(preset: str, progress: Callable[[str], None] = lambda _msg: None) -> dict:
    """The machine's speed now, as calibrate saw it: the core-sharing benchmark's level 1 (one process per
    core, forward + backward of one layer of the preset) for three 1-second windows. Returns
    {preset, cores, cpu_us_per_iteration (median of the windows), window_means_us}. Used by validate
    --remeasure before each round, so a measurement taken on a slower or faster machine than its profile
    shows (about 6 s)."""
    (record,) = run_levels(preset, (1,), REFERENCE_ROUNDS, REFERENCE_WINDOW_S, progress)
    means = [t * 1e6 for t in record["window_means_s"]]
    return {
        "preset": preset,
        "cores": record["cores"],
        "cpu_us_per_iteration": round(statistics.median(means), 1),
        "window_means_us": [round(t, 1) for t in means],
    }
