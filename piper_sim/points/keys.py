"""The key of a stored point: its payload, the content of every file it reads and the version of the code that
prices it. A point stored under another key is stale (made with other inputs or other code) and is recomputed.

Owns point_key (the one function every resuming command keys its points by; keyed_point pairs it with the
point's digest), input_files and code_version.

Files a point reads (input_files), found by walking its payload (a resolved config, or a reproduce or study
payload) for the keys that name files, through the loaders' own name resolution:
- `model`: a preset's YAML or the YAML / HF config.json given, and the model a file's or mapping's `preset:`
  names (transitively);
- `topology`: topologies/NAME.yaml or the YAML given, the topology a mapping's `preset:` names, and the
  profile its `device_profile:` names;
- `profile` (`cost.profile`, or `cost: NAME`): traces/profiles/NAME.yaml or the YAML given, and the profile its
  `extends:` names;
- `routing.path`: the routing trace replayed.
A file's digest is the sha256 of its bytes (memoized per path, inode, size and change times).

The code version (code_version): piper_sim's version and the sha256 of every .py file of the package except
those that cannot change a stored figure: the command line (`cli.py`, `*/cli.py`, `command_args.py`,
`simulate_commands.py`, `run_commands.py`, `validate_commands.py`, `__main__.py`), progress lines (`progress.py`),
plots (`plots.py`, `*/plots.py`, `studies/collective_plots.py`), and the real backend (`measure.py`,
`torch_backend/`, `testbed/`). Computed once per process.
Must not import torch.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import piper_sim
from piper_sim.errors import ConfigError
from piper_sim.points.store import point_digest
from piper_sim.routing.replay import resolve_trace_path
from piper_sim.topology.load import topology_file
from piper_sim.version import __version__
from piper_sim.workload.presets import model_file
from piper_sim.workload.profile_file import profile_path
from piper_sim.yamlio import read_yaml

PACKAGE_DIR = Path(piper_sim.__file__).resolve().parent
NOT_PRICING_DIRS = frozenset({"torch_backend", "testbed"})
NOT_PRICING_NAMES = frozenset(
    {
        "cli.py",
        "command_args.py",
        "simulate_commands.py",
        "run_commands.py",
        "validate_commands.py",
        "__main__.py",
        "progress.py",
        "plots.py",
        "collective_plots.py",
        "measure.py",
    }
)
MAX_CHAIN = 16  # files a `preset:` or `extends:` chain may follow (a loop is cut there)


class KeyedPoint(NamedTuple):
    digest: str  # the point's file in the store (point_digest of the payload)
    key: str  # what its stored row must have been computed under (point_key)
    payload: dict  # what the work function receives


def keyed_point(payload: dict) -> KeyedPoint:
    return KeyedPoint(point_digest(payload), point_key(payload), payload)


def point_key(payload: dict) -> str:
    """The key a point is stored under: its payload, the digest of every file it reads, the code version."""
    inputs = {str(path): file_digest(path) for path in input_files(payload)}
    return point_digest({"point": payload, "inputs": inputs, "code": code_version()})


@functools.cache
def code_version() -> str:
    """piper_sim's version and a digest of the package's pricing source files (module docstring)."""
    digest = hashlib.sha256(__version__.encode())
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        rel = path.relative_to(PACKAGE_DIR)
        if counts_in_code_version(rel):
            digest.update(rel.as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return f"{__version__}+{digest.hexdigest()[:16]}"


def counts_in_code_version(rel: Path) -> bool:
    """Whether a source file (its path inside the package) can change a stored figure."""
    return rel.parts[0] not in NOT_PRICING_DIRS and rel.name not in NOT_PRICING_NAMES


def file_digest(path: Path) -> str:
    """sha256 of a file's bytes; "absent" for a path that is no file (the point's run says what is wrong)."""
    try:
        stat = path.stat()
    except OSError:
        return "absent"
    return _file_digest(str(path.resolve()), stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


@functools.lru_cache(maxsize=4096)
def _file_digest(path: str, inode: int, size: int, mtime_ns: int, ctime_ns: int) -> str:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return "absent"


def input_files(payload: object) -> list[Path]:
    """Every file a point with this payload reads (module docstring), sorted."""
    found: set[Path] = set()
    _walk(payload, found)
    return sorted(found)


def _walk(value: object, found: set[Path]) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            resolver = RESOLVERS.get(key)
            if resolver is None:
                _walk(item, found)
            else:
                found.update(resolver(item))
    elif isinstance(value, list | tuple):
        for item in value:
            _walk(item, found)


def _model_files(spec: object) -> list[Path]:
    out: list[Path] = []
    for _ in range(MAX_CHAIN):
        path = model_file(spec) if isinstance(spec, str) else None
        if path is not None:
            out.append(path)
            spec = _file_mapping(path)
        spec = spec.get("preset") if isinstance(spec, dict) else None
        if spec is None:
            break
    return out


def _topology_files(spec: object) -> list[Path]:
    """The topology's file (a mapping's `preset:`; a file's own `preset:` is not followed by its loader) and the
    profile its `device_profile:` names (the profile of a config that gives none)."""
    mapping = spec
    files = []
    if isinstance(spec, dict) and isinstance(spec.get("preset"), str | Path):
        spec = spec["preset"]
    if isinstance(spec, str | Path):
        files.append(topology_file(spec))
        read = _file_mapping(files[0])
        mapping = {**(read if isinstance(read, dict) else {}), **(mapping if isinstance(mapping, dict) else {})}
    device_profile = mapping.get("device_profile") if isinstance(mapping, dict) else None
    return files + (_profile_files(device_profile) if isinstance(device_profile, str) else [])


def _profile_files(spec: object) -> list[Path]:
    out: list[Path] = []
    for _ in range(MAX_CHAIN):
        if isinstance(spec, str | Path):
            out.append(profile_path(spec))
            spec = _file_mapping(out[-1])
        spec = spec.get("extends") if isinstance(spec, dict) else None
        if spec is None:
            break
    return out


def _cost_files(spec: object) -> list[Path]:
    if isinstance(spec, str):  # `cost: NAME` stands for cost.profile
        return _profile_files(spec)
    found: set[Path] = set()
    _walk(spec, found)
    return sorted(found)


def _routing_files(spec: object) -> list[Path]:
    if isinstance(spec, dict) and isinstance(spec.get("path"), str):
        return [resolve_trace_path(spec["path"])]
    return []


def _file_mapping(path: Path) -> object:
    """The mapping a YAML or JSON file holds, or None where it holds none (the loader says what is wrong)."""
    digest = file_digest(path)
    return None if digest == "absent" else _parsed(str(path), digest)


@functools.lru_cache(maxsize=256)
def _parsed(path: str, digest: str) -> object:
    if path.endswith(".json"):
        try:
            return json.loads(Path(path).read_bytes())
        except (OSError, ValueError, RecursionError):
            return None
    try:
        return read_yaml(path, "file")
    except ConfigError:  # the point's own run names what is wrong, under the user's key
        return None


RESOLVERS: dict[str, Callable[[object], list[Path]]] = {
    "model": _model_files,
    "topology": _topology_files,
    "profile": _profile_files,
    "cost": _cost_files,
    "routing": _routing_files,
}
