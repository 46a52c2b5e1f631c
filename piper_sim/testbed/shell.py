"""Running iproute2 commands for the testbed: privilege and tool checks, clear errors.

Owns every subprocess call of the emulator (ip, tc, sysctl) and the run directory. Stdlib only.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from piper_sim.errors import PiperError

RUN_DIR = Path("/run/piper-sim")
TOOLS = ("ip", "tc")


class TestbedError(PiperError):
    """A testbed command failed; the message names the command and quotes its stderr."""

    __test__ = False  # not a pytest test class


class TestbedUnavailable(TestbedError):
    """This machine cannot host an emulated cluster (not root, or iproute2 missing)."""


def unavailable_reason() -> str | None:
    """Why the emulator cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "the emulated testbed needs root (network namespaces, veth, bridges, tc); run as root"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return f"the emulated testbed needs iproute2's {' and '.join(missing)} on PATH; install iproute2"
    if not Path("/proc/self/ns/net").exists():
        return "the emulated testbed needs a Linux kernel with network namespaces"
    return None


def require_tools() -> None:
    reason = unavailable_reason()
    if reason is not None:
        raise TestbedUnavailable(reason)


def run(argv: Sequence[str], *, timeout_s: float = 30.0) -> str:
    """Run a command, return its stdout; a failure raises TestbedError with the command and stderr."""
    try:
        done = subprocess.run(list(argv), check=True, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.CalledProcessError as exc:
        detail = (exc.stderr or exc.stdout or "").strip() or f"exit status {exc.returncode}"
        raise TestbedError(f"`{' '.join(argv)}` failed: {detail}") from None
    except subprocess.TimeoutExpired:
        raise TestbedError(f"`{' '.join(argv)}` did not finish within {timeout_s:g} s") from None
    except FileNotFoundError:
        raise TestbedUnavailable(f"`{argv[0]}` not found; the testbed needs iproute2 (ip, tc)") from None
    return done.stdout


def try_run(argv: Sequence[str]) -> bool:
    """Run a command whose failure is an answer (probes, removing what may not exist)."""
    try:
        run(argv)
    except TestbedError:
        return False
    return True


def list_namespaces() -> list[str]:
    """Names from `ip netns list` (lines like "pst-n0 (id: 3)")."""
    out = run(["ip", "netns", "list"])
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def namespace_pids(namespace: str) -> list[int]:
    try:
        out = run(["ip", "netns", "pids", namespace])
    except TestbedError:
        return []
    return [int(p) for p in out.split() if p.isdigit()]


def exec_argv(namespace: str, argv: Sequence[str]) -> list[str]:
    """The argv that runs `argv` inside network namespace `namespace`."""
    return ["ip", "netns", "exec", namespace, *argv]
