"""The piper-sim command line. One entry point; every command takes --set a.b=value overrides.

Errors a user can fix (PiperError) are printed as one line without a traceback, exit status 2.
What a command needs is imported at the top where it is cheap; what loads numpy, pandas, matplotlib,
simpy, networkx or torch is imported by the command that runs it, so `piper-sim --help` stays fast.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

from piper_sim.stopping import Signals, Terminated, say_stopped, while_loading

with while_loading():  # Ctrl-C or SIGTERM while the commands' modules load: one line, exit 130 or 143
    from piper_sim import testbed
    from piper_sim.calibrate.cli import register as register_calibrate
    from piper_sim.config import load_config
    from piper_sim.errors import ConfigError, PiperError, named_by
    from piper_sim.host_memory import MemoryGuard
    from piper_sim.importers.cli import register as register_import
    from piper_sim.notes import config_notes, placement_notes
    from piper_sim.paths import config_path, data_dir
    from piper_sim.planning.cli import register as register_plan
    from piper_sim.progress import bar as progress_bar
    from piper_sim.progress import enabled
    from piper_sim.reproduce.cli import register as register_reproduce
    from piper_sim.run_wall import DEFAULT_MAX_WALL_MINUTES
    from piper_sim.rundir import finish, open_out_dir, out_file, write_error
    from piper_sim.schedule.build import build_coarse_schedule, build_schedule
    from piper_sim.schedule.grid import render_grid
    from piper_sim.schedule.io import schedule_to_csv, schedule_to_json
    from piper_sim.schedule.validate import check_schedule, dry_run
    from piper_sim.studies.cli import register as register_study
    from piper_sim.studies.cli import register_sweep
    from piper_sim.version import __version__
    from piper_sim.workload.presets import list_presets, load_model
    from piper_sim.workload.task_kinds import TaskKind


def _add_config_args(p: argparse.ArgumentParser, out_required: bool = True) -> None:
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


def _add_outputs_arg(p: argparse.ArgumentParser) -> None:
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


def cmd_simulate(args: argparse.Namespace) -> int:
    # the command's modules load numpy, pandas, networkx, simpy: not for --help
    from piper_sim.analysis.band import with_band
    from piper_sim.machine import build_machine
    from piper_sim.outputs import check_outputs, check_perfetto, format_report, write_run
    from piper_sim.simulator import check_wall, simulate
    from piper_sim.trace.tracks import check_detail

    perfetto = check_perfetto(check_outputs(args.outputs), args.perfetto)
    check_detail(args.perfetto_detail)
    cfg = load_config(config_path(args.config), args.overrides)
    say_notes(config_notes(cfg))
    if args.tier == "estimate":
        return _estimate(args, cfg)
    limit = check_minutes("--max-wall-minutes", args.max_wall_minutes)
    par = cfg.parallel
    split = (
        f", tp {par.tp}" + (f", etp {par.etp}" if par.etp > 1 else "") + (", sp" if par.sp else "")
        if par.tp > 1
        else ""
    )
    schedule = build_schedule(cfg)
    work = check_wall(cfg, schedule, limit)
    print(
        f"simulating {cfg.model.name} on {par.num_gpus} GPUs (pp {par.pp} x ep {par.ep} x dp {par.dp}{split}, "
        f"{cfg.schedule}, {par.num_microbatches} microbatches, all-to-all {cfg.collectives.all_to_all}): "
        f"{work.text()} expected ...",
        file=sys.stderr,
    )
    open_out_dir(args.out, "simulate")
    machine = build_machine(cfg)  # once, for the estimate and the simulation
    result = simulate(
        cfg,
        schedule,
        machine=machine,
        progress=True,
        outputs=check_outputs(args.outputs),
        expected_s=_expected_s(cfg, machine),
        max_wall_minutes=limit,
    )
    result = replace(result, report=with_band(result.report, cfg, "des"))
    # what the machine was built as and where the ranks went, where that can change the answer
    say_notes(
        [f"topology {result.topology.name}: {note}" for note in result.topology.notes]
        + placement_notes(cfg, result.topology, result.placement)
    )
    with MemoryGuard(result.stats["host_memory_estimate_bytes"]) as guard:
        paths = write_run(
            args.out,
            result,
            args.outputs,
            perfetto=perfetto,
            detail=args.perfetto_detail,
            progress=True,
            check=guard.check,
        )
    finish(args.out)
    print(format_report(result.report))
    unfit = [p for p, fits in enumerate(result.report.fits_memory or []) if not fits]
    if unfit:
        print(
            f"piper-sim: warning: stage(s) {', '.join(map(str, unfit))} need more memory than the device has "
            f"({result.report.hbm_bytes / 2**30:.1f} GiB HBM less the framework reserve; docs/planning.md): "
            "this plan would not run; `piper-sim plan` lists plans that fit",
            file=sys.stderr,
        )
    print(f"wrote {args.out}/ ({written(args.out, paths)})")
    return 0


def written(out: Path, paths: dict[str, Path]) -> str:
    """The files a run wrote, relative to its --out: 'config.yaml, report.json, ...'."""
    return ", ".join(sorted(str(p.relative_to(out)) for p in paths.values()))


def _expected_s(cfg, machine) -> float | None:
    """The total of simulate's progress line where it shows: the simulated seconds the estimator expects."""
    from piper_sim.planning.estimate_report import expected_run_s  # simpy, numpy: not for --help

    return expected_run_s(cfg, machine) if enabled() else None


def _estimate(args: argparse.Namespace, cfg) -> int:
    """simulate --tier estimate: the planner's estimator on the config; report.json and config.yaml only."""
    # the command's modules load numpy, pandas, simpy: not for --help
    from piper_sim.analysis.band import with_band
    from piper_sim.outputs import format_report, write_estimate
    from piper_sim.planning.estimate_report import estimate_json, estimate_report, ignored_notes

    say_notes(ignored_notes(cfg))
    open_out_dir(args.out, "simulate")
    report = with_band(estimate_report(cfg), cfg, "estimate")
    write_estimate(args.out, cfg, estimate_json(report))
    finish(args.out)
    print(format_report(report))
    print(f"wrote {args.out}/ (report.json, config.yaml; the estimate tier runs no simulation: no trace or plots)")
    return 0


GRID_WIDTH = (20, 10_000)  # characters of `schedule show`'s grid


def cmd_schedule(args: argparse.Namespace) -> int:
    if not GRID_WIDTH[0] <= args.width <= GRID_WIDTH[1]:
        raise ConfigError("--width", args.width, f"from {GRID_WIDTH[0]} to {GRID_WIDTH[1]:,} characters")
    if args.action == "export":
        if args.out is None:
            raise PiperError("schedule export needs --out FILE (.json or .csv)")
        out_file(args.out, (".json", ".csv"))
    cfg = load_config(config_path(args.config), args.overrides)
    schedule = build_schedule(cfg)
    check_schedule(schedule)
    dry_run(schedule)
    if args.action == "show":
        print(
            f"{schedule.name}: pp {schedule.pp}, vpp {schedule.vpp}, {schedule.num_microbatches} microbatches, "
            f"{schedule.num_tasks()} tasks over {schedule.mesh.num_ranks} ranks (validated, no deadlock)"
        )
        print(
            render_grid(
                build_coarse_schedule(cfg),
                max_width=args.width,
                durations={
                    TaskKind.FORWARD: 1,
                    TaskKind.BACKWARD: 2,
                    TaskKind.BACKWARD_INPUT: 1,
                    TaskKind.BACKWARD_WEIGHT: 1,
                },
            )
        )
        return 0
    if args.out.suffix == ".json":
        args.out.write_text(schedule_to_json(schedule))
    else:
        schedule_to_csv(schedule, args.out)
    print(f"wrote {args.out}")
    return 0


def cmd_presets(args: argparse.Namespace) -> int:
    from piper_sim.topology.load import topology_presets  # networkx: not for --help

    print("models:")
    for name in list_presets():
        m = load_model(name)
        print(
            f"  {name:22s} {m.total_params() / 1e9:9.2f} B params, {m.active_params() / 1e9:8.2f} B active, "
            f"L {m.num_layers}, d {m.d_model}, E {m.num_experts}, top-{m.top_k}"
        )
    print("topologies: " + ", ".join(topology_presets()))
    profiles = sorted(p.stem for p in (data_dir("traces") / "profiles").glob("*.yaml"))
    print("cost profiles: " + ", ".join(profiles) + "  (cost.profile; traces/profiles/NAME.yaml)")
    examples = sorted(p.stem for p in data_dir("examples").glob("*.yaml"))
    print("example configs: " + ", ".join(examples) + "  (piper-sim simulate NAME)")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    # the command's modules load numpy, pandas, networkx (and torch when it runs): not for --help
    from piper_sim.measure import measure, run_devices
    from piper_sim.outputs import check_outputs, check_perfetto, format_report, write_run
    from piper_sim.trace.tracks import check_detail

    check_seconds("--timeout", args.timeout)
    perfetto = check_perfetto(check_outputs(args.outputs), args.perfetto)
    check_detail(args.perfetto_detail)
    cfg = load_config(config_path(args.config), args.overrides, devices=run_devices())
    say_notes(config_notes(cfg, ("seq_len", "cost.profile")))  # the profile gives the MFU's peak
    par = cfg.parallel
    open_out_dir(args.out, "run")
    print(
        f"running {cfg.model.name} on {par.num_gpus} local ranks for {cfg.steps} step(s) "
        f"(pp {par.pp} x ep {par.ep} x dp {par.dp}, {cfg.schedule}, all-to-all {cfg.collectives.all_to_all}) ...",
        file=sys.stderr,
    )
    result = measure(cfg, args.out, timeout_s=args.timeout, testbed=getattr(args, "testbed", None), progress=True)
    if result is None:  # a torchrun rank other than 0: rank 0 writes the run
        return 0
    paths = write_run(args.out, result, args.outputs, perfetto=perfetto, detail=args.perfetto_detail, progress=True)
    finish(args.out)
    print(format_report(result.report))
    print("loss per step       " + ", ".join(f"{x:.4f}" for x in result.report.losses))
    print(f"wrote {args.out}/ ({written(args.out, paths)})")
    return 0


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


def cmd_testbed(args: argparse.Namespace) -> int:
    if args.action == "up":
        if not args.target:
            raise PiperError("testbed up needs a topology (a testbed YAML such as topologies/testbed-2g.yaml)")
        try:
            bed = testbed.up(_topology_path(args.target), prefix=args.prefix)
        except (KeyboardInterrupt, Terminated) as exc:  # up() removed what it had created and holds the signals
            print(
                f"piper-sim: testbed up stopped part-way; what it had created is removed (`piper-sim testbed "
                f"status --prefix {args.prefix}` shows nothing left)",
                file=sys.stderr,
            )
            raise Stopped(130 if isinstance(exc, KeyboardInterrupt) else 143) from None
        for rank, (ns, ip) in sorted(bed.rank_map().items()):
            print(f"rank {rank}: namespace {ns}, {ip}")
        print(f"testbed {args.prefix} is up; `piper-sim testbed run CONFIG --out DIR` runs on it")
    elif args.action == "down":
        removed = testbed.down(prefix=args.prefix)
        print(f"testbed {args.prefix} removed: " + ", ".join(f"{len(v)} {k}" for k, v in removed.items()))
    elif args.action == "status":  # exit status 0 only when the testbed is up and complete
        state = testbed.status(prefix=args.prefix)
        print(json.dumps(state, indent=2, default=str))
        return 0 if state["healthy"] else 1
    else:  # run
        if not args.target or args.out is None:
            raise PiperError("testbed run needs CONFIG and --out DIR")
        args.config, args.testbed = args.target, args.prefix
        try:
            return cmd_run(args)
        except (KeyboardInterrupt, Terminated):  # the ranks are stopped on the way out; the namespaces are not
            print(
                f"piper-sim: the testbed stays up: `piper-sim testbed down --prefix {args.prefix}` removes it",
                file=sys.stderr,
            )
            raise
    return 0


def _topology_path(name: str) -> str:
    path = Path(name)
    if not path.exists() and not path.suffix and (data_dir("topologies") / f"{name}.yaml").exists():
        return str(data_dir("topologies") / f"{name}.yaml")
    return name


def cmd_compare(args: argparse.Namespace) -> int:
    from piper_sim.analysis.compare import compare_runs, format_comparison  # pandas: not for --help

    if args.out is not None:
        open_out_dir(args.out, "compare")
    comparison = compare_runs(args.predicted, args.measured)
    print(format_comparison(comparison))
    if args.out is not None:
        comparison.by_kind.to_csv(args.out / "compare_by_kind.csv", index=False)
        comparison.by_step.to_csv(args.out / "compare_by_step.csv", index=False)
        comparison.headline.to_csv(args.out / "compare_headline.csv", index=False)
        finish(args.out)
        print(f"wrote {args.out}/compare_*.csv")
    return 0


def check_minutes(flag: str, value: float) -> float | None:
    """A limit in minutes given on the command line: a positive, finite number, or 0 for none (None)."""
    if not (math.isfinite(value) and value >= 0):
        raise ConfigError(flag, value, "a positive number of minutes, or 0 for no limit")
    return value or None


def check_seconds(flag: str, value: float | None) -> None:
    """A time limit given on the command line: a positive, finite number of seconds."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ConfigError(flag, value, "a positive, finite number of seconds")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="piper-sim", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"piper-sim {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("simulate", help="simulate one config; writes report, trace, Perfetto JSON, plots")
    _add_config_args(p)
    p.add_argument(
        "--tier",
        choices=["des", "estimate"],
        default="des",
        help="des (default): the discrete-event "
        "simulation; estimate: the planner's analytic estimator (seconds at any scale; figures only a "
        "simulation gives are null in report.json)",
    )
    _add_outputs_arg(p)
    p.add_argument(
        "--max-wall-minutes",
        type=float,
        default=DEFAULT_MAX_WALL_MINUTES,
        metavar="N",
        help="refuse a run expected to take longer than N minutes on this machine (default "
        f"{DEFAULT_MAX_WALL_MINUTES:.0f}; 0: no limit); the estimate is shown before the run starts",
    )
    p.set_defaults(func=cmd_simulate)
    p = sub.add_parser("schedule", help="show or export the lowered schedule of a config")
    p.add_argument("action", choices=["show", "export"])
    _add_config_args(p, out_required=False)
    p.add_argument("--width", type=int, default=160, help="grid width in characters")
    p.set_defaults(func=cmd_schedule)
    p = sub.add_parser("run", help="run the config for real with torch.distributed (local ranks); same outputs")
    _add_config_args(p)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before all ranks are stopped")
    p.add_argument("--testbed", metavar="PREFIX", help="run inside the emulated cluster of `testbed up`")
    _add_outputs_arg(p)
    p.set_defaults(func=cmd_run)
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
    p = sub.add_parser(
        "testbed",
        help="emulated multi-node cluster in network namespaces (root); status exits 0 "
        "only when it is up and complete, 1 otherwise",
    )
    p.add_argument("action", choices=["up", "down", "status", "run"])
    p.add_argument("target", nargs="?", help="up: topology YAML or preset; run: CONFIG")
    p.add_argument("--prefix", default="pst", help="name prefix of the namespaces (default pst)")
    p.add_argument("--out", type=Path, help="run: output directory")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--timeout", type=float, default=600.0)
    p.set_defaults(func=cmd_testbed)
    p = sub.add_parser("compare", help="predicted vs measured, joined task by task")
    p.add_argument("predicted", type=Path, help="run directory of `simulate`")
    p.add_argument("measured", type=Path, help="run directory of `run` (or another simulate)")
    p.add_argument("--out", type=Path, help="write compare_*.csv here")
    p.set_defaults(func=cmd_compare)
    p = sub.add_parser("presets", help="list model and topology presets")
    p.set_defaults(func=cmd_presets)
    register_study(sub)
    register_calibrate(sub)
    register_plan(sub)
    register_sweep(sub)
    register_reproduce(sub)
    register_import(sub)
    return parser


class Stopped(BaseException):
    """A command stopped by a signal has cleaned up and the process is to exit with `code`, its signals held
    ignored until it does (main does not restore them)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


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
