"""piper-sim beside SimuMax's event timeline on bench_sim's W1, W2 and W3, in the same run (prints figures; no
assertions).

    python benchmarks/bench_peers.py --simumax DIR [--simumax-python PY] [--only W1 W2 W3] [--repeats N]

DIR is a copy of SimuMax's public repository (github.com/MooreThreads/SimuMax), installed into a virtualenv of
its own outside this project, e.g.:

    git clone https://github.com/MooreThreads/SimuMax /work/scratch/SimuMax
    python -m venv /work/scratch/simumax-venv
    /work/scratch/simumax-venv/bin/pip install numpy pandas sympy tabulate tqdm matplotlib
    /work/scratch/simumax-venv/bin/pip install -e /work/scratch/SimuMax

--simumax-python is that venv's interpreter (default: DIR/../simumax-venv/bin/python). SimuMax runs through it in
a subprocess (benchmarks/simumax_driver.py, with DIR on PYTHONPATH); piper-sim runs as bench_sim runs it (its
--child, one process per workload; wall seconds of simulate()). SimuMax's timeline is PerfLLM.run_estimate() then
PerfLLM.simulate(), the replay that writes tracing_logs.json (not only its closed-form analysis_cost(), whose
step time is printed beside it). Its model, strategy and system JSON files are written here from piper-sim's
workload definitions (bench_sim.WORKLOADS, the model preset, the mi250x profile, the uniform cluster); nothing
of SimuMax's is copied. Each tool runs --repeats times per workload, the least wall time is kept. Without
--simumax, or when DIR holds no SimuMax, it says so in one line and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import bench_sim

from piper_sim.progress import bar as progress_bar

HERE = Path(__file__).resolve().parent
DRIVER = HERE / "simumax_driver.py"
PEER_WORKLOADS = ("W1", "W2", "W3")
GiB = 2**30
# the standard ring accounting SimuMax's system file expects per collective (docs/system.md)
RING_STEPS = {
    "all_reduce": (2, -1),
    "all_gather": (1, -1),
    "reduce_scatter": (1, -1),
    "p2p": (1, 0),
    "all2all": (1, -1),
}


def piper_config(name: str):
    from piper_sim.config import load_config

    return load_config(
        {"schedule": "1f1b", "topology": bench_sim.CLUSTER, "cost": {"profile": "mi250x"}, **bench_sim.WORKLOADS[name]}
    )


def simumax_inputs(name: str, pp_comm_async: bool) -> tuple[dict, dict, dict, str]:
    """SimuMax's model, strategy and system configs for a bench_sim workload, and how its device was mapped."""
    from piper_sim.topology.builders import HOST_SCHEMA
    from piper_sim.workload.profile_load import load_profile

    cfg = piper_config(name)
    m, par = cfg.model, cfg.parallel
    if m.num_shared_experts or m.num_dense_layers or m.mla is not None or m.moe_layer_freq != 1 or par.tp != 1:
        raise SystemExit(f"bench_peers: {name} has a feature this mapping does not carry to SimuMax")
    heads = m.num_heads
    model = {
        "model_type": "moe",
        "model_name": m.name,
        "layer_num": m.num_layers,
        "hidden_size": m.d_model,
        "head_num": heads,
        "kv_head_num": m.num_kv_heads or heads,
        "head_size": m.head_dim or m.d_model // heads,
        "intermediate_size": m.expert_ffn_dim,
        "moe_ffn_hidden_size": m.expert_ffn_dim,
        "expert_num": m.num_experts,
        "topk": m.top_k,
        "vocab_size": m.vocab_size,
        "use_swiglu": m.expert_matrices == 3,
    }
    strategy = {
        "seq_len": m.seq_len,
        "micro_batch_size": par.micro_batch_size,
        "micro_batch_num": par.num_microbatches,
        "dtype": m.dtype,
        "world_size": par.num_gpus,
        "tp_size": 1,
        "pp_size": par.pp,
        "ep_size": par.ep,
        "etp_size": 1,
        "enable_sequence_parallel": False,
        "interleaving_size": 1,
        "zero_state": 1,
        "enable_recompute": cfg.recompute != "none",
        "enable_dropout": False,
        "use_flash_sdp": cfg.flash_attention,
        "pp_comm_async": pp_comm_async,
    }
    prof = load_profile(cfg.cost_profile)
    tokens = par.micro_batch_size * m.seq_len
    expert_rows = tokens * m.top_k * par.ep / m.num_experts
    gemm, grouped, attention = (
        prof.gemm_efficiency(tokens),
        prof.gemm_efficiency(expert_rows),
        prof.attention_efficiency(m.seq_len),
    )
    tflops = prof.peak_flops_per_s / 1e12
    ops = {
        "default": gemm,
        "matmul": gemm,
        "fp8_matmul": gemm,
        "group_matmul": grouped,
        "fp8_group_matmul": grouped,
        "sdp_fwd": attention,
        "sdp_bwd": attention,
    }
    host = {**HOST_SCHEMA, **bench_sim.CLUSTER["params"]}
    per_node = host["gpus_per_node"]

    def network(bytes_per_s: float, latency_us: float) -> dict:
        return {
            "processor_usage": 0.0,
            "bandwidth": {"efficient_factor": 1.0, "gbps": bytes_per_s / GiB, "latency_us": latency_us},
            "op": {op: {"scale": s, "offset": o} for op, (s, o) in RING_STEPS.items()},
        }

    # a path inside a node: GPU -> node switch -> GPU; across nodes: GPU -> NIC -> network switch -> NIC -> GPU
    intra = network(host["intra_bandwidth_GBps"] * 1e9, 2 * host["intra_latency_us"])
    # SimuMax's inter-node bandwidth is a node's (it divides it among the node's GPUs for p2p and the all-to-all)
    inter = network(
        per_node * host["nic_bandwidth_GBps"] * 1e9, 2 * (host["nic_latency_us"] + host["switch_latency_us"])
    )
    system = {
        "sys_name": f"{prof.name}-uniform",
        "num_per_node": per_node,
        "accelerator": {
            "backend": "cuda",
            "mem_gbs": prof.hbm_bytes / GiB,
            "mode": "roofline",
            "op": {k: {"tflops": tflops, "efficient_factor": e} for k, e in ops.items()},
            "bandwidth": {
                "default": {
                    "efficient_factor": prof.memory_efficiency,
                    "gbps": prof.hbm_bytes_per_s / GiB,
                    "latency_us": prof.kernel_launch_s * 1e6,
                }
            },
        },
        "networks": {"intra_with_pcie": False, "low_intra_node": intra, "high_intra_node": intra, "inter_node": inter},
    }
    device = (
        f"{name}: {tflops:g} TFLOPS; efficiency {gemm:.3f} GEMM ({tokens} rows), {grouped:.3f} grouped GEMM "
        f"({expert_rows:.0f} rows), {attention:.2f} attention (seq {m.seq_len})"
    )
    return model, strategy, system, device


def run_piper(name: str, timeout: float) -> dict:
    cmd = [sys.executable, bench_sim.__file__, "--child", "--only", name]
    out = subprocess.run(cmd, text=True, check=True, stdout=subprocess.PIPE, timeout=timeout)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_simumax(python: Path, simumax: Path, inputs: tuple[dict, dict, dict], timeout: float) -> dict:
    env = {**os.environ, "PYTHONPATH": str(simumax), "MPLBACKEND": "Agg"}
    with tempfile.TemporaryDirectory(prefix="bench_peers_") as tmp:
        run = Path(tmp)
        for file, content in zip(("model.json", "strategy.json", "system.json"), inputs, strict=True):
            (run / file).write_text(json.dumps(content, indent=1))
        out = subprocess.run(
            [str(python), str(DRIVER), str(run)],
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            timeout=timeout,
            cwd=tmp,
        )
        if out.returncode != 0:
            raise RuntimeError("SimuMax failed:\n" + "\n".join(out.stdout.splitlines()[-15:]))
        return json.loads((run / "result.json").read_text())


def simumax_problem(simumax: Path | None, python: Path) -> str | None:
    if simumax is None:
        return "no SimuMax given (--simumax DIR: a copy of github.com/MooreThreads/SimuMax in a venv); nothing run"
    if not (simumax / "simumax" / "core" / "perf_llm.py").is_file():
        return f"no SimuMax in {simumax} (no simumax/core/perf_llm.py); nothing run"
    if not python.is_file():
        return f"no Python for SimuMax at {python} (--simumax-python); nothing run"
    return None


def simumax_version(simumax: Path) -> str:
    out = subprocess.run(["git", "-C", str(simumax), "log", "-1", "--format=%h %cs"], capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else "not a git checkout"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--simumax", type=Path, metavar="DIR", help="a copy of SimuMax's repository")
    parser.add_argument(
        "--simumax-python",
        type=Path,
        metavar="PY",
        help="the Python SimuMax is installed in (default: DIR/../simumax-venv/bin/python)",
    )
    parser.add_argument(
        "--only",
        nargs="+",
        choices=PEER_WORKLOADS,
        metavar="NAME",
        default=list(PEER_WORKLOADS),
        help="workloads (default: W1 W2 W3)",
    )
    parser.add_argument("--repeats", type=int, default=1, help="runs of each tool per workload, least wall kept")
    parser.add_argument(
        "--pp-comm-async",
        action="store_true",
        help="SimuMax's asynchronous pipeline send/recv (default: blocking, as in Megatron's non-interleaved 1F1B)",
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per run before it is stopped")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    simumax = args.simumax.resolve() if args.simumax else None
    python = args.simumax_python or (simumax.parent / "simumax-venv" / "bin" / "python" if simumax else Path())
    problem = simumax_problem(simumax, python)
    if problem:
        print(f"bench_peers: {problem}")
        return
    print(f"SimuMax: {simumax} (commit {simumax_version(simumax)}), run by {python}")
    devices = []
    intra, nic = bench_sim.CLUSTER["params"]["intra_bandwidth_GBps"], bench_sim.CLUSTER["params"]["nic_bandwidth_GBps"]
    print(
        f"{'':4s} {'GPUs':>4s} | {'piper-sim':>9s} {'warm-up':>7s} {'step ms':>9s} | {'SimuMax':>8s} {'replay':>7s} "
        f"{'export':>7s} {'step ms':>9s} {'estimate':>9s} | {'ratio':>6s} {'replay':>6s} {'cold':>6s}"
    )
    with progress_bar(len(args.only) * args.repeats * 2, "bench_peers", "runs", delay_s=0) as line:
        for name in args.only:
            model, strategy, system, device = simumax_inputs(name, args.pp_comm_async)
            devices.append(device)
            piper, peer = [], []
            try:
                for _ in range(args.repeats):  # interleaved, so both tools see the same machine load
                    piper.append(run_piper(name, args.timeout))
                    line.update(1)
                    peer.append(run_simumax(python, simumax, (model, strategy, system), args.timeout))
                    line.update(1)
            except subprocess.TimeoutExpired as stopped:
                line.write(
                    f"{name:4s} {Path(stopped.cmd[1]).name} stopped after {args.timeout:.0f} s (--timeout)",
                    file=sys.stdout,
                )
                continue
            p, s = min(piper, key=lambda r: r["wall_s"]), min(peer, key=lambda r: r["wall_s"])
            replayed = s["wall_s"] - s["export_s"]
            line.write(
                f"{name:4s} {p['gpus']:4d} | {p['wall_s']:8.2f}s {p['warm_up_s']:6.2f}s "
                f"{p['step_time_ms']:9.1f} | "
                f"{s['wall_s']:7.2f}s {s['replay_s']:6.2f}s {s['export_s']:6.2f}s {s['step_time_ms']:9.1f} "
                f"{s['estimate_ms']:9.1f} | {s['wall_s'] / p['wall_s']:5.0f}x {replayed / p['wall_s']:5.1f}x "
                f"{replayed / (p['wall_s'] + p['warm_up_s']):5.1f}x",
                file=sys.stdout,
            )
    p2p = (
        "asynchronous (--pp-comm-async), as piper-sim's"
        if args.pp_comm_async
        else "blocking (pp_comm_async false; --pp-comm-async runs its asynchronous path, whose W2 timeline\n"
        "  ends far past its own closed-form estimate)"
    )
    print(f"""
piper-sim: wall seconds of simulate() and the predicted step time, as benchmarks/bench_sim.py prints them (after
  a warm-up run in the same process that loads its compiled kernels: warm-up, paid once a process).
SimuMax: wall seconds of run_estimate() + simulate() (its event timeline); replay: simulate() without writing
  its trace; export: writing tracing_logs.json (piper-sim's simulate keeps its task records as arrays and writes
  no file);
  step ms: the timeline's last event; estimate: its closed-form analysis_cost() step time (not timed).
ratio: SimuMax's wall / piper-sim's; replay: (SimuMax's wall less its export) / piper-sim's; cold: the same over
  piper-sim's wall plus its warm-up (a fresh process's single run).
Where the configurations differ (SimuMax's JSON files are written from piper-sim's workload, not taken from it):
- device: piper-sim's mi250x profile has efficiency curves over GEMM rows and sequence length and a launch cost
  per kernel; SimuMax's system file gets one efficiency per op class, read off those curves at the workload's
  shapes, and the HBM bandwidth x the profile's memory efficiency with its kernel launch as the per-access latency:
{chr(10).join("    " + d for d in devices)}
- network: piper-sim shares flows max-min fairly over the uniform cluster's graph ({intra:g} GB/s per GPU in a node,
  a {nic:g} GB/s NIC per GPU, latency per hop); SimuMax prices each collective analytically on two tiers (the
  same bandwidths, efficiency 1, the path latency per ring step), choosing the tier from the group's size.
- optimizer: ZeRO-1 in SimuMax (its timeline has no ZeRO-0 path), ZeRO-0 in piper-sim (bench_sim's W1, W2, W3).
- pipeline send/recv: piper-sim issues them asynchronously (docs/execution-contract.md); SimuMax's are
  {p2p}.
- embeddings: piper-sim ties input and output embeddings; SimuMax has no tying (a separate output layer).
- lanes: SimuMax replays one lane per pipeline stage (simulate's merge_lanes default); piper-sim groups identical
  ranks into lanes (bench_sim's lanes column).""")


if __name__ == "__main__":
    main()
