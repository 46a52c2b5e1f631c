"""Measure a testbed path with a real TCP transfer: achieved bandwidth and round-trip time.

Owns `measure_link` and the two peers it runs, each in its own node namespace, with plain Python
sockets: `python -m piper_sim.testbed.tcp_probe serve IP NUM_BYTES TIMEOUT_S` (prints its port, then
answers pings and receives NUM_BYTES) and `... client SRC_IP DST_IP PORT NUM_BYTES PINGS TIMEOUT_S`
(prints one JSON line). The client binds the sending node's address and connects to the other node's
address, so traffic crosses the emulated links, never loopback. The peers import only the stdlib.
"""

from __future__ import annotations

import json
import socket
import statistics
import struct
import subprocess
import sys
import time
from dataclasses import dataclass

MAX_BYTES = 1 << 30
CHUNK = 1 << 18


@dataclass(frozen=True, kw_only=True)
class LinkMeasurement:
    """One transfer host_a -> host_b. Bandwidth is TCP goodput at the receiver, from its first to its
    last chunk (so connection set-up and the final ACK are excluded); RTTs are 1-byte ping-pongs."""

    src_host: int
    dst_host: int
    num_bytes: int
    bandwidth_bytes_per_s: float
    duration_s: float
    rtt_s: float  # median
    rtt_min_s: float


def _serve(ip: str, num_bytes: int, timeout_s: float) -> None:
    with socket.create_server((ip, 0)) as server:
        server.settimeout(timeout_s)
        print(server.getsockname()[1], flush=True)
        conn, _ = server.accept()
    with conn:
        conn.settimeout(timeout_s)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while (b := conn.recv(1)) == b"p":
            conn.sendall(b"p")
        if b != b"d":
            raise SystemExit(f"unexpected message {b!r}")
        got, first, start = 0, 0, 0.0
        while got < num_bytes:
            chunk = conn.recv(min(CHUNK, num_bytes - got))
            if not chunk:
                raise SystemExit(f"connection closed after {got} of {num_bytes} bytes")
            if got == 0:
                start, first = time.perf_counter(), len(chunk)
            got += len(chunk)
        elapsed = time.perf_counter() - start
        conn.sendall(struct.pack("!dq", elapsed, first))


def _client(src: str, dst: str, port: int, num_bytes: int, pings: int, timeout_s: float) -> None:
    with socket.create_connection((dst, port), timeout=timeout_s, source_address=(src, 0)) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rtts = []
        for i in range(pings + 2):  # the first two warm up (ARP is done, caches are hot)
            t0 = time.perf_counter()
            conn.sendall(b"p")
            if conn.recv(1) != b"p":
                raise SystemExit("ping not answered")
            if i >= 2:
                rtts.append(time.perf_counter() - t0)
        conn.sendall(b"d")
        payload = bytes(CHUNK)
        t0, sent = time.perf_counter(), 0
        while sent < num_bytes:
            sent += conn.send(payload[: min(CHUNK, num_bytes - sent)])
        reply = b""
        while len(reply) < 16:
            part = conn.recv(16 - len(reply))
            if not part:
                raise SystemExit("no result from the server")
            reply += part
        total = time.perf_counter() - t0
    elapsed, first = struct.unpack("!dq", reply)
    print(json.dumps({"elapsed_s": elapsed, "first_bytes": first, "total_s": total, "rtts_s": rtts}))


def measure_link(
    prefix: str,
    host_a: int,
    host_b: int,
    num_bytes: int = 4_000_000,
    *,
    pings: int = 20,
    timeout_s: float = 30.0,
    state_path: str | None = None,
) -> LinkMeasurement:
    """Send num_bytes over TCP from node host_a to node host_b of a running testbed; measure it."""
    # the peers run this module with the stdlib alone (python -m piper_sim.testbed.tcp_probe)
    from piper_sim.testbed.emulator import load
    from piper_sim.testbed.processes import package_env
    from piper_sim.testbed.shell import TestbedError, exec_argv, require_tools

    require_tools()
    if host_a == host_b:
        raise TestbedError("measure_link needs two different nodes (one node would talk over loopback)")
    if not 0 < num_bytes <= MAX_BYTES:
        raise TestbedError(f"measure_link num_bytes {num_bytes}: allowed 1..{MAX_BYTES}")
    if pings < 1:
        raise TestbedError(f"measure_link pings {pings}: allowed 1 or more")
    bed = load(prefix, state_path)
    if bed is None:
        raise TestbedError(f"no testbed {prefix!r} is up (no state file); run up() first")
    a, b = bed.host(host_a), bed.host(host_b)
    me = [sys.executable, "-m", "piper_sim.testbed.tcp_probe"]
    server = subprocess.Popen(
        exec_argv(b.namespace, [*me, "serve", b.ip, str(num_bytes), str(timeout_s)]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=package_env(),
    )
    try:
        assert server.stdout is not None
        port = server.stdout.readline().strip()
        if not port.isdigit():
            raise TestbedError(f"measurement server in {b.namespace} did not start: {server.stderr.read()}")
        client = subprocess.run(
            exec_argv(a.namespace, [*me, "client", a.ip, b.ip, port, str(num_bytes), str(pings), str(timeout_s)]),
            capture_output=True,
            text=True,
            env=package_env(),
            timeout=timeout_s + 10,
        )
        if client.returncode != 0:
            raise TestbedError(f"measurement client in {a.namespace} failed: {client.stderr.strip()}")
        server.wait(timeout=timeout_s)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        for stream in (server.stdout, server.stderr):
            if stream is not None:
                stream.close()
    res = json.loads(client.stdout)
    return LinkMeasurement(
        src_host=host_a,
        dst_host=host_b,
        num_bytes=num_bytes,
        bandwidth_bytes_per_s=(num_bytes - res["first_bytes"]) / res["elapsed_s"],
        duration_s=res["total_s"],
        rtt_s=statistics.median(res["rtts_s"]),
        rtt_min_s=min(res["rtts_s"]),
    )


def main(argv: list[str]) -> int:
    if argv[:1] == ["serve"] and len(argv) == 4:
        _serve(argv[1], int(argv[2]), float(argv[3]))
    elif argv[:1] == ["client"] and len(argv) == 7:
        _client(argv[1], argv[2], int(argv[3]), int(argv[4]), int(argv[5]), float(argv[6]))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
