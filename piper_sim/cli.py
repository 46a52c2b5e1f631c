"""The piper-sim command line. One entry point; every command takes --set a.b=value overrides.

Errors a user can fix (PiperError) are printed as one line without a traceback, exit status 2.
Argument parsing and printing only: each command is registered by the module of its front (simulate_commands,
run_commands, validate_commands, and each package's cli.py). The top-level command modules import what loads numpy,
pandas, matplotlib, simpy, networkx or torch in the command that runs it; the planner's, the studies' and reproduce's
cli modules import the planner and the point runner at their top, so `piper-sim --help` loads numpy, pandas and
numba (about 1 s on 2 cores).
"""

from __future__ import annotations

import argparse
import sys

from piper_sim.stopping import Signals, Stopped, say_stopped, while_loading

with while_loading():  # Ctrl-C or SIGTERM while the commands' modules load: one line, exit 130 or 143
    from piper_sim.calibrate.cli import register as register_calibrate
    from piper_sim.errors import PiperError
    from piper_sim.importers.cli import register as register_import
    from piper_sim.planning.cli import register as register_plan
    from piper_sim.reproduce.cli import register as register_reproduce
    from piper_sim.run_commands import register_compare, register_run, register_testbed
    from piper_sim.rundir import write_error
    from piper_sim.simulate_commands import register_presets, register_schedule, register_simulate
    from piper_sim.studies.cli import register as register_study
    from piper_sim.studies.cli import register_sweep
    from piper_sim.validate_commands import register_validate
    from piper_sim.version import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="piper-sim", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"piper-sim {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    register_simulate(sub)
    register_schedule(sub)
    register_run(sub)
    register_validate(sub)
    register_testbed(sub)
    register_compare(sub)
    register_presets(sub)
    register_study(sub)
    register_calibrate(sub)
    register_plan(sub)
    register_sweep(sub)
    register_reproduce(sub)
    register_import(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; SIGINT and SIGTERM end it with one line and 130 or 143 wherever they land (stopping.py)."""
    with Signals() as signals:
        try:
            args = build_parser().parse_args(argv)
            return args.func(args)
        except Stopped as exc:
            signals.hold()
            return exc.code
        except BaseException as exc:  # a signal's stop may come out as any exception (stopping.py)
            code = signals.stop_code(exc)
            if code is None and isinstance(exc, PiperError | OSError):
                return _say_error(exc)
            if code is None or (isinstance(exc, SystemExit) and signals.received is None):
                raise
            say_stopped(code)
            return code


def _say_error(exc: PiperError | OSError) -> int:
    """An error the user can fix, one line: exit status 2. A refused file operation (disk full, permissions) names
    the file."""
    exc = (write_error(exc) or exc) if isinstance(exc, OSError) else exc  # in an --out folder: names --out
    if isinstance(exc, PiperError):
        print(f"piper-sim: error: {exc}", file=sys.stderr)
    else:
        where = exc.filename if exc.filename is not None else type(exc).__name__
        print(f"piper-sim: error: {where}: {exc.strerror or exc}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
