"""Userspace delay line for kernels without sch_netem: TAP pairs forwarded with a fixed delay.

Owns the one process per testbed that gives links their latency when `tc qdisc ... netem` is not
available. Each emulated link is then a pair of TAP devices (one in each namespace) instead of a veth
pair; this process holds both file descriptors and copies every frame from one to the other after the
link's one-way delay for that direction. Rate shaping stays in the kernel (tbf on each TAP, i.e. on the
egress towards this process), so only the delay is done here. Frames carry a virtio-net header and the
TAPs accept TSO/checksum offload, so TCP hands over up to 64 KiB per frame (about 5 KB on average at
the testbed's rates): an 8-rank all-to-all over testbed-2g costs this process about a quarter of a
core. It runs at a low real-time priority so that busy ranks do not stretch the emulated latencies.

Run as `python -m piper_sim.testbed.delayline --prefix PREFIX STATE_JSON` (the prefix is only there so
`down` can find the process after a crash); it reads `delay_links` from the state file, attaches every
TAP, prints "ready" on stdout, then forwards until SIGTERM. Imports only the stdlib.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import select
import signal
import statistics
import struct
import sys
import time
from collections import deque
from dataclasses import dataclass, field

TUNSETIFF = 0x400454CA
TUNSETOFFLOAD = 0x400454D0
IFF_TAP, IFF_NO_PI, IFF_VNET_HDR = 0x0002, 0x1000, 0x4000
TUN_F_CSUM, TUN_F_TSO4, TUN_F_TSO6 = 0x01, 0x02, 0x04
CLONE_NEWNET = 0x40000000
PR_SET_TIMERSLACK = 29
RT_PRIORITY = 10
MAX_FRAME = 65536 + 64
MAX_COMPENSATION_S = 100e-6  # bound on the wake-up compensation
MAX_QUEUED_FRAMES = 4096  # per direction; beyond this frames are dropped (like a full netem queue)


@dataclass(kw_only=True)
class Direction:
    """Frames read from `src_fd` are written to `dst_fd` `delay_s` later, in order."""

    src_fd: int
    dst_fd: int
    delay_s: float
    queue: deque[tuple[float, bytes]] = field(default_factory=deque)
    dropped: int = 0


def _setns(path: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


def open_tap(namespace: str | None, name: str) -> int:
    """Attach to the existing TAP `name` inside netns `namespace` (None: this process's netns)."""
    home_fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        if namespace is not None:
            _setns(f"/run/netns/{namespace}")
        fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
        try:
            fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI | IFF_VNET_HDR))
            fcntl.ioctl(fd, TUNSETOFFLOAD, TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6)
        except OSError:
            os.close(fd)
            raise
    finally:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.setns(home_fd, CLONE_NEWNET)
        os.close(home_fd)
    return fd


def attach(links: list[dict]) -> list[Direction]:
    """Open both TAPs of every link; two Directions per link."""
    directions = []
    for link in links:
        fd_a = open_tap(link["a"]["namespace"], link["a"]["interface"])
        fd_b = open_tap(link["b"]["namespace"], link["b"]["interface"])
        directions.append(Direction(src_fd=fd_a, dst_fd=fd_b, delay_s=link["a_to_b"]["delay_s"]))
        directions.append(Direction(src_fd=fd_b, dst_fd=fd_a, delay_s=link["b_to_a"]["delay_s"]))
    return directions


def _drain(d: Direction, now: float) -> None:
    due = now + d.delay_s
    while True:
        try:
            frame = os.read(d.src_fd, MAX_FRAME)
        except BlockingIOError:
            return
        if len(d.queue) >= MAX_QUEUED_FRAMES:
            d.dropped += 1
        else:
            d.queue.append((due, frame))


def _release(d: Direction, now: float) -> None:
    while d.queue and d.queue[0][0] <= now:
        _, frame = d.queue.popleft()
        try:
            os.write(d.dst_fd, frame)
        except OSError:  # peer TAP gone or refusing the frame: drop it, as a wire would
            d.dropped += 1


def timer_overshoot_s(samples: int = 41, sleep_s: float = 300e-6) -> float:
    """Median by which a timed select() wakes late on this machine (timer and scheduler latency)."""
    late = []
    for _ in range(samples):
        t0 = time.monotonic()
        select.select([], [], [], sleep_s)
        late.append(time.monotonic() - t0 - sleep_s)
    return min(max(0.0, statistics.median(late)), MAX_COMPENSATION_S)


def forward(directions: list[Direction]) -> None:
    """The event loop: read every readable TAP, write every due frame, sleep until the next is due.

    Each frame is queued for its link's delay less the timer overshoot measured at start (tens of
    microseconds, otherwise added to every hop). The compensation is fixed, not adaptive: under CPU
    contention wake-ups are later still and delays grow, as they would on a loaded host.
    """
    compensation = timer_overshoot_s()
    for d in directions:
        d.delay_s = max(0.0, d.delay_s - compensation)
    by_fd = {d.src_fd: d for d in directions}
    while True:
        now = time.monotonic()
        for d in directions:
            _release(d, now)
        heads = [d.queue[0][0] for d in directions if d.queue]
        timeout = max(0.0, min(heads) - time.monotonic()) if heads else 1.0
        readable, _, _ = select.select(list(by_fd), [], [], timeout)
        woke = time.monotonic()
        for fd in readable:
            _drain(by_fd[fd], woke)


def _raise_priority() -> None:
    """The emulated wires should not slow down when the hosts are busy: a low real-time priority
    (the process sleeps between frames; the kernel's RT throttling bounds it anyway), else nice -10."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(RT_PRIORITY))
    except OSError:
        try:
            os.nice(-10)
        except OSError:
            pass


def _exit(signum: int, frame: object) -> None:
    raise SystemExit(0)


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] != "--prefix":
        print("usage: python -m piper_sim.testbed.delayline --prefix PREFIX STATE_JSON", file=sys.stderr)
        return 2
    with open(argv[2]) as f:
        state = json.load(f)
    directions = attach(state["delay_links"])
    ctypes.CDLL(None).prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)  # wake on time: 1 ns slack, not 50 us
    _raise_priority()
    signal.signal(signal.SIGTERM, _exit)
    signal.signal(signal.SIGINT, _exit)
    print("ready", flush=True)
    forward(directions)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
