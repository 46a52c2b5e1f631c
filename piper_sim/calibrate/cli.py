"""The `piper-sim calibrate` subcommand (its `register` is called by piper_sim.cli.build_parser).

Owns the arguments and what is printed; imports what runs a command only when it runs (so `piper-sim --help`
loads neither numpy nor torch). Must not import torch.
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
import time
from pathlib import Path

from piper_sim.errors import ConfigError, PiperError
from piper_sim.rundir import out_file


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("calibrate", help="micro-benchmark this machine (N ranks at once) and write a cost profile")
    p.add_argument("--out", type=Path, help="profile to write, e.g. traces/profiles/cpu-dev.yaml")
    p.add_argument("--ranks", type=int, default=1, help="ranks running every benchmark at once (default 1)")
    p.add_argument("--threads", type=int, help="intra-op threads per rank (default: cores // ranks, as `run` uses)")
    p.add_argument(
        "--quick", action="store_true", help="reduced sweep (about 5 minutes on 2 cores), for tests and a first profile"
    )
    p.add_argument("--testbed", metavar="PREFIX", help="also measure communication inside this running testbed")
    p.add_argument("--presets", default="tiny-moe,small-moe", help="model presets whose shapes are swept")
    p.add_argument("--timeout", type=float, help="seconds before the ranks are stopped")
    p.add_argument("--records", type=Path, help="also save the raw per-rank records (JSON) here")
    p.add_argument(
        "--refit",
        type=Path,
        nargs="+",
        metavar="RECORDS",
        help="instead of measuring: rebuild the --out profile from raw records saved with --records; "
        "several files (same sweep): the median of each measured number",
    )
    p.add_argument(
        "--benches",
        metavar="KINDS",
        help="instead of a full calibration: measure only these communication benchmarks (comma-separated: "
        "p2p, all_to_all, all_reduce, all_gather, reduce_scatter) and write them into the existing "
        "--out profile, calibrated with the same --ranks; the rest of it is kept",
    )
    p.add_argument(
        "--check",
        metavar="PROFILE",
        help="instead of calibrating: time real StageModule ops and compare with PROFILE's predictions",
    )
    p.set_defaults(func=cmd_calibrate)


def check_options(args: argparse.Namespace) -> None:
    """Every option checked before anything is measured."""
    for flag, value in (("--ranks", args.ranks), ("--threads", args.threads)):
        if value is not None and value < 1:
            raise ConfigError(flag, value, "a positive integer")
    if args.timeout is not None and not (math.isfinite(args.timeout) and args.timeout > 0):
        raise ConfigError("--timeout", args.timeout, "a positive, finite number of seconds")
    if args.benches is not None:
        for flag, given in (("--refit", args.refit), ("--check", args.check), ("--testbed", args.testbed)):
            if given:
                raise ConfigError(flag, given, "left out with --benches (which measures on local ranks into --out)")


def cmd_calibrate(args: argparse.Namespace) -> int:
    check_options(args)
    presets = tuple(s.strip() for s in args.presets.split(",") if s.strip())
    if args.check:
        # numpy, yaml: not for --help
        from piper_sim.calibrate.calibration import _busy_core_s, _own_core_s, foreign_cpu_share
        from piper_sim.calibrate.crosscheck import crosscheck, format_table  # numpy, yaml: not for --help

        started, busy0, own0 = time.perf_counter(), _busy_core_s(), _own_core_s()
        rows = crosscheck(args.check, presets=presets, ranks=args.ranks, threads=args.threads)
        foreign = foreign_cpu_share(busy0, own0, time.perf_counter() - started)
        print(format_table(rows))
        if foreign is not None:
            print(f"\nOther processes used {100 * foreign:.0f}% of the cores during this check.")
        return 0
    if args.out is None:
        raise PiperError("calibrate needs --out FILE.yaml (or --check PROFILE)")
    out_file(args.out, (".yaml", ".yml"))
    from piper_sim.calibrate.calibration import calibrate, refit_profile  # numpy, yaml: not for --help

    if args.refit:
        refit_profile(args.refit, args.out)
        print(f"wrote {args.out}")
        return 0
    if args.benches is not None:
        from piper_sim.calibrate.update import check_benches, update_network  # numpy, yaml: not for --help

        benches = check_benches(args.benches)
        command = _invocation(
            f"piper-sim calibrate --out {args.out} --ranks {args.ranks} --benches {','.join(benches)}"
        )
        print(f"measuring {', '.join(benches)} with {args.ranks} rank(s) into {args.out} ...", file=sys.stderr)
        update_network(
            args.out,
            ranks=args.ranks,
            benches=benches,
            quick=args.quick,
            command=command,
            timeout_s=args.timeout,
            records_out=args.records,
            threads=args.threads,
        )
        print(f"wrote {args.out}")
        return 0

    command = _invocation(
        f"piper-sim calibrate --out {args.out} --ranks {args.ranks}" + (" --quick" if args.quick else "")
    )
    print(f"calibrating with {args.ranks} rank(s), {'quick' if args.quick else 'full'} sweep ...", file=sys.stderr)
    profile = calibrate(
        args.out,
        ranks=args.ranks,
        quick=args.quick,
        testbed=args.testbed,
        presets=presets,
        command=command,
        timeout_s=args.timeout,
        threads=args.threads,
        records_out=args.records,
    )
    print(
        f"peak {profile['peak_bf16_TFLOPS'] * 1e3:.1f} GFLOP/s, launch {profile['kernel_launch_us']} us, "
        f"memory {profile['hbm_bandwidth_GBps']} GB/s, Adam {profile['optimizer_bytes_per_param']} B/param"
    )
    print(f"wrote {args.out}")
    return 0


def _invocation(fallback: str) -> str:
    """The command line as typed (what a profile records of how it was measured), or `fallback` where calibrate
    was called from Python."""
    return "piper-sim " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:2] == ["calibrate"] else fallback
