"""`piper-sim run` stopped from outside: SIGTERM, SIGKILL or Ctrl-C of the main process leaves no rank running
after 2 s, the output folder says it is unfinished, and Ctrl-C prints one line, no traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.add(child)
            todo.append(child)
    return out


def start_run(out: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [sys.executable, "-m", "piper_sim.cli", "run", "tiny-moe", "--out", str(out), "--set", "sim.steps=200"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _sockets(pid: int) -> int:
    try:
        return sum(os.readlink(fd).startswith("socket:") for fd in Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return 0


def wait_for_ranks(proc: subprocess.Popen, count: int, *, joined: bool, timeout_s: float = 120.0) -> set[int]:
    """The main process's descendants once `count` ranks exist (and with `joined`, once every rank holds the
    sockets of its process group: the ranks are training)."""
    deadline = time.monotonic() + timeout_s
    seen: set[int] = set()
    while time.monotonic() < deadline and proc.poll() is None:
        seen |= {p for p in descendants(proc.pid) if _alive(p)}
        ranks = [p for p in seen if "spawn_main" in _cmdline(p)]
        if len(ranks) >= count and (not joined or all(_sockets(p) >= count for p in ranks)):
            return seen
        time.sleep(0.1)
    raise AssertionError(f"ranks did not start (saw {sorted(seen)}; exit {proc.poll()})")


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL", "Ctrl-C"])
def test_no_rank_survives_the_main_process(tmp_path: Path, how: str) -> None:
    """SIGTERM and SIGKILL while the ranks train; Ctrl-C while they start (importing torch, joining the group)."""
    out = tmp_path / "run"
    proc = start_run(out)
    ranks: set[int] = set()
    try:
        ranks = wait_for_ranks(proc, 4, joined=how != "Ctrl-C")
        time.sleep(1.0)
        if how == "Ctrl-C":  # the terminal sends SIGINT to its foreground process group
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.kill(proc.pid, getattr(signal, how))
        _, stderr = proc.communicate(timeout=30)
        time.sleep(2.0)
        survivors = sorted(p for p in ranks if _alive(p))
        assert not survivors, f"{how}: ranks still running 2 s after the main process ended: {survivors}"
        assert (out / "UNFINISHED").exists()
        if how != "SIGKILL":
            assert "Traceback" not in stderr, stderr
            expected = "piper-sim: interrupted" if how == "Ctrl-C" else "piper-sim: terminated"
            assert stderr.strip().splitlines()[-1] == expected
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for pid in ranks | descendants(proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
