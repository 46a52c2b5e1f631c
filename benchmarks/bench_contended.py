"""Simulator speed on plans whose traffic contends on shared links (prints figures; no assertions).

DSV3-512F-halo, DSV3-512F-rccl: DeepSeek-V3 on 512 Frontier GCDs, PP 4 x EP 64 x DP 2 with TP 2 and sequence
parallelism (ETP 1), interleaved 1F1B (VPP 2), 16 micro-batches, full recomputation, ZeRO-1; the HALO and the RCCL
all-to-all.
QWEN3-256H: validation/published/mcore-qwen3-235b-h100-256gpu-tp2-ep32.yaml, the published TP 2 EP 32 run (PP 8,
VPP 4, 128 micro-batches, DeepEP) on 256 H100.
L405-8K: a Llama-3-405B-class dense model (126 layers, d 16384, 128 heads, 8 key/value heads, SwiGLU 53248,
vocabulary 128256, sequence 8192) on 8,192 H100 (dgx-h100-superpod), TP 8 with SP x PP 16 x DP 64, 1F1B,
32 micro-batches, ZeRO-1.

Each workload runs in its own process after a small warm-up run (the compiled kernels' first load), and prints
its wall time, simulated events, fair-share solves, the sizes of the components they solve (flows in the
joined incidence, mean and largest) and the process's peak resident size. --base DIR runs the same workloads on
another checkout too (PYTHONPATH=DIR, e.g. a `git worktree` of an earlier commit), each right after this one's, and
prints the ratios;
--microbatches N shortens every workload (a quick profile); --profile prints cProfile's top functions.

    python benchmarks/bench_contended.py [--only DSV3-512F-halo ...] [--base /tmp/base] [--microbatches 8]
        [--profile [--sort tottime]] [--timeout 900]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
DSV3_512F = {
    "model": {"preset": "deepseek-v3"},
    "topology": "frontier",
    "cost": {"profile": "mi250x"},
    "schedule": "interleaved-1f1b",
    "recompute": "full",
    "optimizer": {"zero": 1},
    "parallel": {
        "pp": 4,
        "ep": 64,
        "dp": 2,
        "tp": 2,
        "etp": 1,
        "sp": True,
        "vpp": 2,
        "num_microbatches": 16,
        "micro_batch_size": 1,
    },
}
L405 = {
    "model": {
        "name": "llama3-405b-class",
        "num_layers": 126,
        "d_model": 16384,
        "num_heads": 128,
        "num_kv_heads": 8,
        "vocab_size": 128256,
        "seq_len": 8192,
        "expert_ffn_dim": 53248,
        "num_experts": 1,
        "top_k": 1,
        "expert_matrices": 3,
        "num_dense_layers": 126,
        "dense_ffn_dim": 53248,
        "dense_matrices": 3,
    },
    "parallel": {
        "convention": "megatron",
        "tp": 8,
        "pp": 16,
        "dp": 64,
        "sp": True,
        "num_microbatches": 32,
        "micro_batch_size": 1,
    },
    "schedule": "1f1b",
    "recompute": "selective",
    "optimizer": {"zero": 1},
    "topology": "dgx-h100-superpod",
    "collectives": {"all_reduce": "ring"},
    "cost": {"profile": "h100", "flash_attention": True},
}


def _published(name: str) -> dict:
    return yaml.safe_load((ROOT / "validation" / "published" / f"{name}.yaml").read_text())["config"]


WORKLOADS = {
    "DSV3-512F-halo": lambda: {**DSV3_512F, "collectives": {"all_to_all": "halo"}},
    "DSV3-512F-rccl": lambda: {**DSV3_512F, "collectives": {"all_to_all": "rccl"}},
    "QWEN3-256H": lambda: _published("mcore-qwen3-235b-h100-256gpu-tp2-ep32"),
    "L405-8K": lambda: L405,
}
WARM_UP = {
    "model": "small-moe",
    "routing": {"kind": "zipf", "exponent": 1.0},
    "parallel": {"pp": 2, "ep": 4, "num_microbatches": 2},
}


class Counters:
    """Events of every SimPy environment and the joined incidences' solves, counted by wrapping the classes (so
    a checkout without these figures of its own is measured alike)."""

    def __init__(self) -> None:
        import simpy

        from piper_sim.network import fairshare

        self.envs: list = []
        self.solves = self.solved_flows = self.largest = 0
        init, solve, counters = simpy.Environment.__init__, fairshare.Filling.solve, self

        def env_init(env, *args, **kwargs):
            init(env, *args, **kwargs)
            counters.envs.append(env)

        def counted_solve(filling, live):
            counters.solves += 1
            size = int(filling.weight.shape[0])
            counters.solved_flows += size
            counters.largest = max(counters.largest, size)
            return solve(filling, live)

        simpy.Environment.__init__ = env_init
        fairshare.Filling.solve = counted_solve

    def events(self) -> int:
        return sum(next(env._eid) for env in self.envs)


def run_one(name: str, microbatches: int | None, profile: bool, sort: str) -> dict:
    from piper_sim.config import load_config
    from piper_sim.simulator import simulate

    raw = WORKLOADS[name]()
    if microbatches:
        raw = {**raw, "parallel": {**raw["parallel"], "num_microbatches": microbatches}}
    cfg = load_config(raw)
    simulate(load_config(WARM_UP))
    counters = Counters()
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if profile:
            import cProfile
            import pstats

            prof = stack.enter_context(cProfile.Profile())
            stack.callback(lambda: pstats.Stats(prof, stream=sys.stderr).sort_stats(sort).print_stats(30))
        result = simulate(cfg)
    wall = time.perf_counter() - t0  # with the profile's printing when profiled
    s = result.stats
    return {
        "wall_s": wall,
        "step_time_s": result.report.step_time_s,
        "tasks": s["num_tasks"],
        "events": counters.events(),
        "solves": s["num_solves"],
        "component_solves": counters.solves,
        "component_mean": counters.solved_flows / max(counters.solves, 1),
        "component_max": counters.largest,
        "reserved": s["num_reserved"],
        "broken": s["num_broken"],
        "lanes": s["num_lanes"],
        "peak_GiB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }  # Linux: KiB


def child(name: str, args: argparse.Namespace, base: str | None) -> dict | None:
    cmd = [sys.executable, __file__, "--child", "--only", name]
    cmd += ["--microbatches", str(args.microbatches)] if args.microbatches else []
    cmd += ["--profile", "--sort", args.sort] if args.profile else []
    env = dict(os.environ)
    if base:
        env["PYTHONPATH"] = base + os.pathsep + env.get("PYTHONPATH", "")
    try:
        out = subprocess.run(cmd, text=True, check=True, stdout=subprocess.PIPE, timeout=args.timeout, env=env)
    except subprocess.TimeoutExpired:
        return None
    except subprocess.CalledProcessError as exc:  # e.g. stopped by the memory guard: its error is on stderr
        return {"failed": exc.returncode}
    return json.loads(out.stdout.strip().splitlines()[-1])


def line(label: str, r: dict | None, timeout: float) -> str:
    if r is None:
        return f"{label:22s} stopped after {timeout:.0f} s (--timeout)"
    if "failed" in r:
        return f"{label:22s} failed (exit status {r['failed']}; its error above)"
    return (
        f"{label:22s} {r['wall_s']:8.1f} {r['step_time_s']:10.4f} {r['tasks']:9d} {r['events']:10d} "
        f"{r['solves']:9d} {r['component_solves']:8d} {r['component_mean']:8.0f} {r['component_max']:7d} "
        f"{r['reserved']:8d} {r['broken']:7d} {r.get('peak_GiB', float('nan')):8.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--only",
        nargs="+",
        choices=list(WORKLOADS),
        metavar="NAME",
        help=f"workloads to run (default: all): {', '.join(WORKLOADS)}",
    )
    parser.add_argument("--base", help="another checkout to run each workload on too (PYTHONPATH), with ratios")
    parser.add_argument("--microbatches", type=int, help="micro-batches per replica instead of the workload's")
    parser.add_argument("--profile", action="store_true", help="cProfile the run (stderr)")
    parser.add_argument("--sort", choices=["cumulative", "tottime"], default="cumulative")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per run before it is stopped")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_one(args.only[0], args.microbatches, args.profile, args.sort)))
        return
    print(
        f"{'':22s} {'wall s':>8s} {'step s':>10s} {'tasks':>9s} {'events':>10s} {'solves':>9s} {'joined':>8s} "
        f"{'mean':>8s} {'largest':>7s} {'reserved':>8s} {'broken':>7s} {'peak GiB':>8s}",
        flush=True,
    )
    for name in args.only or list(WORKLOADS):
        now = child(name, args, None)
        print(line(name, now, args.timeout), flush=True)
        if args.base:
            before = child(name, args, args.base)
            print(line("  base", before, args.timeout), flush=True)
            if now and before and "failed" not in now and "failed" not in before:
                print(
                    f"  {'base / this':20s} {before['wall_s'] / now['wall_s']:8.2f}x wall; step time "
                    f"{now['step_time_s'] / before['step_time_s'] - 1:+.2e} relative",
                    flush=True,
                )
    print(
        "solves: fair-share solves (stats['num_solves']); joined: solves of contended components (Filling), "
        "mean and largest: flows in their joined incidence; events: SimPy events of every environment; peak GiB: "
        "the run's process's peak resident size (warm-up included)"
    )


if __name__ == "__main__":
    main()
