"""Progress lines with an ETA on stderr, shared by every long command (tqdm).

Owns whether a progress line is shown and how often it is redrawn: on a terminal only, once the work has
run DELAY_S (short work stays silent), redrawn at most every INTERVAL_S. The one switch is the environment
variable PIPER_SIM_PROGRESS: 0 turns every progress line off, 1 shows them even when stderr is not a
terminal (a log file, a CI job); unset (or "auto"), they show on a terminal only.
watch() samples a reading (simulated time, steps the ranks have written) into a line from a background
thread, so the work being watched carries no progress code; restart() says on the line that the work started over
and counts from zero again.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from tqdm import tqdm

from piper_sim.errors import ConfigError

ENV = "PIPER_SIM_PROGRESS"
DELAY_S = 2.0  # work shorter than this prints no progress line
INTERVAL_S = 0.25  # at most four redraws a second
BAR_FORMAT = "{desc}: {n_fmt}/{total_fmt} {unit} [{elapsed}<{remaining}]"


def enabled() -> bool:
    """Whether progress lines are shown: PIPER_SIM_PROGRESS, else whether stderr is a terminal."""
    value = os.environ.get(ENV, "auto").strip().lower()
    if value in ("", "auto"):
        return sys.stderr.isatty()
    if value in ("0", "1"):
        return value == "1"
    raise ConfigError(
        ENV,
        os.environ[ENV],
        "0 (no progress lines), 1 (always, also when stderr is not a terminal) or auto (unset: on a terminal only)",
    )


def bar(
    total: float | None,
    desc: str,
    unit: str = "done",
    *,
    show: bool = True,
    delay_s: float | None = None,
    bar_format: str = BAR_FORMAT,
    smoothing: float = 0.3,
) -> tqdm:
    """A progress line on stderr: desc: n/total unit [elapsed<ETA]; shown when show and enabled() allow it, once
    delay_s (default DELAY_S) has passed. smoothing: tqdm's weight of the latest rate in the ETA (0: the mean rate
    since the start, steadier where the work's pace varies). Use as a context manager (it closes the line) or call
    close()."""
    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        file=sys.stderr,
        disable=not (show and enabled()),
        delay=DELAY_S if delay_s is None else delay_s,
        mininterval=INTERVAL_S,
        bar_format=bar_format,
        dynamic_ncols=True,
        smoothing=smoothing,
    )


def restart(line: tqdm, desc: str) -> None:
    """The work under line started over: say desc on it at once (whatever the delay), from zero, elapsed time and
    rate counted anew."""
    line.set_description_str(desc, refresh=False)
    line.reset(total=line.total)
    if not line.disable:
        line.refresh()


@contextmanager
def watch(line: tqdm, read: Callable[[], float], interval_s: float | None = None) -> Iterator[tqdm]:
    """While the block runs, set line's count to read() every interval_s from a daemon thread (read must be
    cheap and safe to call from another thread: a plain attribute, a file size); the line is closed at the end. A
    reading past the line's total (an expected total that was short) raises the total to the reading."""
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(INTERVAL_S if interval_s is None else interval_s):
            _count(line, read())
            line.update(0)  # redraws, honouring the delay and the interval

    thread = None if line.disable else threading.Thread(target=sample, name="piper-sim-progress", daemon=True)
    if thread is not None:
        thread.start()
    try:
        yield line
    finally:
        stop.set()
        if thread is not None:
            thread.join()
            _count(line, read())  # the line closes on the last count, not on the last sample
        line.close()


def _count(line: tqdm, value: float) -> None:
    line.n = value
    if line.total is not None and value > line.total:
        line.total = value


class Eta:
    """Elapsed time and the time left, for work logged a line per item (the studies' [i/n] lines): the mean
    time of the items computed so far times the items still to compute (stored ones cost nothing)."""

    def __init__(self, to_compute: int, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock, self.t0 = clock, clock()
        self.to_compute, self.computed = to_compute, 0

    def finished(self) -> None:
        self.computed += 1

    def text(self) -> str:
        """'elapsed 1m12s, about 3m40s left'; '' before any item is computed."""
        if not self.computed:
            return ""
        elapsed = self.clock() - self.t0
        left = elapsed / self.computed * max(self.to_compute - self.computed, 0)
        return f"elapsed {_clock(elapsed)}, about {_clock(left)} left"


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s" if rest >= 60 else f"{rest}s"
