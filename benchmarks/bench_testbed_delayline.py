"""CPU the testbed's userspace delay line uses per byte and per message it forwards (needs root).

    python benchmarks/bench_testbed_delayline.py [--topology topologies/testbed-2g.yaml] [--seconds 3]

On a kernel without sch_netem every emulated link (node to switch, switch to switch) is a TAP pair whose
frames one process copies across after the link's delay, at a real-time priority
(piper_sim/testbed/delayline.py). That CPU comes out of the cores the ranks compute on, and the
simulator does not charge it (validation/README.md, "Known gaps"). This brings the testbed up (prefix
pstd), runs 8 ranks, and for each traffic pattern reads the delay line's CPU time (/proc/PID/stat) before
and after: bulk 4 MiB messages inside a group (3 emulated links) and across the global link (4 links),
small 4 KiB messages inside a group, and nothing (its cost when idle). Prints, per pattern, the payload,
the wall time, the delay line's CPU, and its CPU per payload byte and per payload byte per link crossed
(each link is one copy by the delay line), or per message for the small ones.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FLOATS_4MIB = 1 << 20
FLOATS_4KIB = 1 << 10
# (name, source rank, destination rank, floats per message, links crossed); ranks 0-1 sit on node 0
# (switch s0), 2-3 on node 1 (s1, same group), 4-5 on node 2 (s2, the other group)
PATTERNS = (
    ("idle", None, None, 0, 0),
    ("4 MiB messages, node 0 -> node 1", 0, 2, FLOATS_4MIB, 3),
    ("4 MiB messages, node 0 -> node 2 (global link)", 0, 4, FLOATS_4MIB, 4),
    ("4 KiB messages, node 0 -> node 1", 0, 2, FLOATS_4KIB, 3),
)


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def worker(rank: int, world: int, delayline_pid: int, seconds: float, out_path: str) -> None:
    """Runs in every rank (launched by measure): each pattern for about `seconds`, rank 0 timing it."""
    import torch
    import torch.distributed as dist

    del world
    buffer = torch.randn(FLOATS_4MIB)
    results = []
    for name, src, dst, floats, links in PATTERNS:
        dist.barrier()
        t0, cpu0 = time.perf_counter(), _cpu_s(delayline_pid) if rank == 0 else 0.0
        messages = 0
        while True:
            go = torch.tensor([1.0 if time.perf_counter() - t0 < seconds else 0.0])
            dist.broadcast(go, 0)  # rank 0 decides when the pattern has run long enough
            if not go.item():
                break
            if rank == src:
                dist.send(buffer[:floats], dst)
            elif rank == dst:
                dist.recv(buffer[:floats], src)
            elif src is None:
                time.sleep(0.1)
            messages += 1
        if rank == 0:
            results.append({"pattern": name, "messages": messages if src is not None else 0,
                            "payload_bytes": messages * floats * 4 if src is not None else 0, "links": links,
                            "wall_s": time.perf_counter() - t0, "delayline_cpu_s": _cpu_s(delayline_pid) - cpu0})
    if rank == 0:
        Path(out_path).write_text(json.dumps(results))


def measure(topology: str, seconds: float) -> list[dict]:
    from piper_sim.testbed import down, up
    from piper_sim.torch_backend.process_launch import launch_in_namespaces

    down("pstd")
    bed = up(topology, prefix="pstd")
    try:
        if bed.delayline_pid is None:
            raise SystemExit(f"this testbed runs without the userspace delay line (delay mode {bed.delay_mode}): "
                             "nothing to measure")
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "delayline.json"
            launch_in_namespaces(f"{Path(__file__).stem}:worker", (bed.delayline_pid, seconds, str(out)),
                                 bed.rank_map(), Path(tmp), timeout_s=600,
                                 env={"PYTHONPATH": str(Path(__file__).resolve().parent)})
            return json.loads(out.read_text())
    finally:
        down("pstd")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--topology", default=str(ROOT / "topologies" / "testbed-2g.yaml"))
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    results = measure(args.topology, args.seconds)
    print(f"the delay line's CPU, {args.seconds:.0f} s per pattern (CPU time in clock ticks of "
          f"{1e3 / os.sysconf('SC_CLK_TCK'):.0f} ms)")
    for r in results:
        line = (f"  {r['pattern']:48s} {r['payload_bytes'] / 1e6:7.1f} MB in {r['wall_s']:5.2f} s   "
                f"CPU {r['delayline_cpu_s']:5.2f} s ({r['delayline_cpu_s'] / r['wall_s']:.2f} cores)")
        if r["payload_bytes"]:
            per_byte_ns = r["delayline_cpu_s"] / r["payload_bytes"] * 1e9
            line += (f"   {per_byte_ns:5.2f} ns per byte, {per_byte_ns / r['links']:5.2f} per byte per link,"
                     f" {r['delayline_cpu_s'] / r['messages'] * 1e6:7.1f} us per message")
        print(line)


if __name__ == "__main__":
    main()
