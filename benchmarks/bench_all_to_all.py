"""Speed of the all-to-all study and of one all-to-all on Frontier (prints figures; no assertions).

`--study` runs the issue's study line in a child process and prints its wall time and peak memory:
    piper-sim study all-to-all --topology frontier --nodes 1,2,4,...,512 --sizes 1MiB,64MiB --size-per gpu
        --algorithms flat,rccl,halo   (target: 60 s and 2 GB on the 2-core development machine)

Single-collective cases (each in its own process, so peak memory is its own), placement contiguous,
1 MiB per GPU pair, the whole machine (74 groups) behind the job:
  spr512   512 nodes (4096 GCDs), frontier preset (adaptive routing), detours spread mean-field
  min512   512 nodes, frontier preset with routing: minimal
  hash8    8 nodes, frontier preset exactly as `simulate` routes it (adaptive, one hashed detour per pair)
  hash16   16 nodes, same (hashed detours break every symmetry: about one solve per flow)
Reported: wall time by stage, simulated time, GPU pairs, network flows (one per path, what the flow
network would carry without aggregation), flows actually routed (after the host-symmetry reduction),
simulated flows (equitable classes) and fair-share solves.

    python benchmarks/bench_all_to_all.py [--study] [--only min512,hash8] [--nodes 512 --routing minimal]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time

from piper_sim.progress import bar as progress_bar

CASES = {
    "spr512": {"nodes": 512, "routing": None, "valiant": "spread"},
    "min512": {"nodes": 512, "routing": "minimal", "valiant": "spread"},
    "hash8": {"nodes": 8, "routing": None, "valiant": "hashed"},
    "hash16": {"nodes": 16, "routing": None, "valiant": "hashed"},
}


def run_one(nodes: int, routing: str | None, valiant: str, algorithm: str = "flat") -> dict:
    import numpy as np

    from piper_sim.collectives.algorithms import ALL_TO_ALL
    from piper_sim.studies.all_to_all import HOST_EQUIVARIANT, StudySpec, build_topology
    from piper_sim.studies.reduced_collective import prepare, simulate

    t0 = time.perf_counter()
    spec = StudySpec(
        topology="frontier", nodes=(nodes,), sizes=("1MiB",), algorithms=(algorithm,), routing=routing, valiant=valiant
    )
    topo, gpus = build_topology(spec, nodes)
    t1 = time.perf_counter()
    phases = ALL_TO_ALL.get(algorithm)(np.full((len(gpus), len(gpus)), 2.0**20), gpus, topo)
    t2 = time.perf_counter()
    prep = prepare(phases, gpus, topo, symmetric=algorithm in HOST_EQUIVARIANT, spread=valiant == "spread")
    run = simulate(prep, topo)
    t3 = time.perf_counter()
    return {
        "nodes": nodes,
        "gcds": len(gpus),
        "routing": topo.router.fabric.spec.routing,
        "valiant": valiant,
        "wall_s": t3 - t0,
        "topology_s": t1 - t0,
        "phases_s": t2 - t1,
        "prepare_s": prep.prepare_s,
        "simulate_s": run.simulate_s,
        "collective_time_s": run.time_s,
        "pairs": prep.num_pairs,
        "network_flows": prep.num_sub_flows,
        "routed_flows": prep.num_routed,
        "simulated_flows": prep.lumped.num_flow_classes,
        "simulated_links": prep.lumped.num_link_classes,
        "refinement_rounds": prep.lumped.rounds,
        "exact_check": prep.lumped.exact_check,
        "automorphisms": prep.num_automorphisms,
        "fair_share_solves": run.num_solves,
        "peak_rss_MiB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


STUDY = [
    "study",
    "all-to-all",
    "--topology",
    "frontier",
    "--nodes",
    "1,2,4,8,16,32,64,128,256,512",
    "--sizes",
    "1MiB,64MiB",
    "--size-per",
    "gpu",
    "--algorithms",
    "flat,rccl,halo",
]


def run_study(out: str) -> None:
    """The study line in a child process: wall time and the child's peak RSS."""
    code = (
        "import sys, resource; from piper_sim.cli import main; rc = main(sys.argv[1:]); "
        "print('PEAK_MIB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, file=sys.stderr); "
        "sys.exit(rc)"
    )
    shutil.rmtree(out, ignore_errors=True)  # the study resumes from a folder's stored rows: time it from scratch
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code, *STUDY, "--out", out], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    peak = [line.split()[1] for line in done.stderr.splitlines() if line.startswith("PEAK_MIB")]
    print(
        f"study ({' '.join(STUDY)}): exit {done.returncode}, wall {wall:.1f} s, "
        f"peak RSS {float(peak[0]) if peak else float('nan'):.0f} MiB; rows in {out}/study.csv",
        flush=True,
    )
    print(
        f"    on {len(os.sched_getaffinity(0))} cores, load average {os.getloadavg()[0]:.1f} after the run "
        "(other processes sharing the cores slow it down)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--study", action="store_true", help="time the whole study line (see the module docstring)")
    ap.add_argument("--study-out", default="/tmp/bench-all-to-all-study", help="where the study writes (emptied first)")
    ap.add_argument("--only", default=",".join(CASES), help="comma-separated case names")
    ap.add_argument("--nodes", type=int, help="run one custom case with this many nodes")
    ap.add_argument("--routing", choices=["minimal", "valiant", "adaptive"])
    ap.add_argument("--valiant", choices=["spread", "hashed"], default="spread")
    ap.add_argument("--algorithm", default="flat")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(run_one(**json.loads(args.child))))
        return
    if args.study:
        run_study(args.study_out)
        return
    cases = (
        {"custom": {"nodes": args.nodes, "routing": args.routing, "valiant": args.valiant, "algorithm": args.algorithm}}
        if args.nodes
        else {k: CASES[k] for k in args.only.split(",")}
    )
    with progress_bar(len(cases), "bench_all_to_all", "cases", delay_s=0) as line:
        for name, case in cases.items():
            out = subprocess.run(
                [sys.executable, __file__, "--child", json.dumps(case)], capture_output=True, text=True
            )
            line.update(1)
            if out.returncode != 0:
                line.write(f"{name}: failed\n{out.stderr[-2000:]}", file=sys.stdout)
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            line.write(
                f"{name}: {r['nodes']} nodes / {r['gcds']} GCDs, routing {r['routing']}, detours "
                f"{r['valiant']}: wall {r['wall_s']:.2f} s (topology {r['topology_s']:.2f}, phases "
                f"{r['phases_s']:.2f}, route+reduce+lump {r['prepare_s']:.2f}, simulate {r['simulate_s']:.2f}); "
                f"all-to-all takes {r['collective_time_s'] * 1e3:.4g} ms",
                file=sys.stdout,
            )
            line.write(
                f"    GPU pairs {r['pairs']:,}; network flows {r['network_flows']:,}; routed "
                f"{r['routed_flows']:,}; aggregated (simulated) flows {r['simulated_flows']:,} on "
                f"{r['simulated_links']:,} link classes ({r['refinement_rounds']} refinement rounds, exact "
                f"check {r['exact_check']}, {r['automorphisms']} switch automorphisms); "
                f"fair-share solves {r['fair_share_solves']}; peak RSS {r['peak_rss_MiB']:.0f} MiB",
                file=sys.stdout,
            )


if __name__ == "__main__":
    main()
