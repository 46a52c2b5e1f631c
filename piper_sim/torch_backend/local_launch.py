"""Launch a function on N local processes joined in one torch.distributed group, with a deadline.

Owns local multi-process runs (tests, single-machine runs): a free TCP port on 127.0.0.1, spawn,
init_process_group in each child, destroy at the end, and killing the children it started when the
deadline passes so a hung collective never hangs the caller. The children die with this process (lifetime.py).
Only piper_sim.torch_backend may import torch.
"""

from __future__ import annotations

import os
import random
import socket
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .groups import shutdown
from .lifetime import children_ignore_interrupts, rank_process_setup

HOST = "127.0.0.1"


LOWEST_PORT = 10000


def _ephemeral_low(default: int = 32768) -> int:
    """The lowest port the kernel hands out on its own (Linux ip_local_port_range)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return default


def free_port(host: str = HOST) -> int:
    """A port nothing is bound to, chosen below the kernel's ephemeral range: a port the kernel picked
    would be free again once probed, and could be handed to another socket (gloo's own connections,
    another launch) before rank 0's store binds it."""
    low = _ephemeral_low()
    pool = range(LOWEST_PORT, max(low, LOWEST_PORT))
    candidates = random.SystemRandom().sample(pool, min(64, len(pool)))
    for port in [*candidates, 0]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise OSError(f"no free TCP port on {host}")


def _child(
    rank: int,
    fn: Callable[..., Any],
    world_size: int,
    port: int,
    backend: str,
    collective_timeout_s: float,
    num_threads: int | None,
    parent_pid: int,
    args: tuple[Any, ...],
) -> None:
    rank_process_setup(parent_pid)
    if num_threads:
        torch.set_num_threads(num_threads)
    os.environ.update(MASTER_ADDR=HOST, MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size))
    dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timedelta(seconds=collective_timeout_s))
    fn(rank, world_size, *args)
    shutdown()


def run_local(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    backend: str = "gloo",
    timeout_s: float = 60.0,
    num_threads: int | None = 1,
) -> None:
    """Run fn(rank, world_size, *args) on world_size spawned processes; raise on failure or timeout.

    fn must be importable (a module-level function). A child's exception is re-raised here
    (torch.multiprocessing.ProcessRaisedException); past timeout_s the children are killed and
    TimeoutError is raised. Each child uses num_threads intra-op threads (None: torch's default;
    one avoids oversubscribing the cores when several processes share a machine).
    """
    port = free_port()
    with children_ignore_interrupts():  # Ctrl-C reaches this process only; it stops the ranks (finally)
        context = mp.start_processes(
            _child,
            args=(fn, world_size, port, backend, timeout_s, num_threads, os.getpid(), args),
            nprocs=world_size,
            join=False,
            start_method="spawn",
        )
    deadline = time.monotonic() + timeout_s
    try:
        while not context.join(timeout=max(0.0, min(1.0, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{world_size} local processes did not finish within {timeout_s} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
                process.join()
