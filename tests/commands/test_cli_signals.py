"""SIGINT and SIGTERM end a command with one line and exit 130 or 143 wherever they land: while the modules load,
while numba compiles the kernels (a signal dropped in a ctypes callback is sent again), inside the simulation."""

from __future__ import annotations

import ctypes
import gc
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from piper_sim import stopping
from piper_sim.stopping import RESEND_S, Signals

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def kept_handlers():
    """Signals leaves a stopped process ignoring SIGINT and SIGTERM, its garbage collector off, its unraisable reports
    quiet and the stop's frames kept: put pytest's own back."""
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    hook = sys.unraisablehook
    yield
    for s, handler in before.items():
        signal.signal(s, handler)
    sys.unraisablehook = hook
    stopping._STOPS.clear()
    gc.enable()


def test_a_signal_dropped_in_a_ctypes_callback_is_sent_again_quietly(capfd, kept_handlers):
    def body() -> None:
        signal.raise_signal(signal.SIGINT)  # the handler raises KeyboardInterrupt here, inside the callback
        sum(range(1000))

    callback = ctypes.CFUNCTYPE(None)(body)
    with Signals() as signals, pytest.raises(KeyboardInterrupt):
        callback()  # ctypes reports the interrupt as unraisable and returns normally
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # the hook sends the signal again: it lands here
            time.sleep(0.01)
    assert signals.received == signal.SIGINT
    assert signals.stop_code(RuntimeError("numba: no compiled object yet")) == 130
    assert "Exception ignored" not in capfd.readouterr().err


def test_a_stop_settles_the_signals_so_a_pending_resend_cannot_interrupt_its_line(kept_handlers):
    """The command's stop is decided while the dropped signal's resend is still pending: the resend (and a second
    Ctrl-C) must not raise again on the way out, which would end the process by the signal (status -2), not 130."""

    def body() -> None:
        signal.raise_signal(signal.SIGINT)

    callback = ctypes.CFUNCTYPE(None)(body)
    with Signals() as signals:
        callback()  # dropped: a resend is now pending
        assert signals.stop_code(RuntimeError("numba: no compiled object yet")) == 130
        signal.raise_signal(signal.SIGINT)  # a second Ctrl-C while the line is printed
        time.sleep(10 * RESEND_S)  # the resend's time passes: nothing raises
    assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN


def test_a_stop_keeps_what_the_signal_interrupted_until_the_exit(kept_handlers):
    """A signal landing in numba's compiler leaves llvmlite objects half built, whose destructors report errors (or
    crash) when freed after the one line was printed: a stop keeps the interrupted frames until the process exits."""
    freed = []

    class HalfBuilt:
        def __del__(self) -> None:
            freed.append(self)

    def compile_kernel() -> None:
        _half = HalfBuilt()
        signal.raise_signal(signal.SIGTERM)

    with Signals() as signals:
        try:
            compile_kernel()
        except stopping.Terminated as exc:
            assert signals.stop_code(exc) == 143
    assert freed == []
    assert sys.unraisablehook is not sys.__unraisablehook__  # reports from what is freed anyway stay quiet


def test_an_interrupt_raised_in_process_leaves_the_handlers_as_they_were(kept_handlers):
    """No signal arrived (a caller's KeyboardInterrupt, as tests raise through main()): nothing to settle, and
    processes started afterwards must not inherit SIGINT or SIGTERM ignored."""
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with Signals() as signals:
        assert signals.stop_code(KeyboardInterrupt()) == 130
    assert {s: signal.getsignal(s) for s in before} == before


def test_without_a_signal_other_exceptions_are_not_a_stop():
    with Signals() as signals:
        pass
    assert signals.stop_code(RuntimeError("x")) is None
    assert signals.stop_code(KeyboardInterrupt()) == 130


@pytest.mark.parametrize(
    ("sig", "delay_s", "code", "word"),
    [
        (signal.SIGINT, 0.3, 130, "interrupted"),
        (signal.SIGINT, 2.5, 130, "interrupted"),
        (signal.SIGTERM, 2.0, 143, "terminated"),
    ],
)
def test_a_signal_to_simulate_prints_one_line(tmp_path, sig, delay_s, code, word):
    """A fresh numba cache: the kernels compile during the run, so a signal may land in numba's compiler (0.3 s:
    while the modules load)."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba"), "PIPER_SIM_PROGRESS": "0"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "piper_sim", "simulate", "small-moe", "--out", str(tmp_path / "o")],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(delay_s)
    proc.send_signal(sig)
    err = proc.communicate(timeout=120)[1]
    lines = [line for line in err.splitlines() if not line.startswith(("piper-sim: note:", "simulating "))]
    if proc.returncode == 0:  # finished before the signal (a fast machine): nothing to check
        pytest.skip(f"the run ended within {delay_s} s")
    assert (proc.returncode, lines) == (code, [f"piper-sim: {word}"])


TRIP = '''
import sys


class _Trip:
    """A KeyboardInterrupt raised from code run from a string as piper_sim.validate_commands is first imported."""

    def find_spec(self, name, path=None, target=None):
        if name == "piper_sim.validate_commands":
            sys.meta_path.remove(self)
            exec("raise KeyboardInterrupt")
        return None


sys.meta_path.insert(0, _Trip())
'''


def test_a_stop_under_python_m_keeps_its_status(tmp_path):
    """Under `python -m`, CPython exits by SIGINT after a KeyboardInterrupt crossed code it ran from a string, even one
    that was caught (piper_sim/__main__.py). A Ctrl-C landing in a dataclass's generated methods while the modules
    load does that; here a sitecustomize raises it from exec'd code as one of them is imported: still one line and
    130, not a death by SIGINT."""
    (tmp_path / "sitecustomize.py").write_text(TRIP)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, "-m", "piper_sim", "--help"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert (proc.returncode, proc.stderr.strip().splitlines()) == (130, ["piper-sim: interrupted"])
