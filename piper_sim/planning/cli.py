"""`piper-sim plan`: argument parsing and printing only; its machine options and checks (add_machine_args,
check_machine, say_space_notes) serve `study scaling` too.

Registered by piper_sim.cli.build_parser. Writes only under --out.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from piper_sim.bounds import GPUS_LIMIT
from piper_sim.collectives.algorithms import MEASURED_ALGORITHMS as LIBRARIES
from piper_sim.config import load_config
from piper_sim.errors import ConfigError, named_by
from piper_sim.machine import Machine, place_machine
from piper_sim.planning.plan_fixes import parse_fixes, split_settings
from piper_sim.planning.planner import DOMAINS, PlanRequest, plan
from piper_sim.planning.refine import parse_duration
from piper_sim.planning.space import space_notes
from piper_sim.points.cli import add_engine_args
from piper_sim.points.dask_runner import check_workers, configure_engine
from piper_sim.rundir import finish, open_out_dir
from piper_sim.topology.load import load_topology
from piper_sim.workload.presets import FIELD_LIMITS, load_model


def check_machine(request: PlanRequest) -> Machine:
    """The request's machine (planner.request_machine), built before any work from --topology and --profile: a bad
    one fails naming the flag and the config key it fills (topology, cost.profile), the value and what is allowed;
    a profile of other devices than the topology's fails unless --allow-device-mismatch. Says which profile was
    taken where --profile was not given."""
    with named_by("--topology"):
        topo = load_topology(request.topology, request.num_gpus)
    check_libraries(request, topo)
    with named_by("--profile"):
        choice = request.profile_choice()
        machine = place_machine(topo, request.num_gpus, "contiguous", choice.profile)
    if choice.reason:
        print(
            f"piper-sim: note: --profile not given: {choice.profile}, {choice.reason} (its peak FLOP/s, HBM and "
            "efficiencies price every plan)",
            file=sys.stderr,
        )
    return machine


def check_libraries(request: PlanRequest, topo) -> None:
    """A --fix of a communication library (rccl, nccl, deepep) the topology has no measured parameters for fails
    naming the --fix (rather than the topology key the first plan would miss)."""
    fixes = {
        "collectives.all_to_all": (request.fixed or {}).get("all_to_all", ()),
        "collectives.all_reduce": (request.all_reduce,),
    }
    have = [lib for lib in LIBRARIES if topo.collectives.get(lib)]
    for key, names in fixes.items():
        for name in names:
            if name in LIBRARIES and name not in have:
                raise ConfigError(
                    f"--fix {key}",
                    name,
                    f"a library topology {topo.name} has measured parameters for "
                    f"({', '.join(have) or 'none'}; topology.collectives), or an "
                    "algorithm that needs none (flat, halo, ring, ...)",
                )


def add_machine_args(p: argparse.ArgumentParser, topology_help: str = "topology preset or YAML path") -> None:
    p.add_argument("--topology", default="frontier", help=f"{topology_help} (default frontier)")
    p.add_argument(
        "--profile",
        default=None,
        help="device cost profile (traces/profiles/NAME.yaml; default: the "
        "topology's device_profile, mi250x where it names none)",
    )
    p.add_argument(
        "--allow-device-mismatch",
        action="store_true",
        help="price the topology with a profile of other devices than its own",
    )


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="choose the parallel plan of a model on N GPUs (memory, estimate, simulation)",
        description="Enumerate the plans of MODEL on --gpus GPUs that Piper's constraints allow, "
        "score each with the resource model and the analytic estimator, simulate the "
        "top K that fit, and rank them. See docs/planning.md.",
    )
    p.add_argument("model", help="model preset (piper-sim presets), a model YAML or a Hugging Face config.json")
    p.add_argument("--gpus", type=int, required=True, help="number of GPUs (GCDs on Frontier)")
    p.add_argument("--global-batch", type=int, required=True, help="sequences per training step")
    p.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (default: the model's)")
    add_machine_args(p)
    p.add_argument(
        "--fix",
        action="append",
        default=[],
        metavar="KEY=VALUE[,VALUE...]",
        help="fix or bound a knob, e.g. --fix parallel.pp=4 --fix schedule=1f1b,zb-h1 (repeatable); "
        "collectives.all_reduce, cost.flash_attention and cost.precision take one value "
        "(docs/planning.md)",
    )
    p.add_argument(
        "--top", type=int, default=16, help="plans refined with the simulator (default 16; 0: estimate only)"
    )
    p.add_argument(
        "--budget",
        default=None,
        metavar="DURATION",
        help="refine as many of the top plans as fit in this time, e.g. 90s, 3min, 1h: in the order of "
        "their estimates, each started while its predicted wall fits in the time left (default: "
        "no limit; docs/planning.md)",
    )
    p.add_argument(
        "--ep-domain",
        choices=DOMAINS,
        default="switch",
        help="locality domain an EP group must fit in: a node, the nodes on one switch (default), a "
        "dragonfly group, or any",
    )
    p.add_argument(
        "--convention",
        choices=("piper", "megatron"),
        default="piper",
        help="label the plans in piper-sim's degrees (default) or with Megatron-core's flags (TP, PP, EP, "
        "ETP, DP = GPUs / (TP x PP), VPP), in the table and as plans.csv's megatron column",
    )
    p.add_argument(
        "--reserve-GiB",
        type=float,
        default=None,
        help="framework reserve per GPU in GiB (default 10%% of HBM; docs/planning.md)",
    )
    add_engine_args(p)
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.set_defaults(func=cmd_plan)


def cmd_plan(args: argparse.Namespace) -> int:
    # the command's outputs (matplotlib.pyplot) and error band: not for --help
    from piper_sim.analysis.band import band_text
    from piper_sim.planning.plan_outputs import format_plan_table, megatron_label, write_plan

    for key, value in (("--gpus", args.gpus), ("--global-batch", args.global_batch)):
        if not 0 < value <= GPUS_LIMIT * 2**16:
            raise ConfigError(key, value, f"a positive integer up to {GPUS_LIMIT * 2**16:,}")
    if args.gpus > GPUS_LIMIT:
        raise ConfigError("--gpus", args.gpus, f"a positive integer up to {GPUS_LIMIT:,}")
    check_workers(args.workers)
    if args.top < 0:
        raise ConfigError("--top", args.top, "0 (estimate only) or a positive integer")
    budget_s = None if args.budget is None else parse_duration(args.budget, "--budget")
    if args.seq_len is not None and not 0 < args.seq_len <= FIELD_LIMITS["seq_len"]:
        raise ConfigError("--seq-len", args.seq_len, f"a positive integer up to {FIELD_LIMITS['seq_len']:,}")
    if args.reserve_GiB is not None and not (0 <= args.reserve_GiB < 1e6):
        raise ConfigError("--reserve-GiB", args.reserve_GiB, "a non-negative number of GiB")
    fixed, settings = split_settings(parse_fixes(args.fix))
    request = PlanRequest(
        model=args.model,
        num_gpus=args.gpus,
        global_batch=args.global_batch,
        topology=args.topology,
        profile=args.profile,
        seq_len=args.seq_len,
        allow_device_mismatch=args.allow_device_mismatch,
        fixed=fixed,
        top_k=args.top,
        domain=args.ep_domain,
        reserve_bytes=None if args.reserve_GiB is None else args.reserve_GiB * 2**30,
        **settings,
    )
    machine = check_machine(request)  # built once: the screen prices every plan on it
    say_space_notes(request)
    if args.seq_len is None:
        model = load_model(args.model)
        print(
            f"piper-sim: note: {model.name} is planned at the sequence length its preset or config file gives, "
            f"{model.seq_len:,} tokens (--seq-len to change it)",
            file=sys.stderr,
        )
    configure_engine(args.scheduler, args.workers, args.dashboard)
    open_out_dir(args.out, "plan", resume=True)
    result = plan(request, args.out, machine=machine, scheduler=args.scheduler, workers=args.workers, budget_s=budget_s)
    print(format_plan_table(result, convention=args.convention))
    if not math.isnan(result.rank_correlation):
        print(
            f"rank correlation (estimate vs simulation, {int(result.table['refined'].sum())} refined plans): "
            f"{result.rank_correlation:.2f}"
        )
    paths = write_plan(args.out, result, convention=args.convention)
    finish(args.out)
    if result.best is None:
        print("piper-sim: warning: no plan fits in memory; see why.md for the closest", file=sys.stderr)
        print(f"wrote {args.out}/ ({', '.join(p.name for p in paths.values())})")
        return 1
    label = megatron_label(result.best) if args.convention == "megatron" else result.best["label"]
    print(f"chosen: {label} -> {paths['best']}")
    band = chosen_band(result)
    if band is not None:
        print(f"error band of its step: {band_text(band)}")
    print(f"wrote {args.out}/ ({', '.join(p.name for p in paths.values())})")
    return 0


def say_space_notes(request: PlanRequest) -> None:
    """What the plan space took that --fix did not ask for (space.space_notes), one note line each."""
    with named_by("plan"):
        model = load_model(request.model_section())
    for note in space_notes(model, request.fixed):
        print(f"piper-sim: note: {note}", file=sys.stderr)


def chosen_band(result) -> dict | None:
    """The error band of the chosen plan's predicted step, at the tier that priced it (analysis/band.py)."""
    from piper_sim.analysis.band import band_dict  # not for --help

    return band_dict(load_config(result.best_config()), "des" if bool(result.best["refined"]) else "estimate")
