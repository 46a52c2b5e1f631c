"""`piper-sim import megatron|torchtitan`: argument parsing, the notes on stderr and the YAML written.

Registered by piper_sim.cli.build_parser. Writes only the --out file (or the YAML on stdout without one).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from piper_sim.bounds import GPUS_LIMIT
from piper_sim.errors import ConfigError
from piper_sim.importers.imported import Imported

OWN_OPTIONS = ("--out", "--world-size", "--lenient", "--name", "-h", "--help")


class ImportParser(argparse.ArgumentParser):
    """The import commands' parser; with launch_line, it takes its own options anywhere on the line (before or after
    `--`) and hands every other word to `args.argv` in order: a Megatron-LM launch line has flags of its own."""

    def __init__(self, *args: object, launch_line: bool = False, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.launch_line = launch_line

    def parse_known_args(
        self, args: list[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        if not self.launch_line:
            return super().parse_known_args(args, namespace)
        tokens = [token for token in (sys.argv[1:] if args is None else args) if token != "--"]
        own, rest = [], []
        takes_value = {"--out", "--world-size", "--name"}
        while tokens:
            token = tokens.pop(0)
            name = token.split("=", 1)[0]
            if name in OWN_OPTIONS:
                own.append(token)
                if name in takes_value and "=" not in token and tokens:
                    own.append(tokens.pop(0))
            else:
                rest.append(token)
        namespace, extras = super().parse_known_args(own, namespace)
        namespace.argv = rest + extras
        return namespace, []


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, help="the YAML file to write (default: print it)")
    p.add_argument(
        "--world-size",
        type=int,
        help="the job's GPUs (Megatron and torchtitan take them from the "
        "launcher; torchrun's --nnodes and --nproc-per-node among Megatron's flags also give them)",
    )
    p.add_argument(
        "--lenient",
        action="store_true",
        help="take a documented approximation, noted in the YAML, "
        "where the run uses what piper-sim cannot express (context parallelism, FSDP, fp8, ...) rather "
        "than refuse it (docs/importing.md)",
    )


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "import",
        help="a Megatron-LM argument list or a torchtitan TOML -> a piper-sim config",
        description="Translate a training run's own configuration into a piper-sim config. Every "
        "flag or key not translated is listed on stderr and at the top of the YAML. "
        "See docs/importing.md.",
    )
    kinds = p.add_subparsers(dest="kind", required=True, parser_class=ImportParser)
    m = kinds.add_parser(
        "megatron",
        launch_line=True,
        help="Megatron-LM / Megatron-core arguments (after `--`)",
        description="piper-sim import megatron [--out FILE] [--world-size N] [--lenient] -- "
        "[torchrun --nnodes N --nproc-per-node G pretrain_gpt.py] --num-layers ... "
        "(piper-sim's options may come anywhere on the line)",
    )
    _add_common(m)
    m.add_argument("--name", default=None, help="the model's name in the config (default: the --out file's stem)")
    m.set_defaults(func=cmd_import_megatron)
    t = kinds.add_parser("torchtitan", help="a torchtitan job TOML")
    t.add_argument("file", type=Path, help="the TOML (torchtitan's train_configs/*.toml)")
    _add_common(t)
    t.add_argument(
        "--model",
        help="the model's shapes: a preset, a model YAML or an HF config.json (default: "
        "[model] hf_assets_path/config.json)",
    )
    t.set_defaults(func=cmd_import_torchtitan)


def _check_world(world: int | None) -> None:
    if world is not None and not 0 < world <= GPUS_LIMIT:
        raise ConfigError("--world-size", world, f"a positive number of GPUs up to {GPUS_LIMIT:,}")


def cmd_import_megatron(args: argparse.Namespace) -> int:
    from piper_sim.importers.megatron import import_megatron  # the command's modules: not for --help

    _check_world(args.world_size)
    if not args.argv:
        raise ConfigError("megatron arguments", None, "Megatron-LM's flags after `--`, e.g. -- --num-layers 32 ...")
    name = args.name or (args.out.stem if args.out else "megatron-import")
    return _write(import_megatron(args.argv, world_size=args.world_size, lenient=args.lenient, name=name), args.out)


def cmd_import_torchtitan(args: argparse.Namespace) -> int:
    from piper_sim.importers.torchtitan import import_torchtitan  # tomllib: not for --help

    _check_world(args.world_size)
    imported = import_torchtitan(args.file, world_size=args.world_size, model=args.model, lenient=args.lenient)
    return _write(imported, args.out)


def _write(imported: Imported, out: Path | None) -> int:
    for line in imported.messages():
        print(f"piper-sim: note: {line}", file=sys.stderr)
    text = imported.yaml_text()
    if out is None:
        print(text, end="")
        return 0
    out.write_text(text)
    print(f"wrote {out} (piper-sim simulate {out} --out DIR runs it)")
    return 0
