"""`piper-sim study all-to-all | collective | imbalance | scaling` and `piper-sim sweep`: the command-line front of
piper_sim.studies.

Registered by piper_sim.cli.build_parser. Writes only under --out. The collective studies write study.csv,
link_kinds.csv, study.yaml (the spec) and the plots (all-to-all: bandwidth.png, speedup.png, link_kinds.png,
tables.md; collective: bandwidth.png).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path

import yaml

from piper_sim.config import apply_overrides, read_config_file
from piper_sim.errors import ConfigError
from piper_sim.paths import config_path
from piper_sim.planning.cli import add_machine_args, check_machine, say_space_notes
from piper_sim.planning.plan_fixes import parse_fixes, split_settings
from piper_sim.planning.planner import DOMAINS, PlanRequest
from piper_sim.points.cli import add_engine_args
from piper_sim.points.dask_runner import check_workers, configure_engine
from piper_sim.rundir import finish, open_out_dir
from piper_sim.studies.model_size import moe_buffer, size_label
from piper_sim.yamlio import parse_yaml


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("study", help="what-if studies (collectives and their algorithms over machine sizes)")
    studies = p.add_subparsers(dest="study", required=True)
    a = studies.add_parser("all-to-all", help="one all-to-all alone on the machine: algorithms x nodes x sizes")
    a.add_argument("--topology", default="frontier", help="topology preset or YAML path")
    a.add_argument("--nodes", default="1,2,4,8,16,32,64,128,256,512", help="node counts, e.g. 1,2,4,8")
    a.add_argument(
        "--sizes",
        default=None,
        help="buffer sizes with units (B, KiB, MiB, GiB, KB, MB, GB); "
        f"default {DEFAULT_SIZES}, or with --model that model's MoE-layer buffer",
    )
    a.add_argument(
        "--size-per",
        choices=["gpu", "pair"],
        default="gpu",
        help="gpu (default): each GPU's whole send buffer, as nccl-tests and rccl-tests count `size`; "
        "pair: the bytes each GPU sends to each other GPU (n times that per GPU)",
    )
    a.add_argument(
        "--model",
        default=None,
        help="size = one MoE layer's all-to-all buffer per GPU of this model "
        "preset: micro-batch size x seq len x top-k x hidden x bytes per element (instead of --sizes)",
    )
    a.add_argument(
        "--micro-batch-size", type=int, default=None, help="with --model: sequences per micro-batch (default 1)"
    )
    a.add_argument("--seq-len", type=int, default=None, help="with --model: tokens per sequence (default: the model's)")
    a.add_argument(
        "--algorithms",
        default="flat,rccl,halo",
        help="all-to-all algorithms (flat, rccl, nccl, halo, 2dh, pairwise, bruck)",
    )
    add_machine_options(a)
    a.set_defaults(func=cmd_study_all_to_all)
    c = studies.add_parser(
        "collective",
        help="one collective alone on the machine (all-reduce, all-gather, "
        "reduce-scatter, all-to-all, broadcast): algorithms x GPUs x sizes, as nccl-tests prints it",
    )
    c.add_argument(
        "--collective", required=True, help="all_reduce, all_gather, reduce_scatter, all_to_all or broadcast"
    )
    c.add_argument("--topology", default="frontier", help="topology preset or YAML path")
    c.add_argument("--gpus", default="8", help="GPU counts (ranks), e.g. 8,16,32; nodes are filled in order")
    c.add_argument(
        "--sizes",
        default=DEFAULT_COLLECTIVE_SIZES,
        help="sizes with units (B, KiB, MiB, GiB, KB, MB, GB): "
        "nccl-tests' size of the collective (all-gather: the gathered buffer; reduce-scatter: the input; "
        "all-to-all: the send buffer; all per rank)",
    )
    c.add_argument(
        "--algorithms",
        default=None,
        help="the collective's algorithms (default: every one the machine "
        "has parameters for: ring, tree, hierarchical, nccl, rccl, ...)",
    )
    add_machine_options(c)
    c.set_defaults(func=cmd_study_collective)
    b = studies.add_parser("imbalance", help="MFU and step time vs routing skew, per migration policy; drift")
    b.add_argument("config", help="YAML config (or example name) to vary")
    b.add_argument(
        "--kind", default="zipf", help="skewed routing kind: zipf (exponent), dirichlet (concentration), hot (share)"
    )
    b.add_argument("--skews", default="0,0.5,1,1.5,2", help="values of the kind's skew parameter")
    b.add_argument("--policies", default="none,greedy,lpt", help="migration policies")
    b.add_argument("--steps", type=int, default=4, help="simulated steps per point (step 0 is not scored)")
    b.add_argument("--drift-steps", type=int, default=12, help="steps of the drifting-experts run (0: skip)")
    b.add_argument("--drift-rate", type=float, default=0.5, help="experts the hot set moves per step")
    b.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    b.add_argument("--out", required=True, type=Path, help="output directory")
    b.set_defaults(func=cmd_study_imbalance)
    register_scaling(studies)


DEFAULT_SIZES = "1MiB,64MiB"
DEFAULT_COLLECTIVE_SIZES = "1MiB,64MiB,1GiB"


def add_machine_options(a: argparse.ArgumentParser) -> None:
    """The options of a collective study's machine (studies.collective_sweep.MachineSpec) and its output folder."""
    a.add_argument("--placement", default="contiguous", help="placement policy")
    a.add_argument(
        "--routing",
        choices=["minimal", "valiant", "adaptive"],
        default=None,
        help="dragonfly routing (default: the topology's)",
    )
    a.add_argument(
        "--scope",
        choices=["machine", "job"],
        default=None,
        help="dragonfly network behind the job: machine = every group of the machine carries its "
        "non-minimal routes (default: the topology's), job = only the groups the job occupies",
    )
    a.add_argument(
        "--valiant",
        choices=["spread", "hashed"],
        default="spread",
        help="dragonfly detours: spread = mean-field over all detours (default; tractable at scale), "
        "hashed = one hashed detour per GPU pair as `simulate` routes (exact but slow past ~16 nodes)",
    )
    a.add_argument(
        "--max-flows",
        type=int,
        default=20_000_000,
        help="skip a run (row kept, with a note) that would route more paths than this (memory)",
    )
    a.add_argument("--no-lump", action="store_true", help="simulate every flow (no exact aggregation; slow)")
    a.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="topology.params.KEY=VALUE",
        help="override a topology parameter (repeatable)",
    )
    a.add_argument("--out", required=True, type=Path, help="output directory")


def machine_options(args: argparse.Namespace) -> dict:
    """MachineSpec's fields from add_machine_options' options."""
    return {
        "topology": args.topology,
        "placement": args.placement,
        "routing": args.routing,
        "valiant": args.valiant,
        "scope": args.scope,
        "topology_params": _params(args.overrides),
        "lump": not args.no_lump,
        "max_flows": args.max_flows,
    }


def _sizes(args: argparse.Namespace) -> tuple[tuple[str, ...], dict | None]:
    """The study's sizes, and with --model the MoE buffer they come from (its formula's inputs)."""
    from piper_sim.studies.all_to_all import parse_list  # numpy

    if args.model is None:
        for flag, value in (("--micro-batch-size", args.micro_batch_size), ("--seq-len", args.seq_len)):
            if value is not None:
                raise ConfigError(flag, value, "only with --model (it sets that model's MoE-layer buffer)")
        return tuple(parse_list(args.sizes or DEFAULT_SIZES, "--sizes")), None
    if args.sizes is not None:
        raise ConfigError("--sizes", args.sizes, "left out with --model (the size is the model's MoE-layer buffer)")
    if args.size_per != "gpu":
        raise ConfigError("--size-per", args.size_per, "gpu with --model (the MoE-layer buffer is per GPU)")
    buffer = moe_buffer(args.model, args.micro_batch_size, args.seq_len)
    print(f"piper-sim: note: {buffer.model}'s MoE-layer all-to-all buffer per GPU: {buffer.formula()}", file=sys.stderr)
    return (size_label(buffer.buffer_bytes),), buffer.as_dict()


def _params(overrides: list[str]) -> dict:
    out = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.startswith("topology.params.") or key == "topology.params.":
            raise ConfigError("--set", item, "topology.params.KEY=VALUE")
        out[key.removeprefix("topology.params.")] = parse_yaml(value, f"--set {key}")
    return out


def cmd_study_all_to_all(args: argparse.Namespace) -> int:
    from piper_sim.studies.all_to_all import SIZE_PER, StudySpec, parse_list, parse_nodes, write_study  # numpy, simpy
    from piper_sim.studies.collective_plots import study_text, write_plots  # matplotlib: not for --help

    sizes, buffer = _sizes(args)
    spec = StudySpec(
        **machine_options(args),
        nodes=tuple(parse_nodes(args.nodes)),
        sizes=sizes,
        algorithms=tuple(parse_list(args.algorithms, "--algorithms")),
        size_per=args.size_per,
        fanout=(buffer["top_k"], buffer["num_experts"]) if buffer else None,
    )
    described = {"size_meaning": SIZE_PER[spec.size_per], **({"moe_buffer": buffer} if buffer else {})}
    return _run_study(args, spec, "study all-to-all", described, write_study, write_plots, lambda: study_text(args.out))


def cmd_study_collective(args: argparse.Namespace) -> int:
    from piper_sim.studies.collective import (  # numpy, simpy
        COLLECTIVES,
        CollectiveSpec,
        machine_algorithms,
        study_text,
        write_collective_study,
    )
    from piper_sim.studies.collective_plots import write_collective_plots  # matplotlib: not for --help
    from piper_sim.studies.collective_sweep import parse_counts, parse_list, study_machine  # numpy, simpy

    kind = COLLECTIVES.get(args.collective, "--collective")
    machine, gpus = machine_options(args), tuple(parse_counts(args.gpus, "--gpus", least=2))
    algorithms = args.algorithms
    if algorithms is None:  # every algorithm the smallest machine can run
        bare = CollectiveSpec(**machine, collective=kind.name, gpus=gpus, sizes=(), algorithms=())
        bare.check_machine()
        algorithms = ",".join(machine_algorithms(kind.name, study_machine(bare, gpus=min(gpus))[0]))
    spec = CollectiveSpec(
        **machine,
        collective=kind.name,
        gpus=gpus,
        sizes=tuple(parse_list(args.sizes, "--sizes")),
        algorithms=tuple(parse_list(algorithms, "--algorithms")),
    )
    described = {"size_meaning": kind.size_meaning, "busbw": f"algbw x {kind.factor_text}"}
    return _run_study(
        args,
        spec,
        "study collective",
        described,
        write_collective_study,
        write_collective_plots,
        lambda: study_text(args.out / "study.csv"),
    )


def _run_study(
    args: argparse.Namespace,
    spec: object,
    command: str,
    described: dict,
    write: Callable,
    plots: Callable[[Path], list[Path]],
    text: Callable[[], str],
) -> int:
    """Check the spec, claim --out, write study.yaml (the spec and what its sizes and bandwidths mean), run the study
    (rows stored as they finish), then its plots and table; an interrupted study still plots what it finished."""
    spec.check()  # type: ignore[attr-defined]
    open_out_dir(args.out, command, resume=True)
    fields = {k: list(v) if isinstance(v, tuple) else v for k, v in spec.__dict__.items()}
    (args.out / "study.yaml").write_text(yaml.safe_dump({**fields, **described}, sort_keys=False))
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    try:
        write(spec, args.out, log)
    except KeyboardInterrupt:
        log("interrupted: study.csv keeps the completed rows; writing plots from them")
        plots(args.out)
        raise
    paths = plots(args.out)
    print(text())
    for path in paths:
        print(f"wrote {path}")
    finish(args.out)
    print(f"wrote {args.out / 'study.csv'} and {args.out / 'link_kinds.csv'}")
    return 0


def cmd_study_imbalance(args: argparse.Namespace) -> int:
    # numpy, pandas, matplotlib
    from piper_sim.studies.imbalance import run_points, study_context, study_points, tables_text, write_plots

    raw = apply_overrides(read_config_file(config_path(args.config)), args.overrides)
    points = study_points(
        raw,
        kind=args.kind,
        skews=[float(x) for x in parse_csv(args.skews, "--skews")],
        policies=parse_csv(args.policies, "--policies"),
        steps=args.steps,
        drift_steps=args.drift_steps,
        drift_rate=args.drift_rate,
    )
    open_out_dir(args.out, "study imbalance", resume=True)
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    try:
        paths = run_points(points, args.out, log)
    finally:
        for path in write_plots(args.out, study_context(points)):
            print(f"wrote {path}")
    finish(args.out)
    print(tables_text(args.out))
    print("wrote " + " and ".join(str(p) for p in paths.values()))
    return 0


def parse_csv(text: str, key: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise ConfigError(key, text, "a comma-separated list")
    if key != "--skews":
        return items
    try:
        numbers = [float(x) for x in items]
    except ValueError:
        raise ConfigError(key, text, "comma-separated numbers") from None
    if not all(math.isfinite(x) for x in numbers):
        raise ConfigError(key, text, "comma-separated finite numbers")
    return [str(x) for x in numbers]


def register_sweep(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="simulate a config over a grid of config keys (on Dask, resumable)")
    p.add_argument("config", help="YAML config or a shipped example name")
    p.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="KEY=V1,V2,...",
        help="a config key and its values, e.g. --grid parallel.pp=2,4,8 (repeatable: the product)",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a base config value (repeatable)",
    )
    add_engine_args(p)
    p.add_argument("--out", type=Path, required=True, help="output directory (sweep.csv, sweep.parquet, points/)")
    p.set_defaults(func=cmd_sweep)


def cmd_sweep(args: argparse.Namespace) -> int:
    from piper_sim.studies.config_sweep import run_sweep, sweep_text  # pandas: not for --help

    check_workers(args.workers)
    configure_engine(args.scheduler, args.workers, args.dashboard)
    open_out_dir(args.out, "sweep", resume=True)
    table = run_sweep(
        config_path(args.config),
        args.grid,
        args.out,
        overrides=args.overrides,
        scheduler=args.scheduler,
        workers=args.workers,
    )
    finish(args.out)
    print(sweep_text(table, config_path(args.config), args.grid, overrides=args.overrides))
    print(f"wrote {args.out}/ (sweep.csv, sweep.parquet, sweep.yaml, points/)")
    return 0


def register_scaling(studies: argparse._SubParsersAction) -> None:
    p = studies.add_parser("scaling", help="the planner's best plan at each GPU count; TFLOPS/GPU, MFU, efficiency")
    p.add_argument("model", help="model preset, model YAML or HF config.json")
    p.add_argument("--gpus", required=True, help="GPU counts, e.g. 64,128,256,512,1024")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--strong", action="store_true", help="the same model and --global-batch at every count")
    mode.add_argument(
        "--weak",
        metavar="model.KEY=V1,V2,...",
        help="one model value per count, e.g. model.num_experts=16,32,64,128,256",
    )
    p.add_argument("--global-batch", type=int, help="strong scaling: sequences per step")
    p.add_argument("--sequences-per-gpu", type=int, default=4, help="weak scaling: sequences per GPU (default 4)")
    p.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (default: the model's)")
    add_machine_args(p)
    p.add_argument(
        "--fix", action="append", default=[], metavar="KEY=VALUE[,VALUE...]", help="as plan's --fix, at every GPU count"
    )
    p.add_argument("--top", type=int, default=4, help="plans simulated per point (default 4; 0: estimate only)")
    p.add_argument("--ep-domain", choices=DOMAINS, default="switch")
    add_engine_args(p)
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(func=cmd_study_scaling)


def cmd_study_scaling(args: argparse.Namespace) -> int:
    from piper_sim.studies.scaling import (  # matplotlib, pandas: not for --help
        parse_counts,
        run_scaling,
        scaling_requests,
        scaling_text,
    )

    counts = parse_counts(args.gpus)
    check_workers(args.workers)
    if args.strong and (args.global_batch is None or args.global_batch <= 0):
        raise ConfigError("--global-batch", args.global_batch, "a positive number of sequences (strong scaling)")
    if args.top < 0:
        raise ConfigError("--top", args.top, "0 (estimate only) or a positive integer")
    fixed, settings = split_settings(parse_fixes(args.fix))
    base = PlanRequest(
        model=args.model,
        num_gpus=counts[0],
        global_batch=args.global_batch or 1,
        topology=args.topology,
        profile=args.profile,
        seq_len=args.seq_len,
        allow_device_mismatch=args.allow_device_mismatch,
        fixed=fixed,
        top_k=args.top,
        domain=args.ep_domain,
        **settings,
    )
    machine = check_machine(base)  # the first count's: its plan prices on it
    say_space_notes(base)
    requests = scaling_requests(base, counts, weak=args.weak, sequences_per_gpu=args.sequences_per_gpu)
    configure_engine(args.scheduler, args.workers, args.dashboard)
    open_out_dir(args.out, "study scaling", resume=True)
    table = run_scaling(
        requests, args.out, weak=args.weak is not None, machine=machine, scheduler=args.scheduler, workers=args.workers
    )
    finish(args.out)
    print(scaling_text(table))
    print(f"wrote {args.out}/ (scaling.csv, scaling.png, store/)")
    return 0
