"""What gloo gets from the emulated testbed, beyond what the simulator's links model (needs root).

    python benchmarks/bench_testbed_gloo.py [--topology topologies/testbed-2g.yaml]

Brings the testbed up (prefix pstg), runs 8 ranks (one process per rank in its node's namespace) and
prints, each as the median of several repeats:
1. Goodput across the global link (ranks 0-3 in group 0, 4-7 in group 1): 4 MiB in one flow one way,
   one pair both ways, and four pairs each way (HALO's phase II pattern). One way reaches the link rate;
   both ways lose goodput because ACKs queue behind data in the shaped links' queues.
2. A 16 KiB all-to-all inside one node pair (ranks 0 and 1, loopback): alone, all four node pairs at
   once, and while the six other ranks compute (a pair must be co-scheduled to exchange).
Used by validation/README.md ("Known gaps").
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MIB = 1 << 20


def _flows(rank: int, patterns: dict[str, list[tuple[int, int, int]]], repeats: int) -> dict[str, float]:
    import torch
    import torch.distributed as dist

    send, recv = torch.randn(MIB), torch.empty(MIB)  # 4 MiB of float32
    out = {}
    for name, flows in patterns.items():
        times = []
        for _ in range(repeats + 1):
            dist.barrier()
            t0 = time.perf_counter()
            works = [dist.isend(send[:n], d) for s, d, n in flows if s == rank]
            works += [dist.irecv(recv[:n], s) for s, d, n in flows if d == rank]
            for w in works:
                w.wait()
            elapsed = torch.tensor([time.perf_counter() - t0])
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            times.append(float(elapsed))
        out[name] = statistics.median(times[1:])
    return out


def _pair_all_to_all(rank: int, world: int, repeats: int) -> dict[str, float]:
    import torch
    import torch.distributed as dist

    groups = [dist.new_group([2 * i, 2 * i + 1]) for i in range(world // 2)]
    mine = groups[rank // 2]
    data = torch.randn(2 * 16, 256)  # 16 KiB to the partner
    out = torch.empty_like(data)
    result = {}
    for mode in ("pair 0-1 alone", "all node pairs at once", "pair 0-1 while 6 ranks compute"):
        times = []
        for _ in range(repeats + 5):
            dist.barrier()
            if rank < 2 or mode == "all node pairs at once":
                t0 = time.perf_counter()
                dist.all_to_all_single(out, data, group=mine)
                times.append(time.perf_counter() - t0)
            elif mode.endswith("compute"):
                a, t0 = torch.randn(256, 256), time.perf_counter()
                while time.perf_counter() - t0 < 0.02:
                    a = a @ a * 1e-3
        if rank == 0:
            result[mode] = statistics.median(times[5:])
    return result


def worker(rank: int, world: int, repeats: int, out_path: str) -> None:
    """Runs in every rank (launched by measure)."""
    quarter = MIB // 4
    patterns = {
        "one flow one way (0->4)": [(0, 4, MIB)],
        "one pair both ways (0<->4)": [(0, 4, MIB), (4, 0, MIB)],
        "four pairs each way": [
            (0, 4, quarter),
            (1, 6, quarter),
            (2, 5, quarter),
            (3, 7, quarter),
            (4, 0, quarter),
            (6, 1, quarter),
            (5, 2, quarter),
            (7, 3, quarter),
        ],
    }
    flows = _flows(rank, patterns, repeats)
    pair = _pair_all_to_all(rank, world, repeats * 5)
    if rank == 0:
        Path(out_path).write_text(json.dumps({"flows_s": flows, "pair_all_to_all_s": pair}))


def measure(topology: str, repeats: int) -> dict:
    import sys

    from piper_sim.testbed import down, up
    from piper_sim.torch_backend.process_launch import launch_in_namespaces

    bed = up(topology, prefix="pstg")
    try:
        ranks = bed.rank_map()
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "gloo.json"
            launch_in_namespaces(
                f"{Path(__file__).stem}:worker",
                (repeats, str(out)),
                ranks,
                Path(tmp),
                timeout_s=600,
                env={"PYTHONPATH": str(Path(__file__).resolve().parent)},
            )
            print(f"testbed {topology}: {len(ranks)} ranks", file=sys.stderr)
            return json.loads(out.read_text())
    finally:
        down("pstg")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--topology", default=str(ROOT / "topologies" / "testbed-2g.yaml"))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    result = measure(args.topology, args.repeats)
    print("goodput over the global link (per direction)")
    for name, seconds in result["flows_s"].items():
        print(f"  {name:28s} {seconds * 1e3:8.1f} ms  {4 * MIB / seconds / 1e6:6.2f} MB/s")
    print("16 KiB all-to-all in one node pair (loopback)")
    for name, seconds in result["pair_all_to_all_s"].items():
        print(f"  {name:32s} {seconds * 1e3:6.2f} ms")


if __name__ == "__main__":
    main()
