"""`piper-sim run`, `testbed` and `compare`: argument parsing and printing only.

run runs a config for real with torch.distributed on local ranks (or inside the emulated cluster of `testbed up`)
and writes the same outputs as simulate; testbed brings the emulated multi-node cluster up, down, shows its status
or runs a config on it; compare joins a predicted and a measured run task by task. Registered by
piper_sim.cli.build_parser (register_run, register_testbed, register_compare). What loads numpy, pandas, networkx or
torch is imported by the command that runs it, so `piper-sim --help` stays fast. Writes only under --out.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from piper_sim import testbed
from piper_sim.command_args import add_config_args, add_outputs_args, check_seconds, say_notes, written
from piper_sim.config import load_config
from piper_sim.errors import PiperError
from piper_sim.notes import config_notes
from piper_sim.paths import config_path, data_dir
from piper_sim.rundir import finish, open_out_dir
from piper_sim.stopping import Stopped, Terminated


def register_run(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run the config for real with torch.distributed (local ranks); same outputs")
    add_config_args(p)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before all ranks are stopped")
    p.add_argument("--testbed", metavar="PREFIX", help="run inside the emulated cluster of `testbed up`")
    add_outputs_args(p)
    p.set_defaults(func=cmd_run)


def register_testbed(sub: argparse._SubParsersAction) -> None:
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


def register_compare(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="predicted vs measured, joined task by task")
    p.add_argument("predicted", type=Path, help="run directory of `simulate`")
    p.add_argument("measured", type=Path, help="run directory of `run` (or another simulate)")
    p.add_argument("--out", type=Path, help="write compare_*.csv here")
    p.set_defaults(func=cmd_compare)


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
