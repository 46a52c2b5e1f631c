"""CPU the testbed's userspace delay line uses per byte and per message it forwards (needs root).

    python benchmarks/bench_testbed_delayline.py [--topology topologies/testbed-2g.yaml]

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
IDLE_S = 3.0
# (name, source rank, destination rank, floats per message, links crossed, messages): about 3 s each; ranks
# 0-1 sit on node 0 (switch s0), 2-3 on node 1 (s1, same group), 4-5 on node 2 (s2, the other group)
PATTERNS = (
    ("idle", None, None, 0, 0, 0),
    ("4 MiB messages, node 0 -> node 1", 0, 2, FLOATS_4MIB, 3, 10),
    ("4 MiB messages, node 0 -> node 2 (global link)", 0, 4, FLOATS_4MIB, 4, 5),
    ("4 KiB messages, node 0 -> node 1", 0, 2, FLOATS_4KIB, 3, 1000),
)


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def worker(rank: int, world: int, delayline_pid: int, out_path: str) -> None:
    """Runs in every rank (launched by measure). Rank 0 is every pattern's source and reads the delay line's
    CPU around it; no other traffic runs meanwhile (the destination's one-float reply tells rank 0 that
    the last message arrived)."""
    import torch
    import torch.distributed as dist

    del world
    buffer, reply = torch.randn(FLOATS_4MIB), torch.zeros(1)
    results = []
    for name, src, dst, floats, links, messages in PATTERNS:
        dist.barrier()
        if rank == 0:
            t0, cpu0 = time.perf_counter(), _cpu_s(delayline_pid)
            if src is None:
                time.sleep(IDLE_S)
            for _ in range(messages):
                dist.send(buffer[:floats], dst)
            if src is not None:
                dist.recv(reply, dst)
            results.append(
                {
                    "pattern": name,
                    "messages": messages,
                    "payload_bytes": messages * floats * 4,
                    "links": links,
                    "wall_s": time.perf_counter() - t0,
                    "delayline_cpu_s": _cpu_s(delayline_pid) - cpu0,
                }
            )
        elif rank == dst:
            for _ in range(messages):
                dist.recv(buffer[:floats], src)
            dist.send(reply, src)
    if rank == 0:
        Path(out_path).write_text(json.dumps(results))


def measure(topology: str) -> list[dict]:
    from piper_sim.testbed import down, up
    from piper_sim.torch_backend.process_launch import launch_in_namespaces

    down("pstd")
    bed = up(topology, prefix="pstd")
    try:
        if bed.delayline_pid is None:
            raise SystemExit(
                f"this testbed runs without the userspace delay line (delay mode {bed.delay_mode}): nothing to measure"
            )
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "delayline.json"
            launch_in_namespaces(
                f"{Path(__file__).stem}:worker",
                (bed.delayline_pid, str(out)),
                bed.rank_map(),
                Path(tmp),
                timeout_s=600,
                env={"PYTHONPATH": str(Path(__file__).resolve().parent)},
            )
            return json.loads(out.read_text())
    finally:
        down("pstd")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--topology", default=str(ROOT / "topologies" / "testbed-2g.yaml"))
    args = parser.parse_args()
    results = measure(args.topology)
    print(
        f"the delay line's CPU, about 3 s per pattern (CPU time in clock ticks of "
        f"{1e3 / os.sysconf('SC_CLK_TCK'):.0f} ms)"
    )
    for r in results:
        line = (
            f"  {r['pattern']:48s} {r['payload_bytes'] / 1e6:7.1f} MB in {r['wall_s']:5.2f} s   "
            f"CPU {r['delayline_cpu_s']:5.2f} s ({r['delayline_cpu_s'] / r['wall_s']:.2f} cores)"
        )
        if r["payload_bytes"]:
            per_byte_ns = r["delayline_cpu_s"] / r["payload_bytes"] * 1e9
            line += (
                f"   {per_byte_ns:5.2f} ns per byte, {per_byte_ns / r['links']:5.2f} per byte per link,"
                f" {r['delayline_cpu_s'] / r['messages'] * 1e6:7.1f} us per message"
            )
        print(line)


if __name__ == "__main__":
    main()
