"""Score stored validation sets with the engine as it is (used for the experiments in this folder).

    python validation/experiments/score_sets.py PROFILE DIR [DIR ...] [--session ID]

Each DIR holds validation/ and topologies/ of one stored set (`git archive COMMIT validation topologies |
tar -x -C DIR`; sets.txt lists them). Prints, per set, MAPE, max error (and which case), the largest
HALO-over-flat error, dp2's error, the strict order swaps and the share of time with no rank computing,
then each case's error. With --session ID, each case is also scored against the median of the rounds of
that earlier measurement (its `session` id in measured.json), in the sets that have it.
Run it from the repository root with the experiment's patch applied (validation/experiments/README.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from piper_sim.validation.cases import find_cases
from piper_sim.validation.scoring import score_case
from piper_sim.validation.summary import summarize


def line(name: str, scores: list[dict]) -> str:
    sm = summarize(scores)
    worst = max(scores, key=lambda s: abs(s["error"]))
    halo = max(abs(h["error"]) for h in sm["halo_over_flat"])
    dp2 = next(s["error"] for s in scores if "dp2" in s["case"])
    conc = sm["compute_concurrency"]
    head = (
        f"{name:28s} MAPE {sm['mape'] * 100:5.1f}%  max {sm['max_error'] * 100:5.1f}% ({worst['case']})  "
        f"HALO {halo * 100:5.1f}%  dp2 {dp2 * 100:+5.1f}%  swaps {len(sm['order_swaps'])}  none computing "
        f"pred {conc['predicted_share_none_computing'] * 100:.0f}% "
        f"meas {conc['measured_share_none_computing'] * 100:.0f}%"
    )
    return "\n".join([head] + [f"    {s['case']:34s} {s['error'] * 100:+6.1f}%" for s in scores])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("profile")
    ap.add_argument("sets", nargs="+")
    ap.add_argument("--session", default="", help="id of an earlier measurement to score too")
    args = ap.parse_args()
    for d in args.sets:
        root = Path(d)
        cases = find_cases([str(p) for p in sorted((root / "validation/cases").iterdir())], root)
        scores = [score_case(c, args.profile) for c in cases]
        print(line(d, scores), flush=True)
        if args.session and all(args.session in s["measured_sessions"] for s in scores):
            again = []
            for s in scores:
                meas = float(np.median(s["measured_sessions"][args.session]))
                again.append(dict(s, measured_step_s=meas, error=s["predicted_step_s"] / meas - 1))
            print(line(f"{d}:{args.session}", again), flush=True)


if __name__ == "__main__":
    main()
