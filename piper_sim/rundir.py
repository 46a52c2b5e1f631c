"""Output folders (--out): created, claimed by one command, marked unfinished until that command completes.

A folder a command writes holds OWNER (the command that wrote it) from the start and UNFINISHED until the command
has written everything; `finish` removes UNFINISHED. Reusing a folder:
- an empty or missing folder is claimed;
- a folder OWNER says the same command wrote is emptied first (its previous files never sit beside the new
  ones), unless the command resumes (studies, plan, sweep: they keep what is finished and skip it);
- any other non-empty folder is refused, naming what it holds.
A command holds an exclusive lock (fcntl.flock on OWNER) from its claim until `finish` (or its exit): a second
command on the same folder meanwhile is refused, never empties or mixes it. Every file-system error is a ConfigError
naming --out; `write_error` turns one while writing into a claimed folder (disk full) into one naming the file.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from piper_sim.errors import ConfigError

OWNER = ".piper-sim.json"
UNFINISHED = "UNFINISHED"
_held: dict[Path, tuple[int, str, str]] = {}  # folders this process claimed: the locked OWNER's fd, flag, path


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
    """Claim `path` for `command` (see the module docstring), lock it and mark it unfinished."""
    path = Path(path)
    try:
        if path.exists() and not path.is_dir():
            raise ConfigError(flag, str(path), "a folder (this is a file)")
        _check_reuse(path, command, flag)  # before the lock: a folder refused is left untouched
        path.mkdir(parents=True, exist_ok=True)
        fd = _lock(path, flag)
        entries = _check_reuse(path, command, flag)  # again under the lock: another command may have ended since
        if entries and not resume:
            for entry in path.iterdir():
                if entry.name != OWNER:
                    shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps({"command": command}) + "\n").encode(), 0)
        (path / UNFINISHED).write_text(
            f"piper-sim {command} has not finished writing this folder; its files may be partial\n"
        )
    except OSError as exc:
        raise _fs_error(path, exc, flag) from None
    return path


def _check_reuse(path: Path, command: str, flag: str) -> list[str]:
    """The folder's entries, or a ConfigError where it holds what another command (or no command) wrote."""
    entries = sorted(p.name for p in path.iterdir()) if path.exists() else []
    previous = owner(path) if entries else None
    if entries == [OWNER] and previous is None:  # an empty OWNER alone: a lock taken, nothing written yet
        return []
    if entries and previous != command:
        shown = ", ".join(entries[:4]) + (", ..." if len(entries) > 4 else "")
        by = f"written by `piper-sim {previous}`" if previous else f"holding {shown}"
        raise ConfigError(
            flag,
            str(path),
            f"an empty folder or an earlier output of `piper-sim {command}` "
            f"(this folder is {by}; choose another or remove it)",
        )
    return entries


def _lock(path: Path, flag: str) -> int:
    """An exclusive lock on the folder's OWNER file, held by this process until finish (or its exit); a folder this
    process holds already keeps its lock. Another process holding it: a ConfigError naming `flag`."""
    key = Path(os.path.abspath(path))
    held = _held.get(key)
    if held is not None:
        try:
            if os.fstat(held[0]).st_ino == (path / OWNER).stat().st_ino:
                return held[0]
        except OSError:
            pass
        _release(key)  # the folder was removed and made again: its OWNER is another file
    fd = os.open(path / OWNER, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ConfigError(
            flag,
            str(path),
            "a folder no other command is writing (another piper-sim command is "
            "writing this one now; wait for it to end or choose another folder)",
        ) from None
    _held[key] = (fd, flag, str(path))
    return fd


def _release(key: Path) -> None:
    fd = _held.pop(key)[0]
    os.close(fd)  # closing the only descriptor of the open file releases its lock


def finish(path: Path) -> None:
    """The command has written everything: remove the unfinished marker and release the folder's lock."""
    (Path(path) / UNFINISHED).unlink(missing_ok=True)
    key = Path(os.path.abspath(path))
    if key in _held:
        _release(key)


@contextmanager
def writing(path: Path) -> Iterator[None]:
    """An OSError inside that names no file (a write or close that found the disk full) names `path`."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None:
            exc.filename = str(path)
        raise


def write_error(exc: OSError) -> ConfigError | None:
    """An OSError raised while writing into a folder this process has claimed (disk full, quota, permissions), as a
    ConfigError naming the folder's flag, the folder and the file; None where it is about no claimed folder. One
    that names no file (a library writing through its own handle) is put on the claimed folder when it is a
    disk-full or quota error and one folder is claimed."""
    name = exc.filename if isinstance(exc.filename, str | bytes) else None
    for key, (_, flag, given) in _held.items():
        if name is not None:
            target = Path(os.path.abspath(os.fsdecode(name)))  # not resolved: a file may link out of the folder
            if not target.is_relative_to(key):
                continue
            what = f"writing {target.relative_to(key)}"
        elif exc.errno in (errno.ENOSPC, errno.EDQUOT) and len(_held) == 1:
            what = "writing its outputs"
        else:
            continue
        return ConfigError(
            flag, given, f"a folder the command can write its outputs to ({what} failed: {exc.strerror or exc})"
        )
    return None


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
