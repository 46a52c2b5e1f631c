"""Running many independent points: in this process, or on Dask (a LocalCluster by default, an existing
cluster by its scheduler address), storing each result as it finishes, with a progress line and an ETA
(piper_sim.progress).

Owns run_points and the Dask client's life, and Dask's dashboard (off unless a command's --dashboard turns it on,
configure_engine; its address is printed on stderr). A point stored under its key (points.keys) is not run again.
Work functions must be importable module-level functions of piper_sim (Dask workers import them by name).
Must not import torch.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import socket
import struct
import sys
import time
from collections.abc import Callable, Iterable
from contextlib import ExitStack, contextmanager

from tqdm import tqdm

from piper_sim.errors import ConfigError
from piper_sim.points.keys import KeyedPoint
from piper_sim.points.store import ResultStore
from piper_sim.progress import bar as progress_bar
from piper_sim.stopping import interrupt_to_this_process_only, quiet_resource_tracker

CONNECT_TIMEOUT_S = 10
PROTOCOLS = ("tcp",)  # --scheduler's: tls needs certificates piper-sim takes no option for, ucx a UCX build
GREETING_LIMIT_BYTES = 2**20  # a Dask scheduler's first message (its handshake) is a few hundred bytes
SCHEDULER_ALLOWED = "a Dask scheduler's address such as tcp://host:8786"
DASHBOARD_ADDRESS = ":0"  # a LocalCluster's dashboard: a free port on every interface (the address is printed)
_dashboard = False  # whether this process's Dask clients serve (or, on --scheduler, point to) the dashboard


def check_scheduler(scheduler: str | None) -> None:
    """Fail at once, before any work, when --scheduler names no reachable Dask scheduler."""
    if scheduler:
        with dask_client(scheduler, None):
            pass


def workers_limit() -> int:
    """The most LocalCluster workers: one single-threaded process per core this process may run on (more only
    share the cores and take memory)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def check_workers(workers: int | None) -> None:
    """--workers: 0 (in this process) up to workers_limit(), or None (one per core)."""
    if workers is not None and not 0 <= workers <= workers_limit():
        raise ConfigError(
            "--workers",
            workers,
            f"0 (run in this process) to {workers_limit()}, this machine's cores "
            "(one single-threaded worker process per core)",
        )


def configure_engine(scheduler: str | None, workers: int | None = None, dashboard: bool = False) -> None:
    """Before any work: --workers is within bounds (check_workers), the scheduler is reachable (check_scheduler),
    and --dashboard can be served (a run on Dask; a LocalCluster draws it with bokeh) and is then on for this
    process's Dask clients."""
    global _dashboard
    check_workers(workers)
    if dashboard and workers == 0:
        raise ConfigError("--dashboard", "on", "a run on Dask: --workers 0 runs the points in this process, without it")
    if dashboard and not scheduler and importlib.util.find_spec("bokeh") is None:
        raise ConfigError(
            "--dashboard",
            "on",
            "bokeh installed, which Dask draws its dashboard with (pip install "
            "'bokeh>=3.1', or pip install -e '.[dashboard]')",
        )
    check_scheduler(scheduler)
    _dashboard = dashboard


@contextmanager
def dask_client(scheduler: str | None, workers: int | None):
    """A distributed.Client: to `scheduler` when given, else on a LocalCluster of `workers` single-threaded
    processes (default: one per core)."""
    from distributed import Client, LocalCluster  # distributed: heavy (~560 modules); only when points run on Dask

    if scheduler:
        probe_scheduler(scheduler)
        try:
            client = Client(scheduler, timeout=CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError, ValueError) as exc:
            raise ConfigError("--scheduler", scheduler, f"{SCHEDULER_ALLOWED} ({type(exc).__name__}: {exc})") from None
        try:
            yield client
        finally:
            client.close()
        return
    quiet_resource_tracker()
    dask_log = logging.getLogger("distributed")
    with ExitStack() as stack:
        stack.callback(dask_log.setLevel, dask_log.level)  # last out: after the cluster has closed
        with interrupt_to_this_process_only():  # the workers never see a Ctrl-C: closing the cluster stops them
            cluster = stack.enter_context(
                LocalCluster(
                    n_workers=workers or workers_limit(),
                    threads_per_worker=1,
                    processes=True,
                    dashboard_address=DASHBOARD_ADDRESS if _dashboard else None,
                    # workers log only what is fatal to them: a task's error reaches this process as the task's
                    # result, and a worker orphaned by a killed command would log its lost scheduler's heartbeats
                    # with tracebacks
                    silence_logs=logging.CRITICAL,
                )
            )
        client = stack.enter_context(Client(cluster))
        try:
            yield client
        except BaseException:  # a signal or an error stops the run: Dask's log of the cluster's closing is no news
            dask_log.setLevel(logging.CRITICAL + 1)
            raise


def scheduler_endpoint(scheduler: str) -> tuple[str, int]:
    """The host and port of a --scheduler address (tcp://host:port, or host:port); another protocol is refused
    by name."""
    protocol, sep, rest = scheduler.partition("://")
    protocol, rest = (protocol, rest) if sep else ("tcp", scheduler)
    if protocol not in PROTOCOLS:
        raise ConfigError(
            "--scheduler",
            scheduler,
            f"{SCHEDULER_ALLOWED} (protocol {protocol}:// is not supported: "
            f"piper-sim connects over {', '.join(PROTOCOLS)})",
        )
    host, _, port = rest.rstrip("/").rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 2**16:
        raise ConfigError("--scheduler", scheduler, f"{SCHEDULER_ALLOWED} (tcp://HOST:PORT)")
    return host.strip("[]"), int(port)


def probe_scheduler(scheduler: str) -> None:
    """Connect within CONNECT_TIMEOUT_S and read the length a Dask scheduler's greeting starts with (it sends its
    handshake on accept: 8 bytes, the message's size, then the message): anything else is a ConfigError saying
    what answered, before Dask's client reads a stranger's bytes as a message size (and allocates that)."""
    address = scheduler_endpoint(scheduler)
    try:
        with socket.create_connection(address, timeout=CONNECT_TIMEOUT_S) as sock:
            head = _read_up_to(sock, 8)
    except TimeoutError:
        found = f"a service that sent nothing in {CONNECT_TIMEOUT_S} s (a Dask scheduler greets at once)"
    except OSError as exc:
        found = f"no connection: {exc.strerror or exc}"
    else:
        size = struct.unpack("Q", head)[0] if len(head) == 8 else 0
        if 0 < size <= GREETING_LIMIT_BYTES:
            return
        found = f"a service that is not Dask: it sent {head!r}" if head else "a service that closed the connection"
    raise ConfigError("--scheduler", scheduler, f"{SCHEDULER_ALLOWED} (found {found})")


def _read_up_to(sock: socket.socket, nbytes: int) -> bytes:
    data = b""
    while len(data) < nbytes:
        chunk = sock.recv(nbytes - len(data))
        if not chunk:
            break
        data += chunk
    return data


def run_points(
    fn: Callable[[dict], dict],
    points: Iterable[KeyedPoint],
    store: ResultStore,
    *,
    scheduler: str | None = None,
    workers: int | None = None,
    label: str = "points",
    progress: bool = True,
    priority: Callable[[dict], float] | None = None,
) -> dict[str, dict]:
    """fn(payload) -> row for every point not stored under its key; returns {digest: row} for all points. What
    was reused and computed is in store.tally, and said on stderr (with progress).

    workers=0 runs in this process (no Dask); otherwise on Dask as dask_client says. priority(payload): points of
    a higher priority start first (the long ones first: the last to finish is then not a long one started late);
    equal priorities keep their order."""
    todo, out = [], {}
    for point in points:
        row = store.get(point.digest, point.key)
        if row is None:
            todo.append(point)
        else:
            out[point.digest] = row
    rank = {point.digest: priority(point.payload) if priority else 0.0 for point in todo}
    todo.sort(key=lambda point: -rank[point.digest])  # stable: equal priorities in their order
    bar = progress_bar(len(todo), label, "points", show=progress and bool(todo))
    start = time.perf_counter()
    if workers == 0 or not todo:
        for point in todo:
            out[point.digest] = _finish(store, point, fn(point.payload), bar)
    else:
        from distributed import as_completed  # distributed: heavy; only when points run on Dask

        with dask_client(scheduler, workers) as client:
            if _dashboard:
                print(f"piper-sim: Dask dashboard of {label}: {client.dashboard_link}", file=sys.stderr)
            futures = {
                client.submit(
                    fn, point.payload, key=f"{label}-{point.digest}", pure=False, priority=rank[point.digest]
                ): point
                for point in todo
            }
            for future in as_completed(futures):
                out[futures[future].digest] = _finish(store, futures[future], future.result(), bar)
    bar.close()
    if progress:
        lines = store.tally.lines(label)
        if todo:
            lines[0] += f" in {time.perf_counter() - start:.1f} s"
        print("\n".join(lines), file=sys.stderr)
    return out


def _finish(store: ResultStore, point: KeyedPoint, row: dict, bar: tqdm) -> dict:
    store.put(point.digest, point.key, row)
    bar.update(1)
    return row
