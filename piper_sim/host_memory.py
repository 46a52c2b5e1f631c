"""The host memory a simulate run needs: its peak estimated before it starts, checked against what this machine has
available (a ConfigError naming what to lower), and watched while it runs (MemoryGuard stops it with a PiperError
before the kernel would kill it).

The estimate is a sum of measured per-unit costs (benchmarks/bench_memory.py prints them; docs/performance.md,
"Host memory", gives the figures): the interpreter with its libraries and compiled kernels, the run's rank-task
records with the trace and report built from them, the topology and flow network per link and per all-to-all GPU
pair, and the growth while the chosen outputs are written. A sum is an upper bound: the outputs are written after
the records are let go.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from piper_sim.errors import ConfigError, PiperError

GIB = 2.0**30
MIB = 2**20
# measured with benchmarks/bench_memory.py (each phase's peak resident growth, Linux clear_refs; see the module),
# its dense cases (100B-class, TP 8 x PP 8 on 64, 128, 256 Frontier GCDs) and MoE cases (X-MoE Small, EP 16, 64):
BASE_BYTES = 300 * MIB  # interpreter, numpy/pandas/simpy/networkx, numba's compiled kernels: 268 MiB resident
BYTES_PER_TASK = 220  # a rank task's records and the report made from them: 99-209 B (dense cases)
BYTES_PER_LINK = 1_000  # the topology graph and the flow network's per-link arrays: 420-460 B (tracemalloc)
# the flows, routes and recorded runs of all-to-alls, per GPU pair of an EP group (num_gpus x ep pairs): 11-13 kB
# on Frontier (MoE cases, the growth less their tasks'); a dragonfly's contended all-to-alls hold more (at least
# 58 kB per pair, X-MoE Small EP 64 on 256 GPUs), which MemoryGuard catches
BYTES_PER_ALL_TO_ALL_PAIR = 16_000
# growth while writing each choice of outputs, in a process holding only the run's result (its task arrays): a fixed
# part (the libraries they load, the plots' canvas, the Parquet row group and the Perfetto trace's chunks in flight)
# and a part per trace row, most of it the trace frame the trace and Perfetto outputs are written from (built for
# them: RunResult.trace). Dense cases from 255k to 1M rows: report 9 MiB; trace 60-131 MiB, 97 B per row over 36 MiB;
# all 103-207 MiB for every --perfetto format at the default detail; MoE cases within them
OUTPUT_BYTES = {"report": (10 * MIB, 0), "trace": (40 * MIB, 100), "all": (140 * MIB, 100)}  # (fixed, per row)
# with all, the Perfetto trace's events at one track per rank (trace/tracks.py), per trace row: the 511k rows of
# dense-128 at --perfetto-detail rank grow 175-181 MiB against 95-102 at stage (160 B a row); the default (auto)
# gives them up to AGGREGATE_ROWS rows, one track per stage beyond (a stage's ranks' rows in one)
RANK_EVENT_BYTES = 160
AGGREGATE_ROWS = 200_000  # trace/tracks.py's (this module imports no trace code; a test holds them equal)
MARGIN_BYTES = 1 * 2**30  # MemoryGuard stops a run when this machine's available memory drops under this
GUARD_INTERVAL_S = 0.25  # how often MemoryGuard reads the available memory


def available_memory_bytes() -> int | None:
    """The memory this machine can give a process without swapping (Linux's MemAvailable); None where unknown."""
    return _meminfo("/proc/meminfo", "MemAvailable:")


def resident_bytes() -> int | None:
    """This process's resident size (Linux's VmRSS); None where unknown."""
    return _meminfo("/proc/self/status", "VmRSS:")


def _meminfo(path: str, field: str) -> int | None:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


@dataclass(frozen=True)
class RunMemory:
    """A run's estimated peak host memory, by what holds it (bytes)."""

    base_bytes: float
    tasks_bytes: float
    network_bytes: float
    outputs_bytes: float
    outputs_fixed_bytes: float = 0.0  # of outputs_bytes, the part that does not grow with the rank tasks

    @property
    def total_bytes(self) -> float:
        return self.base_bytes + self.tasks_bytes + self.network_bytes + self.outputs_bytes

    @property
    def per_task_bytes(self) -> float:
        """The part that scales with the rank tasks (and so with the micro-batches and steps)."""
        return self.tasks_bytes + self.outputs_bytes - self.outputs_fixed_bytes

    def text(self) -> str:
        """'about 12.3 GiB (rank tasks 9.1, network 0.1, outputs 2.8, interpreter and libraries 0.3)'."""
        return (
            f"about {self.total_bytes / GIB:.1f} GiB (rank tasks {self.tasks_bytes / GIB:.1f}, network "
            f"{self.network_bytes / GIB:.1f}, outputs {self.outputs_bytes / GIB:.1f}, interpreter and libraries "
            f"{self.base_bytes / GIB:.1f})"
        )


def estimate_run_memory(tasks: int, links: int, all_to_all_pairs: int, outputs: str | None) -> RunMemory:
    """The peak of a run of `tasks` rank tasks (over all its steps) on a topology of `links` links, whose
    all-to-alls join all_to_all_pairs GPU pairs (num_gpus x ep; 0 without), that writes `outputs`
    (outputs.OUTPUTS; None: the run writes nothing, as the planner's and validation's runs)."""
    fixed, per_row = OUTPUT_BYTES[outputs] if outputs is not None else (0, 0)
    if outputs == "all":  # the default detail's rank events: a bounded part
        fixed += RANK_EVENT_BYTES * min(tasks, AGGREGATE_ROWS)
    return RunMemory(
        base_bytes=BASE_BYTES,
        tasks_bytes=tasks * BYTES_PER_TASK,
        network_bytes=links * BYTES_PER_LINK + all_to_all_pairs * BYTES_PER_ALL_TO_ALL_PAIR,
        outputs_bytes=fixed + tasks * per_row,
        outputs_fixed_bytes=fixed,
    )


def check_run_memory(
    need: RunMemory, microbatches: int, outputs: str | None, available: int | None, smaller: Callable[[str], RunMemory]
) -> None:
    """Stop a run that would not fit in this machine's available memory, less MARGIN_BYTES (where MemoryGuard would
    stop it), before it starts, naming what to lower: --outputs where fewer outputs would fit (smaller(outputs) is
    the estimate with those outputs), else parallel.num_microbatches (the rank tasks and outputs scale with them)."""
    room = None if available is None else available - MARGIN_BYTES
    if room is None or need.total_bytes <= room:
        return
    assert available is not None  # room is None where available is
    tail = (
        f"this run needs {need.text()} and this machine has {available / GIB:.1f} GiB available, "
        f"{MARGIN_BYTES / GIB:.1f} GiB of it kept free (docs/performance.md, Host memory)"
    )
    for fewer in {"all": ("trace", "report"), "trace": ("report",)}.get(outputs or "", ()):
        if smaller(fewer).total_bytes <= room:
            raise ConfigError("--outputs", outputs, f"{fewer} here ({smaller(fewer).text()}): {tail}")
    scaled = need.per_task_bytes
    fits = max(int(microbatches * (room - (need.total_bytes - scaled)) / scaled), 0) if scaled else 0
    raise ConfigError(
        "parallel.num_microbatches",
        microbatches,
        f"at most about {fits} here: {tail}; fewer micro-batches, steps or GPUs, --outputs report, or "
        "a machine with more memory",
    )


class MemoryExceeded(PiperError):
    """A run stopped by MemoryGuard: this machine's available memory dropped under the margin."""


class MemoryGuard:
    """Reads this machine's available memory every interval_s from a daemon thread while a run works (and once as
    it starts); when it drops under margin_bytes (MARGIN_BYTES), check() raises MemoryExceeded in the thread that
    calls it, naming the run's estimate and its resident size. The simulator calls check() after every lane task,
    the output writers after every file and chunk of rows, so a run stops before the kernel would kill it."""

    def __init__(
        self,
        estimate_bytes: float,
        *,
        available: Callable[[], int | None] = available_memory_bytes,
        margin_bytes: float | None = None,
        interval_s: float = GUARD_INTERVAL_S,
    ) -> None:
        self.estimate_bytes, self.available = estimate_bytes, available
        self.margin_bytes = MARGIN_BYTES if margin_bytes is None else margin_bytes
        self.interval_s = interval_s
        self.error: MemoryExceeded | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="piper-sim-memory", daemon=True)

    def __enter__(self) -> MemoryGuard:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        while self.error is None and not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> None:
        """Read the available memory; under the margin, keep the error check() raises."""
        left = self.available()
        if left is None or left >= self.margin_bytes or self.error is not None:
            return
        rss = resident_bytes()
        held = f"holds {rss / GIB:.1f} GiB resident" if rss is not None else "grew"
        self.error = MemoryExceeded(
            f"stopped before the kernel kills it for memory: this run {held}, estimated at "
            f"{self.estimate_bytes / GIB:.1f} GiB before it started, and this machine has {left / GIB:.2f} GiB "
            f"available, under the {self.margin_bytes / GIB:.1f} GiB margin; fewer micro-batches, steps or GPUs, "
            "--outputs report, or a machine with more memory (docs/performance.md, Host memory)"
        )

    def check(self) -> None:
        """Raise the guard's MemoryExceeded once available memory has dropped under the margin."""
        if self.error is not None:
            raise self.error
