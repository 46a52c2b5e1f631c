"""Flat vs HALO all-to-all on the emulated testbed, measured and predicted (needs root).

    python benchmarks/bench_testbed_a2a.py [--topology topologies/testbed-2g.yaml] [--sizes 16384,65536,262144]
                                           [--profile cpu-2rank]

Brings the testbed up (prefix pstb), runs a uniform all-to-all of each size (bytes each rank sends to
each other rank) with each algorithm in the real ranks (gloo, one process per rank inside its node's
namespace), takes it down, and simulates the same all-to-all on the same topology file. Prints measured
and predicted times and the HALO-over-flat speedup of both. Two predictions: the network alone (phases,
flows, latencies, per-message overhead), and with the host cost of the library calls as the training
simulator charges it: one call per phase at the profile's per-call cost, all ranks calling at once on
the topology's shared cores (each rank gets cores / ranks of a core).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import simpy

from piper_sim.collectives.algorithms import ALL_TO_ALL
from piper_sim.network import CollectiveRunner, FlowNetwork
from piper_sim.topology.load import load_topology
from piper_sim.topology.placement import place
from piper_sim.workload.profile_load import load_profile

ROOT = Path(__file__).resolve().parent.parent


def predict(topology: str, world: int, size: int, algorithm: str, profile: str) -> tuple[float, float]:
    """(network-only time, time with the calls' host cost) of one uniform all-to-all."""
    topo = load_topology(topology, world)
    gpus = place(topo, world, "contiguous")
    env = simpy.Environment()
    runner = CollectiveRunner(env, FlowNetwork(env, topo.capacity_bytes_per_s), topo)
    phases = ALL_TO_ALL.get(algorithm)(np.full((world, world), float(size)), gpus, topo)
    env.run(runner.run(phases, tuple(gpus), algorithm))
    cores = topo.params.shared_cores
    share = min(1.0, cores / world) if cores else 1.0
    host = len(phases) * load_profile(profile).collective_call_s("all_to_all", world) / share
    return env.now, env.now + host


def measure(topology: str, sizes: list[int], algorithms: list[str], repeats: int) -> list[dict]:
    from piper_sim.testbed import down, up
    from piper_sim.torch_backend.process_launch import launch_in_namespaces

    bed = up(topology, prefix="pstb")
    try:
        rank_map = bed.rank_map()
        node_of = {r: bed.rank(r).host for r in rank_map}
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "a2a.json"
            launch_in_namespaces(
                "piper_sim.torch_backend.a2a_timing:time_all_to_all",
                (node_of, sizes, algorithms, repeats, str(out)),
                rank_map,
                Path(tmp),
                timeout_s=900,
            )
            return json.loads(out.read_text())
    finally:
        down("pstb")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--topology", default=str(ROOT / "topologies" / "testbed-2g.yaml"))
    parser.add_argument("--sizes", default="16384,65536,262144")
    parser.add_argument("--algorithms", default="flat,halo")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--profile", default="cpu-2rank", help="cost profile giving the per-call host cost")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    algorithms = args.algorithms.split(",")
    rows = measure(args.topology, sizes, algorithms, args.repeats)
    world = load_topology(args.topology).num_gpus
    print(
        f"{'bytes/pair':>10s} {'algorithm':>9s} {'measured ms':>12s} {'network ms':>11s} {'error':>7s} "
        f"{'with calls ms':>14s} {'error':>7s}"
    )
    by = {}
    for r in rows:
        net, full = predict(args.topology, world, r["bytes_per_pair"], r["algorithm"], args.profile)
        by[(r["bytes_per_pair"], r["algorithm"])] = (r["median_s"], net, full)
        print(
            f"{r['bytes_per_pair']:10d} {r['algorithm']:>9s} {r['median_s'] * 1e3:12.2f} {net * 1e3:11.2f} "
            f"{(net / r['median_s'] - 1) * 100:6.1f}% {full * 1e3:14.2f} {(full / r['median_s'] - 1) * 100:6.1f}%"
        )
    if "flat" in algorithms and "halo" in algorithms:
        print(f"\n{'bytes/pair':>10s} {'measured halo/flat speedup':>27s} {'network':>8s} {'with calls':>11s}")
        for size in sorted({k[0] for k in by}):
            (mf, nf, ff), (mh, nh, fh) = by[(size, "flat")], by[(size, "halo")]
            print(f"{size:10d} {mf / mh:27.2f} {nf / nh:8.2f} {ff / fh:11.2f}")


if __name__ == "__main__":
    main()
