"""`piper-sim validate`: argument parsing and printing only.

Predicts the measured validation cases from a calibrated profile (optionally remeasuring them first) and scores
the errors, or with --published scores the simulator (or the planner's estimator) on the published training runs.
Registered by piper_sim.cli.build_parser (register_validate). What loads numpy, pandas, simpy or matplotlib is
imported by the command that runs it, so `piper-sim --help` stays fast. Writes only under --out.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from piper_sim.errors import ConfigError, PiperError, named_by
from piper_sim.paths import data_dir
from piper_sim.progress import bar as progress_bar
from piper_sim.rundir import finish, open_out_dir


def register_validate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate", help="predict measured validation cases from a profile; score the errors")
    p.add_argument(
        "cases",
        nargs="*",
        help="case names or directories (default: all in validation/cases); with "
        "--published, run names of validation/published (published/NAME also works)",
    )
    p.add_argument(
        "--profile",
        help="calibrated cost profile (traces/profiles/NAME.yaml); required for testbed "
        "cases, not with --published (each run names its own)",
    )
    p.add_argument(
        "--published",
        action="store_true",
        help="score the simulator on the published training runs of validation/published instead of the testbed cases",
    )
    p.add_argument(
        "--tier",
        choices=["des", "estimate"],
        default="des",
        help="with --published: simulate each "
        "run (des, default) or price it with the planner's estimator (estimate: seconds for the whole set)",
    )
    p.add_argument("--remeasure", action="store_true", help="rerun the real side first (root for testbed cases)")
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="with --remeasure: runs per case; the run with the median step time is kept (default 1)",
    )
    p.add_argument("--out", type=Path, help="write validation.csv, phases.csv, summary.json and a plot here")
    p.set_defaults(func=cmd_validate)


def cmd_validate(args: argparse.Namespace) -> int:
    # the command's modules load numpy, pandas, simpy, matplotlib: not for --help
    from piper_sim.validation.cases import check_case_profile, find_cases
    from piper_sim.validation.remeasure import calibrated_ranks, remeasure
    from piper_sim.validation.report import format_validation, write_validation
    from piper_sim.validation.scoring import score_case
    from piper_sim.validation.summary import summarize
    from piper_sim.workload.profile import HostProfile
    from piper_sim.workload.profile_load import load_profiles

    if args.published or any(c.startswith("published/") for c in args.cases):
        return _validate_published(args)
    if not args.profile:
        raise PiperError("validate: --profile is required for testbed cases (e.g. --profile cpu-2rank)")
    if args.repeats < 1:
        raise ConfigError("--repeats", args.repeats, "a positive integer")
    cases = find_cases(args.cases, data_dir("validation") / "cases")
    with named_by("--profile"):  # a bad profile, or one of another device than a case's, fails before any measuring
        host = load_profiles(args.profile)[1] or HostProfile()
        for case in cases:
            check_case_profile(case, args.profile)
    if args.out is not None:
        open_out_dir(args.out, "validate")
    if args.remeasure:
        remeasure(
            cases,
            repeats=args.repeats,
            reference_preset=host.reference_preset,
            reference_profile=args.profile,
            reference_ranks=calibrated_ranks(args.profile),
            progress=lambda msg: print(msg, file=sys.stderr),
        )
    elif args.repeats != 1:
        raise PiperError("validate: --repeats applies to --remeasure only")
    scores = _scored(cases, "predicting", lambda case: score_case(case, args.profile))
    summary = summarize(scores)
    print(format_validation(scores, summary))
    if args.out is not None:
        write_validation(args.out, scores, summary)
        finish(args.out)
        print(
            f"wrote {args.out}/ (validation.csv, phases.csv, concurrency.csv, summary.json, predicted_vs_measured.png)"
        )
    return 1 if summary["outside_tolerance"] else 0


def _scored(items: list, verb: str, score) -> list[dict]:
    """score(item) for each validation case or published run, saying which one is under way, with a progress
    line of the cases done and an ETA."""
    out = []
    with progress_bar(len(items), "validate", "cases") as line:
        for i, item in enumerate(items):
            line.write(f"[{i + 1}/{len(items)}] {verb} {item.name} ...", file=sys.stderr)
            out.append(score(item))
            line.update(1)
    return out


def _validate_published(args: argparse.Namespace) -> int:
    # the command's modules load pandas, matplotlib: not for --help
    from piper_sim.analysis.band import format_coverage
    from piper_sim.validation.published import (
        band_coverage,
        breakdown_table,
        family_summary,
        find_published,
        format_breakdowns,
        format_families,
        format_published,
        score_published,
        summarize_published,
        write_published,
    )

    if args.remeasure or args.profile:
        raise PiperError("validate --published: --remeasure and --profile apply to testbed cases only")
    names = [c.removeprefix("published/") for c in args.cases]
    runs = find_published(names, data_dir("validation") / "published")
    if args.out is not None:  # claimed before the scoring, as validate does
        open_out_dir(args.out, "validate --published")
    scores = _scored(runs, "simulating", lambda run: score_published(run, args.tier))
    summary = summarize_published(scores)
    print(format_published(scores, summary))
    print(format_families(family_summary(scores)))
    print(format_coverage(band_coverage(scores)))
    breakdowns = breakdown_table(runs)
    if not breakdowns.empty:
        print(format_breakdowns(breakdowns))
    if args.out is not None:
        write_published(args.out, scores, summary)
        breakdowns.to_csv(args.out / "published_breakdowns.csv", index=False)
        finish(args.out)
        print(
            f"wrote {args.out}/ (published.csv, published_budget.csv, published_breakdowns.csv, "
            "published_families.csv, published_band_coverage.csv, published_summary.json, "
            "published_vs_predicted.png)"
        )
    return 0
