"""What the commands that take a config share: its arguments, the outputs arguments, the notes and the files written.

Owns add_config_args (the config, --out, --set), add_outputs_args (--outputs, --perfetto, --perfetto-detail),
say_notes (the defaults a command chose, one line each on stderr), written (the files a run wrote) and the checks of a
time limit given on the command line (check_minutes, check_seconds). Imports only the stdlib and errors.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from piper_sim.errors import ConfigError


def add_config_args(p: argparse.ArgumentParser, out_required: bool = True) -> None:
    p.add_argument("config", help="YAML config (README.md, Configuration) or a shipped example name")
    p.add_argument("--out", required=out_required, type=Path, help="output directory")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set parallel.pp=4 (repeatable)",
    )


def add_outputs_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--outputs",
        default="all",
        metavar="report|trace|all",
        help="files to write: report (report.json, config.yaml, links.csv, link_kinds.csv), trace (those "
        "and the trace), all (those, the Perfetto trace and plots/; the default)",
    )
    p.add_argument(
        "--perfetto",
        default=None,
        metavar="none|json|gz|proto",
        help="the Perfetto trace of --outputs all: perfetto.json (json, the default), perfetto.json.gz "
        "(gz), perfetto.pftrace (proto: needs the perfetto package) or none",
    )
    p.add_argument(
        "--perfetto-detail",
        default="auto",
        metavar="auto|rank|stage",
        help="tracks of the Perfetto trace and the timeline plot: one per rank up to 200,000 trace rows "
        "and one per pipeline stage beyond (auto, the default), or rank or stage whatever the size",
    )


def say_notes(notes: list[str]) -> None:
    """The defaults a command chose without being told (piper_sim.notes), one line each."""
    for note in notes:
        print(f"piper-sim: note: {note}", file=sys.stderr)


def written(out: Path, paths: dict[str, Path]) -> str:
    """The files a run wrote, relative to its --out: 'config.yaml, report.json, ...'."""
    return ", ".join(sorted(str(p.relative_to(out)) for p in paths.values()))


def check_minutes(flag: str, value: float) -> float | None:
    """A limit in minutes given on the command line: a positive, finite number, or 0 for none (None)."""
    if not (math.isfinite(value) and value >= 0):
        raise ConfigError(flag, value, "a positive number of minutes, or 0 for no limit")
    return value or None


def check_seconds(flag: str, value: float | None) -> None:
    """A time limit given on the command line: a positive, finite number of seconds."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ConfigError(flag, value, "a positive, finite number of seconds")
