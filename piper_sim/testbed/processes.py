"""Processes of a testbed: starting the delay line, finding it again after a crash, stopping by pid.

Owns the only long-lived helper process (piper_sim.testbed.delayline) and the termination of
processes left inside a testbed's namespaces. Processes are found by pid (from `ip netns pids` or
by the delay line's exact argv, which names the testbed prefix) and ended one by one. Stdlib only.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from piper_sim.testbed.shell import TestbedError

DELAYLINE_MODULE = "piper_sim.testbed.delayline"
PACKAGE_ROOT = Path(__file__).resolve().parents[2]
_CHILDREN: dict[int, subprocess.Popen] = {}  # started by this process: waited for (no zombies)


def package_env() -> dict[str, str]:
    """Environment for helper processes: this checkout of piper_sim importable, whatever the cwd."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_ROOT), env.get("PYTHONPATH")) if p)
    return env


def start_delayline(prefix: str, state_path: Path, log_path: Path, timeout_s: float = 20.0) -> int:
    """Start the delay line for a testbed and wait until it has attached every TAP; returns its pid."""
    argv = [sys.executable, "-m", DELAYLINE_MODULE, "--prefix", prefix, str(state_path)]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            start_new_session=True,
            env=package_env(),
            cwd="/",
        )
    _CHILDREN[proc.pid] = proc
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    line = proc.stdout.readline() if ready else b""
    proc.stdout.close()
    if line.strip() != b"ready":
        terminate(proc.pid)
        detail = log_path.read_text(errors="replace").strip()[-2000:] or "no output"
        raise TestbedError(f"the testbed delay line did not start within {timeout_s:g} s: {detail}")
    return proc.pid


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def delayline_pids(prefix: str) -> list[int]:
    """Pids of delay-line processes of this testbed: those whose argv names the module and the prefix."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        args = _cmdline(int(entry))
        if DELAYLINE_MODULE in args and "--prefix" in args:
            i = args.index("--prefix")
            if i + 1 < len(args) and args[i + 1] == prefix:
                found.append(int(entry))
    return sorted(found)


def alive(pid: int) -> bool:
    proc = _CHILDREN.get(pid)
    if proc is not None:
        return proc.poll() is None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


def terminate(pid: int, timeout_s: float = 3.0) -> bool:
    """SIGTERM, wait, then SIGKILL one process; True when it is gone."""
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, timeout_s)):
        if not alive(pid):
            break
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait_s
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
    proc = _CHILDREN.pop(pid, None)
    if proc is not None and proc.poll() is None:
        proc.wait(timeout=timeout_s)
    return not alive(pid)
