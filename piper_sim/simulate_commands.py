"""`piper-sim simulate`, `schedule` and `presets`: argument parsing and printing only.

simulate runs one config on the simulator (the discrete-event tier, or the planner's estimator with --tier
estimate) and writes its report, trace, Perfetto trace and plots; schedule shows or exports the lowered schedule of
a config; presets lists the model and topology presets, cost profiles and example configs. Registered by
piper_sim.cli.build_parser (register_simulate, register_schedule, register_presets). What loads numpy, pandas,
simpy or networkx is imported by the command that runs it, so `piper-sim --help` stays fast. Writes only under --out.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from piper_sim.command_args import add_config_args, add_outputs_args, check_minutes, say_notes, written
from piper_sim.config import load_config
from piper_sim.errors import ConfigError, PiperError
from piper_sim.host_memory import MemoryGuard
from piper_sim.notes import config_notes, placement_notes
from piper_sim.paths import config_path, data_dir
from piper_sim.progress import enabled
from piper_sim.run_wall import DEFAULT_MAX_WALL_MINUTES
from piper_sim.rundir import finish, open_out_dir, out_file
from piper_sim.schedule.build import build_coarse_schedule, build_schedule
from piper_sim.schedule.grid import render_grid
from piper_sim.schedule.io import schedule_to_csv, schedule_to_json
from piper_sim.schedule.validate import check_schedule, dry_run
from piper_sim.workload.presets import list_presets, load_model
from piper_sim.workload.task_kinds import TaskKind


def register_simulate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="simulate one config; writes report, trace, Perfetto JSON, plots")
    add_config_args(p)
    p.add_argument(
        "--tier",
        choices=["des", "estimate"],
        default="des",
        help="des (default): the discrete-event "
        "simulation; estimate: the planner's analytic estimator (seconds at any scale; figures only a "
        "simulation gives are null in report.json)",
    )
    add_outputs_args(p)
    p.add_argument(
        "--max-wall-minutes",
        type=float,
        default=DEFAULT_MAX_WALL_MINUTES,
        metavar="N",
        help="refuse a run expected to take longer than N minutes on this machine (default "
        f"{DEFAULT_MAX_WALL_MINUTES:.0f}; 0: no limit); the estimate is shown before the run starts",
    )
    p.set_defaults(func=cmd_simulate)


def register_schedule(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("schedule", help="show or export the lowered schedule of a config")
    p.add_argument("action", choices=["show", "export"])
    add_config_args(p, out_required=False)
    p.add_argument("--width", type=int, default=160, help="grid width in characters")
    p.set_defaults(func=cmd_schedule)


def register_presets(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("presets", help="list model and topology presets")
    p.set_defaults(func=cmd_presets)


def cmd_simulate(args: argparse.Namespace) -> int:
    # the command's modules load numpy, pandas, networkx, simpy: not for --help
    from piper_sim.analysis.band import with_band
    from piper_sim.machine import build_machine
    from piper_sim.outputs import check_outputs, check_perfetto, format_report, write_run
    from piper_sim.run_wall import duration_text
    from piper_sim.simulator import check_wall, simulate
    from piper_sim.steady_state import short_runs, simulate_figures
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
    short = short_runs(cfg) if args.outputs == "report" else None  # no trace written: the step from short runs
    expected = (
        f"about {duration_text(short.wall_s)} (short runs of {', '.join(map(str, short.counts))} micro-batches, "
        "their figures extrapolated: docs/performance.md)"
        if short is not None and short.taken
        else check_wall(cfg, schedule, limit).text()
    )
    print(
        f"simulating {cfg.model.name} on {par.num_gpus} GPUs (pp {par.pp} x ep {par.ep} x dp {par.dp}{split}, "
        f"{cfg.schedule}, {par.num_microbatches} microbatches, all-to-all {cfg.collectives.all_to_all}): "
        f"{expected} expected ...",
        file=sys.stderr,
    )
    open_out_dir(args.out, "simulate")
    machine = build_machine(cfg)  # once, for the estimate and the simulation
    if short is not None and short.taken:
        figures = simulate_figures(cfg, machine=machine, progress=True, max_wall_minutes=limit, short=short)
        result = figures.result(cfg, schedule)
    else:
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
    if result.report.extrapolation == "near":
        counts = ", ".join(map(str, result.report.microbatches_simulated or []))
        say_notes(
            [
                f"figures from short runs of {counts} micro-batches: the step on the line they checked, the bubble, "
                "exposed communication and all-to-all bandwidth from the last two runs' slope, approximate (a "
                "contended plan's waiting still shifts between them; docs/performance.md, 'Long pipelines from short "
                "runs'); --outputs all simulates every micro-batch"
            ]
        )
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
