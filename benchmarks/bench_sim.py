"""Simulator speed on the standard workloads (prints figures; no assertions).

W1: X-MoE Small on 8 GPUs, EP 8, micro-batch 4 x 8 microbatches.
W2: 110B (d 5120, d_ffn 20480, 16 experts, top-2) on 64 GPUs, PP 8 x EP 8, 1 x 32 microbatches, 1F1B.
W3: 1.7T (as W2 with 256 experts) on 1024 GPUs, PP 32 x EP 32, 1 x 128 microbatches, 1F1B.
Cluster: 8 GPUs per node, 100 GB/s per GPU inside a node, 12.5 GB/s per GPU off-node; bf16,
2-matrix experts, no shared experts.
W1Z, W2Z, W3Z: the same with zipf 1.0 routing (every rank's expert rows differ).
W2M: W2 for 12 steps with drifting hot routing and greedy expert migration after every step.
W3F-halo, W3F-flat, W3F-rccl: W3 on 1024 Frontier GCDs (topologies/frontier.yaml) with HALO, the flat
all-to-all and the RCCL model.
W4F: X-MoE Super on 512 Frontier GCDs, PP 16 x EP 32, 1 x 64 microbatches, HALO, full recomputation, ZeRO-1.
DSV3: DeepSeek-V3 on 256 GPUs, PP 8 x EP 32, 1 x 32 microbatches (the uniform cluster).
MIX: Mixtral 8x7B on 128 GPUs, PP 4 x EP 8 x DP 4, 1 x 16 microbatches (the uniform cluster).
DSV3-1K, MIX-1K: the same models on 1,024 GPUs (DeepSeek-V3 PP 16 x EP 64; Mixtral DP 32): a step's cost should
grow with its tasks, not faster (wall time per task against DSV3 and MIX).
XB1: one layer of the X-MoE-style baseline (reproduce vs-xmoe) of X-MoE Small on 256 Frontier GCDs: no pipeline,
EP 64 x DP 4, flat all-to-all, one micro-batch, full recomputation, ZeRO-1; the four EP groups share their
chassis' switches and start their all-to-alls together (one recorded run of them, repeated).
XB: the whole step of that baseline (28 layers x 4 micro-batches), as reproduce vs-xmoe simulates it.
Each workload runs in its own process, so peak memory is its own, and is stopped after --timeout seconds; a small
run first loads the compiled kernels (WARM_UP), outside the workload's time, which it prints apart.
A progress line on stderr counts the workloads done, with an ETA (PIPER_SIM_PROGRESS, README.md).

    python benchmarks/bench_sim.py [--only W3 W3Z ...] [--profile [--sort tottime]] [--timeout 900]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

from piper_sim.progress import bar as progress_bar

CLUSTER = {
    "builder": "uniform",
    "params": {"gpus_per_node": 8, "intra_bandwidth_GBps": 100, "nic_bandwidth_GBps": 12.5},
}
ZIPF = {"routing": {"kind": "zipf", "exponent": 1.0}}
FRONTIER = {"topology": "frontier"}
# X-MoE Small on 256 Frontier GCDs with EP groups of 64 GCDs (8 nodes each) starting their all-to-alls together:
# the contended workload of this benchmark (EP 64 x DP 4, flat, ZeRO-1, full recomputation)
XMOE_BASELINE = {
    "model": "x-moe-small",
    "topology": "frontier",
    "cost": {"profile": "mi250x"},
    "parallel": {"pp": 1, "ep": 64, "dp": 4, "num_microbatches": 4, "micro_batch_size": 1},
    "collectives": {"all_to_all": "flat"},
    "routing": {"kind": "uniform", "capacity_factor": 1.25},
    "recompute": "full",
    "optimizer": {"zero": 1},
}
W1 = {
    "model": {"preset": "x-moe-small", "num_heads": 16},
    "parallel": {"pp": 1, "ep": 8, "num_microbatches": 8, "micro_batch_size": 4},
}
W2 = {
    "model": {"preset": "weak-110b", "num_heads": 40},
    "parallel": {"pp": 8, "ep": 8, "num_microbatches": 32, "micro_batch_size": 1},
}
W3 = {
    "model": {"preset": "weak-1.7t", "num_heads": 40},
    "parallel": {"pp": 32, "ep": 32, "num_microbatches": 128, "micro_batch_size": 1},
}
WORKLOADS = {
    "W1": W1,
    "W2": W2,
    "W3": W3,
    "W1Z": {**W1, **ZIPF},
    "W2Z": {**W2, **ZIPF},
    "W3Z": {**W3, **ZIPF},
    "W2M": {
        **W2,
        "routing": {"kind": "drift", "shape": "hot", "rate": 0.5},
        "migration": {"enabled": True, "policy": "greedy", "interval": 1},
        "sim": {"steps": 12},
    },
    "W3F-halo": {**W3, **FRONTIER, "collectives": {"all_to_all": "halo"}},
    "W3F-flat": {**W3, **FRONTIER, "collectives": {"all_to_all": "flat"}},
    "W3F-rccl": {**W3, **FRONTIER, "collectives": {"all_to_all": "rccl"}},
    "W4F": {
        "model": {"preset": "x-moe-super"},
        **FRONTIER,
        "collectives": {"all_to_all": "halo"},
        "parallel": {"pp": 16, "ep": 32, "num_microbatches": 64, "micro_batch_size": 1},
        "recompute": "full",
        "optimizer": {"zero": 1},
    },
    "DSV3": {
        "model": {"preset": "deepseek-v3"},
        "parallel": {"pp": 8, "ep": 32, "num_microbatches": 32, "micro_batch_size": 1},
    },
    "MIX": {
        "model": {"preset": "mixtral-8x7b"},
        "parallel": {"pp": 4, "ep": 8, "dp": 4, "num_microbatches": 16, "micro_batch_size": 1},
    },
    "DSV3-1K": {
        "model": {"preset": "deepseek-v3"},
        "parallel": {"pp": 16, "ep": 64, "num_microbatches": 32, "micro_batch_size": 1},
    },
    "MIX-1K": {
        "model": {"preset": "mixtral-8x7b"},
        "parallel": {"pp": 4, "ep": 8, "dp": 32, "num_microbatches": 16, "micro_batch_size": 1},
    },
    "XB1": {
        **XMOE_BASELINE,
        "model": {"preset": "x-moe-small", "num_layers": 1},
        "parallel": {**XMOE_BASELINE["parallel"], "num_microbatches": 1},
    },
    "XB": XMOE_BASELINE,
}


# run first in each workload's process, untimed: numba loads the compiled fair-share kernels on their first call
# (0.3-0.4 s here, from its on-disk cache), once a process; the workload's wall time is the simulation's own
WARM_UP = {
    "topology": CLUSTER,
    "model": "small-moe",
    "routing": {"kind": "zipf", "exponent": 1.0},
    "parallel": {"pp": 2, "ep": 4, "num_microbatches": 2},
}


def run_one(name: str, profile: bool, sort: str = "cumulative") -> dict:
    from piper_sim.config import load_config
    from piper_sim.simulator import simulate

    raw = {"schedule": "1f1b", "topology": CLUSTER, "cost": {"profile": "mi250x"}, **WORKLOADS[name]}
    cfg = load_config(raw)
    t0 = time.perf_counter()
    simulate(load_config(WARM_UP))  # loads the compiled kernels (once a process), outside the workload's time
    warm_up = time.perf_counter() - t0
    t0 = time.perf_counter()
    if profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        result = prof.runcall(simulate, cfg)
        pstats.Stats(prof, stream=sys.stderr).sort_stats(sort).print_stats(25)
    else:
        result = simulate(cfg)
    wall = time.perf_counter() - t0
    s = result.stats
    return {
        "workload": name,
        "gpus": cfg.parallel.num_gpus,
        "step_time_ms": result.report.step_time_s * 1e3,
        "tflops_per_gpu": result.report.tflops_per_gpu,
        "mfu": result.report.mfu,
        "wall_s": wall,
        "warm_up_s": warm_up,
        "event_loop_s": s["event_loop_s"],
        "setup_s": s["setup_s"],
        "report_s": s["report_s"],
        "tasks": s["num_tasks"],
        "tasks_per_s": s["num_tasks"] / wall,
        "flows": s["num_flows"],
        "flows_per_s": s["num_flows"] / wall,
        "fair_share_solves": s["num_solves"],
        "peak_rss_MiB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "lanes": s["num_lanes"],
        "fell_back": s["lanes_fell_back"],
        "by_latency": s["lanes_by_latency"],
        "split_by": ",".join(s["lanes_split_by"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--only",
        nargs="+",
        choices=list(WORKLOADS),
        metavar="NAME",
        help=f"workloads to run (default: all): {', '.join(WORKLOADS)}",
    )
    parser.add_argument("--profile", action="store_true", help="cProfile the run (stderr)")
    parser.add_argument(
        "--sort",
        choices=["cumulative", "tottime"],
        default="cumulative",
        help="order of the profile's functions (default: cumulative)",
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per workload before it is stopped")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_one(args.only[0], args.profile, args.sort)))
        return
    names = args.only or list(WORKLOADS)
    print(
        f"{'':8s} {'GPUs':>5s} {'step ms':>10s} {'MFU %':>6s} {'wall s':>7s} {'loop s':>7s} {'tasks':>9s} "
        f"{'tasks/s':>9s} {'flows':>10s} {'lanes':>6s} {'RSS MiB':>8s} {'warm-up s':>9s}"
    )
    with progress_bar(len(names), "bench_sim", "workloads", delay_s=0) as line:
        for name in names:
            cmd = [sys.executable, __file__, "--child", "--only", name]
            cmd += ["--profile", "--sort", args.sort] if args.profile else []
            t0 = time.perf_counter()
            try:
                out = subprocess.run(cmd, text=True, check=True, stdout=subprocess.PIPE, timeout=args.timeout)
            except subprocess.TimeoutExpired:
                line.write(f"{name:8s} stopped after {time.perf_counter() - t0:.0f} s (--timeout)", file=sys.stdout)
                line.update(1)
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            lanes = f"{r['lanes']}" + ("*" if r["fell_back"] else "+" if r["by_latency"] else "")
            line.write(
                f"{name:8s} {r['gpus']:5d} {r['step_time_ms']:10.2f} {r['mfu'] * 100:6.2f} {r['wall_s']:7.2f} "
                f"{r['event_loop_s']:7.2f} {r['tasks']:9d} {r['tasks_per_s']:9.0f} {r['flows']:10d} "
                f"{lanes:>6s} {r['peak_rss_MiB']:8.0f} {r['warm_up_s']:9.2f}",
                file=sys.stdout,
            )
            line.update(1)
    print(
        "lanes: SimPy processes of the run (* after falling back to one per rank, + split by route latency);\n"
        "step ms: the mean over steps; wall s: the workload's simulate(), after a warm-up run in the same process\n"
        "(warm-up s: a 16-GPU run that loads the compiled kernels, 0.3-0.4 s of it their first call; once a process)"
    )


if __name__ == "__main__":
    main()
