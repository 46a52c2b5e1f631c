"""How the command line stops on SIGINT and SIGTERM: one line on stderr and exit 130 or 143, wherever the signal lands.

Owns the handlers the CLI runs under (Signals), the line it prints and Stopped (a command that has cleaned up after a
signal). A signal raises KeyboardInterrupt (SIGINT) or Terminated (SIGTERM) in the main thread. Where Python cannot
propagate an exception (a ctypes callback: llvmlite's object cache while numba compiles a kernel) it is reported as
unraisable and dropped; the hook installed here keeps that report quiet and sends the signal again RESEND_S later, so
that it lands where it can unwind. Code an interrupt unwinds through may turn it into another exception (numba's
compiler: "no compiled object yet"): once a signal has arrived, every exception out of the command is that stop
(stop_code). Worker processes a command starts (Dask's LocalCluster) are started with SIGINT blocked
(interrupt_to_this_process_only): a terminal's Ctrl-C, sent to the whole process group, reaches the command alone, which
stops them on its way out; and multiprocessing's resource tracker, which outlives a killed command, does not warn about
the semaphores it then cleans up (quiet_resource_tracker).
Imports only the stdlib.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType

EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}
WORDS = {130: "interrupted", 143: "terminated"}
RESEND_S = 0.05  # a dropped signal is sent again this much later (past the callback that dropped it)
_STOPS: list[BaseException] = []  # a signal's stop, kept with its frames until the process exits (Signals._settle)


class Terminated(BaseException):
    """SIGTERM: unwinds like Ctrl-C, so that what a command started (rank processes) is stopped on the way out."""


class Stopped(BaseException):
    """A command stopped by a signal has cleaned up and the process is to exit with `code`, its signals held
    ignored until it does (main does not restore them)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class Signals:
    """SIGINT and SIGTERM handlers for the block (main thread only, and not for a signal the process was started
    ignoring), restored after it unless hold() was called or a signal arrived (the process is then stopping: they
    stay ignored)."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._held = False
        self._previous: dict[int, object] = {}
        self._hook = None
        self._timers: list[threading.Timer] = []
        self._inside = False

    def __enter__(self) -> Signals:
        if threading.current_thread() is not threading.main_thread():
            return self
        for signum in EXIT_CODES:
            if signal.getsignal(signum) != signal.SIG_IGN:  # ignored by who started us (a background job): stays
                self._previous[signum] = signal.signal(signum, self._handle)
        self._hook, sys.unraisablehook = sys.unraisablehook, self._unraisable
        self._inside = True
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._inside = False
        for timer in self._timers:
            timer.cancel()
        if not self._previous:
            return
        if not _STOPS:  # stopping: the quiet hook stays until the exit
            sys.unraisablehook = self._hook
        for signum, previous in self._previous.items():
            if self._held or self.received is not None:
                signal.signal(signum, signal.SIG_IGN)
            else:
                signal.signal(signum, previous)

    def hold(self) -> None:
        """Leave the signals ignored after the block (a command that cleaned up and is exiting)."""
        self._held = True

    def stop_code(self, exc: BaseException) -> int | None:
        """The exit status when exc ends the command because of a signal (130, 143), else None. A stop settles the
        signals at once: a resend still pending (see _unraisable) or a second Ctrl-C is ignored, so that nothing
        interrupts the one line and the exit that follow."""
        if self.received is not None:
            code = EXIT_CODES[self.received]
        elif isinstance(exc, KeyboardInterrupt):
            code = 130
        else:
            code = 143 if isinstance(exc, Terminated) else None
        if self.received is not None and self._inside:  # a real signal: a KeyboardInterrupt raised in-process has none
            self._settle(exc)
        return code

    def _settle(self, exc: BaseException) -> None:
        """The process is stopping: the frames the signal interrupted are kept, not torn down, until it exits. A signal
        landing in numba's compiler leaves llvmlite objects half built, whose destructors report errors (or crash)
        when freed; the exit (exit_now) needs none of them."""
        _STOPS.append(exc)
        gc.disable()
        for timer in self._timers:
            timer.cancel()
        for signum in self._previous:
            signal.signal(signum, signal.SIG_IGN)  # a signal already delivered but not yet handled is dropped too

    def _handle(self, signum: int, frame: object) -> None:
        self.received = signum
        raise KeyboardInterrupt if signum == signal.SIGINT else Terminated

    def _unraisable(self, unraisable: sys.UnraisableHookArgs) -> None:
        if _STOPS:  # stopping: a destructor of what the signal interrupted has nothing to tell the user
            return
        if self.received is None or not issubclass(unraisable.exc_type, KeyboardInterrupt | Terminated):
            self._hook(unraisable)
            return
        timer = threading.Timer(RESEND_S, os.kill, (os.getpid(), self.received))
        timer.daemon = True
        self._timers.append(timer)
        timer.start()


@contextmanager
def interrupt_to_this_process_only() -> Iterator[None]:
    """SIGINT blocked in this thread inside the block, so that the threads started inside, and the processes those
    start, inherit the mask and never see a Ctrl-C (their parent stops them); this thread gets a Ctrl-C that arrived
    meanwhile when the block ends. Enter what must be cleaned up before the block ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


TRACKER_WARNING = "ignore:resource_tracker:UserWarning"  # "There appear to be N leaked semaphore objects"


def quiet_resource_tracker() -> None:
    """Start multiprocessing's resource tracker (if not yet running) with its leak warning off: after a SIGKILL of
    this process it removes the semaphores left behind, which is its job, not news for the user."""
    # multiprocessing (~5 ms): only where Dask starts, not before the CLI's signal handlers are in place
    from multiprocessing import resource_tracker

    if TRACKER_WARNING not in sys.warnoptions:
        sys.warnoptions.append(TRACKER_WARNING)  # the tracker is started with this process's -W options
    resource_tracker.ensure_running()


def exit_now(code: object) -> None:
    """Exit with `code` (an int status) at once, stdout and stderr flushed: a command stopped by a signal has cleaned
    up, and the interpreter's own exit could turn the status into a death by SIGINT (piper_sim/__main__.py)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else 1)


def say_stopped(code: int) -> None:
    """The one line a stopped command prints."""
    print(f"piper-sim: {WORDS[code]}", file=sys.stderr)


@contextmanager
def while_loading() -> Iterator[None]:
    """A signal while the command line's modules load: the one line and exit 130 or 143, not an import traceback."""
    with Signals() as signals:
        try:
            yield
        except (KeyboardInterrupt, Terminated) as exc:
            code = signals.stop_code(exc)
            say_stopped(code)
            raise SystemExit(code) from None
