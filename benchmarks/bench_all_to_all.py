"""Speed of one flat all-to-all on Frontier (prints figures; no assertions).

Cases (each in its own process, so peak memory is its own), placement contiguous, 1 MiB per GPU pair:
  spr512   512 nodes (4096 GCDs), frontier preset (adaptive routing), detours spread mean-field -- the 30 s target
  min512   512 nodes, frontier preset with routing: minimal
  hash8    8 nodes, frontier preset exactly as `simulate` routes it (adaptive, one hashed detour per pair)
  hash16   16 nodes, same (hashed detours break every symmetry: about one solve per flow)
Reported: wall time by stage, simulated time, GPU pairs, network flows (one per path, what the flow
network would carry without aggregation), flows actually routed (after the host-symmetry reduction),
simulated flows (equitable classes) and fair-share solves.

    python benchmarks/bench_all_to_all.py [--only min512,hash8] [--nodes 512 --routing minimal]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

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
    from piper_sim.studies.runner import prepare, simulate

    t0 = time.perf_counter()
    spec = StudySpec(topology="frontier", nodes=(nodes,), sizes=("1MiB",), algorithms=(algorithm,),
                     routing=routing, valiant=valiant)
    topo, gpus = build_topology(spec, nodes)
    t1 = time.perf_counter()
    phases = ALL_TO_ALL.get(algorithm)(np.full((len(gpus), len(gpus)), 2.0**20), gpus, topo)
    t2 = time.perf_counter()
    prep = prepare(phases, gpus, topo, symmetric=algorithm in HOST_EQUIVARIANT, spread=valiant == "spread")
    run = simulate(prep, topo)
    t3 = time.perf_counter()
    return {"nodes": nodes, "gcds": len(gpus), "routing": topo.router.fabric.spec.routing, "valiant": valiant,
            "wall_s": t3 - t0, "topology_s": t1 - t0, "phases_s": t2 - t1, "prepare_s": prep.prepare_s,
            "simulate_s": run.simulate_s, "collective_time_s": run.time_s, "pairs": prep.num_pairs,
            "network_flows": prep.num_sub_flows, "routed_flows": prep.num_routed,
            "simulated_flows": prep.lumped.num_flow_classes, "simulated_links": prep.lumped.num_link_classes,
            "refinement_rounds": prep.lumped.rounds, "exact_check": prep.lumped.exact_check,
            "automorphisms": prep.num_automorphisms,
            "fair_share_solves": run.num_solves,
            "peak_rss_MiB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    cases = ({"custom": {"nodes": args.nodes, "routing": args.routing, "valiant": args.valiant,
                         "algorithm": args.algorithm}} if args.nodes
             else {k: CASES[k] for k in args.only.split(",")})
    for name, case in cases.items():
        out = subprocess.run([sys.executable, __file__, "--child", json.dumps(case)], capture_output=True, text=True)
        if out.returncode != 0:
            print(f"{name}: failed\n{out.stderr[-2000:]}")
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{name}: {r['nodes']} nodes / {r['gcds']} GCDs, routing {r['routing']}, detours {r['valiant']}: "
              f"wall {r['wall_s']:.2f} s (topology {r['topology_s']:.2f}, phases {r['phases_s']:.2f}, "
              f"route+reduce+lump {r['prepare_s']:.2f}, simulate {r['simulate_s']:.2f}); "
              f"all-to-all takes {r['collective_time_s'] * 1e3:.4g} ms")
        print(f"    GPU pairs {r['pairs']:,}; network flows {r['network_flows']:,}; routed {r['routed_flows']:,}; "
              f"aggregated (simulated) flows {r['simulated_flows']:,} on {r['simulated_links']:,} link classes "
              f"({r['refinement_rounds']} refinement rounds, exact check {r['exact_check']}, "
              f"{r['automorphisms']} switch automorphisms); "
              f"fair-share solves {r['fair_share_solves']}; peak RSS {r['peak_rss_MiB']:.0f} MiB", flush=True)


if __name__ == "__main__":
    main()
