"""Core-sharing factor of cold-started work: does taking turns on a core still cost CPU time when every
iteration starts with cold caches anyway?

calibrate measures the factor on a hot loop (forward + backward of one layer, repeated) and the
simulator multiplies the shared cores' work by it; the layer's ops are priced from their cold times
(each call after a cache flush). If the factor is mostly refilling caches after a switch, an iteration
that starts cold pays most of it already at one process per core. This prints both factors, measured
in alternating rounds with the same workers' code (torch_backend/bench/sharing.py), flushes untimed.

    python benchmarks/bench_core_sharing_cold.py [--preset tiny-moe] [--rounds 3] [--window-s 1.0]
"""

from __future__ import annotations

import argparse
import statistics

from piper_sim.torch_backend.bench.sharing import LEVELS_FULL, run_levels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny-moe")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window-s", type=float, default=1.0)
    args = parser.parse_args()
    ratios: dict[str, dict[int, list[float]]] = {"hot": {}, "cold": {}}
    level_1: dict[str, list[float]] = {"hot": [], "cold": []}
    for r in range(args.rounds):
        for mode in ("hot", "cold") if r % 2 == 0 else ("cold", "hot"):
            print(f"round {r + 1}/{args.rounds}: {mode} ...", flush=True)
            records = run_levels(args.preset, LEVELS_FULL, 1, args.window_s, lambda _m: None, cold=mode == "cold")
            base = records[0]["time_s"]
            level_1[mode].append(base)
            for rec in records:
                ratios[mode].setdefault(rec["ranks_per_core"], []).append(rec["time_s"] / base)
    hot_us, cold_us = (statistics.median(level_1[m]) * 1e6 for m in ("hot", "cold"))
    print(f"\nCPU time per iteration at 1 process per core (median): hot {hot_us:.0f} us, cold {cold_us:.0f} us")
    print("processes per core   " + "  ".join(f"{k:>5d}" for k in LEVELS_FULL))
    for mode in ("hot", "cold"):
        medians = (statistics.median(ratios[mode][k]) for k in LEVELS_FULL)
        print(f"{mode} factor (median)   " + "  ".join(f"{m:5.2f}" for m in medians))
        print(
            f"{mode} factor (rounds)   "
            + "  ".join(f"{min(ratios[mode][k]):.2f}-{max(ratios[mode][k]):.2f}" for k in LEVELS_FULL)
        )


if __name__ == "__main__":
    main()
