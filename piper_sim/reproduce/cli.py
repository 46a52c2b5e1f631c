"""`piper-sim reproduce`: argument parsing only (piper_sim.reproduce.run does the work). Writes only under --out."""

from __future__ import annotations

import argparse
from pathlib import Path

from piper_sim.points.cli import add_engine_args
from piper_sim.points.dask_runner import configure_engine
from piper_sim.rundir import finish, open_out_dir

# the experiments in run.EXPERIMENTS's order (named here so that --help loads no pandas; a test holds them equal)
NAMES = ("a2a-levels", "halo", "memory-map", "layer-ceiling", "models", "vs-xmoe", "weak-scaling", "migration")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "reproduce",
        help="the Piper paper's experiments on the simulator; writes DIR/report.md",
        description="Run the Piper paper's experiments on the simulator (plans chosen by the "
        "planner) and write DIR/report.md: per experiment a table, a plot, the paper's "
        "claim and what the simulator predicts. Resumable: rerun with the same --out. "
        f"Experiments: {', '.join(NAMES)}.",
    )
    p.add_argument("experiments", nargs="*", metavar="EXPERIMENT", help="experiments to run (default: all)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="fewer points (sizes, machine sizes, steps; the planner's estimate instead of simulated plans)",
    )
    add_engine_args(p)
    p.add_argument("--out", required=True, type=Path, help="output directory")
    p.set_defaults(func=cmd_reproduce)


def cmd_reproduce(args: argparse.Namespace) -> int:
    from piper_sim.reproduce.run import reproduce  # simpy, pandas, matplotlib: not for --help

    configure_engine(args.scheduler, args.workers, args.dashboard)
    open_out_dir(args.out, "reproduce", resume=True)  # finished points are kept: a rerun resumes
    reproduce(args.experiments, args.out, quick=args.quick, scheduler=args.scheduler, workers=args.workers)
    finish(args.out)
    return 0
