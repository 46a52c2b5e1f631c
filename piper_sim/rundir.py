"""Output folders (--out): created, claimed by one command, marked unfinished until that command completes.

A folder a command writes holds OWNER (the command that wrote it) from the start and UNFINISHED until the command
has written everything; `finish` removes UNFINISHED. Reusing a folder:
- an empty or missing folder is claimed;
- a folder OWNER says the same command wrote is emptied first (its previous files never sit beside the new
  ones), unless the command resumes (studies, plan, sweep: they keep what is finished and skip it);
- any other non-empty folder is refused, naming what it holds.
Every file-system error is a ConfigError naming --out.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from piper_sim.errors import ConfigError

OWNER = ".piper-sim.json"
UNFINISHED = "UNFINISHED"


def _fs_error(path: Path, exc: OSError, flag: str) -> ConfigError:
    return ConfigError(flag, str(path), f"a folder that can be created and written ({exc.strerror or exc})")


def owner(path: Path) -> str | None:
    """The command that wrote this folder, or None."""
    try:
        return str(json.loads((Path(path) / OWNER).read_text())["command"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def is_unfinished(path: Path) -> bool:
    return (Path(path) / UNFINISHED).exists()


def open_out_dir(path: Path, command: str, *, resume: bool = False, flag: str = "--out") -> Path:
    """Claim `path` for `command` (see the module docstring) and mark it unfinished."""
    path = Path(path)
    try:
        if path.exists() and not path.is_dir():
            raise ConfigError(flag, str(path), "a folder (this is a file)")
        entries = sorted(p.name for p in path.iterdir()) if path.exists() else []
        previous = owner(path) if entries else None
        if entries and previous != command:
            shown = ", ".join(entries[:4]) + (", ..." if len(entries) > 4 else "")
            by = f"written by `piper-sim {previous}`" if previous else f"holding {shown}"
            raise ConfigError(flag, str(path), f"an empty folder or an earlier output of `piper-sim {command}` "
                                               f"(this folder is {by}; choose another or remove it)")
        if entries and not resume:
            for entry in path.iterdir():
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
        path.mkdir(parents=True, exist_ok=True)
        (path / OWNER).write_text(json.dumps({"command": command}) + "\n")
        (path / UNFINISHED).write_text(f"piper-sim {command} has not finished writing this folder; "
                                       "its files may be partial\n")
    except OSError as exc:
        raise _fs_error(path, exc, flag) from None
    return path


def finish(path: Path) -> None:
    """The command has written everything: remove the unfinished marker."""
    (Path(path) / UNFINISHED).unlink(missing_ok=True)


def out_file(path: Path, suffixes: tuple[str, ...], flag: str = "--out") -> Path:
    """A file to write: one of `suffixes`, its folder created and writable (checked with a probe file, so that
    nothing is left at `path` if the command fails later); file-system errors name `flag`."""
    path = Path(path)
    if path.suffix not in suffixes:
        raise ConfigError(flag, str(path), f"a file ending in {' or '.join(suffixes)}")
    if path.is_dir():
        raise ConfigError(flag, str(path), "a file (this is a folder)")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        probe = path.parent / f".{path.name}.{os.getpid()}.probe"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(flag, str(path), f"a file that can be created and written ({exc.strerror or exc})") from None
    return path
