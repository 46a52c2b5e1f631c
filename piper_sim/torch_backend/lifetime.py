"""Rank processes never outlive the `piper-sim` process that started them.

Owns the three guards every launch applies: the ranks ignore SIGINT from birth (a Ctrl-C at the terminal reaches
the main process only, which stops them and prints one line), each rank sits in a process group of its own, and
on Linux each asks the kernel for SIGKILL when its parent exits (prctl PR_SET_PDEATHSIG), so that a SIGTERM or
SIGKILL of the main process leaves no rank behind. Needs no torch.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager

PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int | None = None) -> None:
    """Linux: SIGKILL this process when its parent exits; exit at once if the parent is already gone."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)


def rank_process_setup(parent_pid: int | None = None) -> None:
    """First thing in a rank: a process group of its own, and death with its parent."""
    try:
        os.setpgid(0, 0)
    except OSError:  # already a group leader (a session of its own)
        pass
    die_with_parent(parent_pid)


@contextmanager
def children_ignore_interrupts() -> Iterator[None]:
    """Processes started inside inherit SIGINT ignored (kept across exec); this process's handler is restored
    after. A Ctrl-C meanwhile is delivered when the block ends."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def preexec_rank() -> None:
    """For subprocess.Popen(preexec_fn=...): death with the parent (the group is start_new_session's)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
