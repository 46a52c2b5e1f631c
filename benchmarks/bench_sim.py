"""Simulator speed on the three standard workloads (prints figures; no assertions).

W1: X-MoE Small on 8 GPUs, EP 8, micro-batch 4 x 8 microbatches.
W2: 110B (d 5120, d_ffn 20480, 16 experts, top-2) on 64 GPUs, PP 8 x EP 8, 1 x 32 microbatches, 1F1B.
W3: 1.7T (as W2 with 256 experts) on 1024 GPUs, PP 32 x EP 32, 1 x 128 microbatches, 1F1B.
Cluster: 8 GPUs per node, 100 GB/s per GPU inside a node, 12.5 GB/s per GPU off-node; bf16,
2-matrix experts, no shared experts. Each workload runs in its own process so peak memory is its own.

    python benchmarks/bench_sim.py [--only W3] [--profile]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

CLUSTER = {"builder": "uniform", "params": {"gpus_per_node": 8, "intra_bandwidth_GBps": 100,
                                            "nic_bandwidth_GBps": 12.5}}
WORKLOADS = {
    "W1": {"model": {"preset": "x-moe-small", "num_heads": 16},
           "parallel": {"pp": 1, "ep": 8, "num_microbatches": 8, "micro_batch_size": 4}},
    "W2": {"model": {"preset": "weak-110b", "num_heads": 40},
           "parallel": {"pp": 8, "ep": 8, "num_microbatches": 32, "micro_batch_size": 1}},
    "W3": {"model": {"preset": "weak-1.7t", "num_heads": 40},
           "parallel": {"pp": 32, "ep": 32, "num_microbatches": 128, "micro_batch_size": 1}},
}


def run_one(name: str, profile: bool) -> dict:
    from piper_sim.config import load_config
    from piper_sim.simulate import simulate

    raw = {**WORKLOADS[name], "schedule": "1f1b", "topology": CLUSTER, "cost": {"profile": "mi250x"}}
    cfg = load_config(raw)
    assert cfg.model.expert_matrices == 2 and cfg.model.num_shared_experts == 0 and cfg.model.dtype == "bf16"
    t0 = time.perf_counter()
    if profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        result = prof.runcall(simulate, cfg)
        pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(25)
    else:
        result = simulate(cfg)
    wall = time.perf_counter() - t0
    s = result.stats
    return {
        "workload": name, "gpus": cfg.parallel.num_gpus, "step_time_ms": result.report.step_time_s * 1e3,
        "tflops_per_gpu": result.report.tflops_per_gpu, "mfu": result.report.mfu, "wall_s": wall,
        "event_loop_s": s["event_loop_s"], "setup_s": s["setup_s"], "trace_report_s": s["trace_and_report_s"],
        "tasks": s["num_tasks"], "tasks_per_s": s["num_tasks"] / wall, "flows": s["num_flows"],
        "flows_per_s": s["num_flows"] / wall, "fair_share_solves": s["num_solves"],
        "peak_rss_MiB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", choices=sorted(WORKLOADS))
    parser.add_argument("--profile", action="store_true", help="cProfile the run (stderr)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_one(args.only, args.profile)))
        return
    names = [args.only] if args.only else list(WORKLOADS)
    header = (f"{'':4s} {'GPUs':>5s} {'step ms':>10s} {'TFLOPS/GPU':>10s} {'MFU %':>6s} {'wall s':>7s} "
              f"{'loop s':>7s} {'tasks':>9s} {'tasks/s':>9s} {'flows':>10s} {'flows/s':>10s} {'RSS MiB':>8s}")
    print(header)
    for name in names:
        cmd = [sys.executable, __file__, "--child", "--only", name] + (["--profile"] if args.profile else [])
        out = subprocess.run(cmd, text=True, check=True, stdout=subprocess.PIPE)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{name:4s} {r['gpus']:5d} {r['step_time_ms']:10.2f} {r['tflops_per_gpu']:10.2f} {r['mfu'] * 100:6.2f} "
              f"{r['wall_s']:7.2f} {r['event_loop_s']:7.2f} {r['tasks']:9d} {r['tasks_per_s']:9.0f} "
              f"{r['flows']:10d} {r['flows_per_s']:10.0f} {r['peak_rss_MiB']:8.0f}", flush=True)


if __name__ == "__main__":
    main()
