"""The point runner's command-line options (--scheduler, --workers, --dashboard), taken by every command that runs
points on it: `plan`, `sweep`, `study scaling`, `reproduce`. Argument parsing only (points.dask_runner reads them).
"""

from __future__ import annotations

import argparse


def add_engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="an existing Dask scheduler (tcp://host:8786); default: "
        "a LocalCluster of one single-threaded worker process per core",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="LocalCluster workers (default: one per core; 0: run in this process, no Dask)",
    )
    p.add_argument(
        "--dashboard",
        action="store_true",
        help="serve Dask's dashboard while the points run and print "
        "its address (needs bokeh; on --scheduler, the address of that scheduler's)",
    )
