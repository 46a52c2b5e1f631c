"""CPU the ranks of a validation case use while it trains on the testbed (needs root).

    python benchmarks/bench_testbed_cpu.py flat-zb-pp4ep2-flat [--steps 30]

Runs the case's config for --steps steps on its testbed (prefix pstc) and samples the rank processes'
CPU time (user + system per thread, from /proc/PID/task/TID/stat), the delay line's and every other
process's every 0.25 s, and the machine's time by state (/proc/stat: user, system, softirq, ...). Prints
the CPU seconds the ranks used per wall second over the last two thirds of the ranks' life (at most the
machine's cores; the window takes in their start-up, so it overstates the steps' rate) and per rank per
step at that rate, and the machine's cores by state over the same window. Softirq is the kernel's work
for the emulated network's packets (veth, tbf/netem, TCP); on a kernel without separate interrupt time
accounting (CONFIG_IRQ_TIME_ACCOUNTING off) it is also counted in the CPU time of the thread it
interrupted, compute tasks' included.

Then, per task kind over the steps after the first: the CPU the ranks' main threads used inside the
tasks (the executor's `cpu_s`), their wall time, and what the profile (--profile) prices the compute
kinds at with no core sharing (the case simulated on its topology without `shared_cores`, replaying the
run's routing); and the main threads' CPU over whole steps (the executor's `step_cpu_s`): what is not
inside a task was spent between tasks. Used by validation/README.md ("Known gaps").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parent.parent


def _ticks(stat: Path) -> int:
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime in clock ticks


def cpu_by_part() -> tuple[dict[str, float], int]:
    """(CPU seconds used so far by part: rank main threads, other rank threads by name, the delay line,
    every other process; how many rank processes there are)."""
    parts: dict[str, float] = {}
    ranks = 0
    tick = os.sysconf("SC_CLK_TCK")
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            if b"torch_backend.rank_main" in cmdline:
                ranks += 1
                for task in (proc / "task").iterdir():
                    kind = "main" if task.name == proc.name else "other"
                    name = f"rank thread {kind} ({(task / 'comm').read_text().strip()})"
                    parts[name] = parts.get(name, 0.0) + _ticks(task / "stat") / tick
                continue
            name = "delay line" if b"testbed.delayline" in cmdline else "other processes"
            parts[name] = parts.get(name, 0.0) + _ticks(proc / "stat") / tick
        except (OSError, IndexError, ValueError):
            continue
    return parts, ranks


STATES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def machine_states() -> dict[str, float]:
    """Seconds the machine's cores spent in each state so far (/proc/stat's cpu line, in clock ticks)."""
    tick = os.sysconf("SC_CLK_TCK")
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1 : 1 + len(STATES)]
    return {name: int(v) / tick for name, v in zip(STATES, fields, strict=True)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("case")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--profile", default="cpu-2rank")
    args = parser.parse_args()
    case_dir = ROOT / "validation" / "cases" / args.case
    case = yaml.safe_load((case_dir / "case.yaml").read_text())
    config = case["config"]
    config["sim"]["steps"] = args.steps
    config["topology"] = str((case_dir / config["topology"]).resolve())
    world = config["parallel"]["pp"] * config["parallel"]["ep"] * config["parallel"].get("dp", 1)
    samples: list[tuple[float, dict[str, float], int]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            samples.append((time.monotonic(), *cpu_by_part(), machine_states()))
            time.sleep(0.25)

    with tempfile.TemporaryDirectory() as tmp:
        cfg_path = Path(tmp) / "config.yaml"
        cfg_path.write_text(yaml.safe_dump(config))
        cli = ["piper-sim", "testbed"]
        subprocess.run([*cli, "down", "--prefix", "pstc"], capture_output=True)
        subprocess.run(
            [*cli, "up", str((case_dir / case["testbed"]).resolve()), "--prefix", "pstc"],
            check=True,
            capture_output=True,
        )
        sampler = threading.Thread(target=sample)
        sampler.start()
        t0 = time.monotonic()
        try:
            run = subprocess.run(
                [*cli, "run", str(cfg_path), "--prefix", "pstc", "--out", str(Path(tmp) / "out")],
                capture_output=True,
                text=True,
            )
        finally:
            done.set()
            sampler.join()
            subprocess.run([*cli, "down", "--prefix", "pstc"], capture_output=True)
        if run.returncode != 0:
            raise SystemExit(run.stderr.strip().splitlines()[-1])
        step_s = json.loads((Path(tmp) / "out" / "report.json").read_text())["step_time_s"]
        by_kind = task_cpu(Path(tmp) / "out", config, args.profile, world)
    wall = time.monotonic() - t0
    alive = [s for s in samples if s[2] == world]
    a, b = alive[len(alive) // 3], alive[-2]
    span = b[0] - a[0]
    used = {k: (b[1].get(k, 0.0) - a[1].get(k, 0.0)) / span for k in b[1]}
    rate = sum(v for k, v in used.items() if k.startswith("rank thread"))
    print(
        f"{args.case}: {world} ranks, {args.steps} steps in {wall:.1f} s (incl. start-up), "
        f"steady step {step_s * 1e3:.0f} ms"
    )
    window = "/proc samples over the last two thirds of the ranks' life, start-up included"
    print(f"ranks' CPU seconds per wall second ({window}): {rate:.2f} of {os.cpu_count()} cores")
    print(f"CPU per rank per step at that rate: {rate * step_s / world * 1e3:.0f} ms")
    print(f"CPU seconds per wall second by part ({window}):")
    for name, value in sorted(used.items(), key=lambda kv: -kv[1]):
        if value >= 0.005:
            print(f"  {name:40s} {value:5.2f}   per rank per step {value * step_s / world * 1e3:6.1f} ms")
    states = {k: (b[3][k] - a[3][k]) / span for k in STATES}
    print(
        "the machine's cores by state (/proc/stat, same window): "
        + ", ".join(f"{k} {v:.2f}" for k, v in states.items() if v >= 0.005)
    )
    print(f"  softirq per rank per step {states['softirq'] * step_s / world * 1e3:.1f} ms")
    main_ms = sum(v for k, v in used.items() if k.startswith("rank thread main")) * step_s / world * 1e3
    print(
        "per rank per step, steps after the first (ms): main-thread CPU inside tasks, their wall, and the "
        "profile's price with no core sharing"
    )
    for kind, row in by_kind.iterrows():
        priced = (
            ""
            if pd.isna(row["priced_ms"])
            else (f"{row['priced_ms']:8.1f}   CPU / priced {row['cpu_ms'] / row['priced_ms']:.2f}")
        )
        print(f"  {kind:16s} CPU {row['cpu_ms']:7.1f}   wall {row['wall_ms']:7.1f}   priced {priced}")
    inside = float(by_kind["cpu_ms"].sum())
    step_ms = by_kind.attrs["step_cpu_ms"]
    print(
        f"  {'all tasks':16s} CPU {inside:7.1f}   of the main threads' {step_ms:.1f} over the steps: "
        f"{step_ms - inside:.1f} between tasks (the /proc samples: {main_ms:.1f}, start-up included)"
    )


def task_cpu(out: Path, config: dict, profile: str, world: int) -> pd.DataFrame:
    """Per kind, ms per rank-step over the steps after the first: measured CPU and wall inside tasks (the
    executor's rows), and the compute kinds' price with no core sharing (NaN for the rest)."""
    from piper_sim.config import load_config
    from piper_sim.simulator import simulate

    rows = pd.concat(pd.read_parquet(p) for p in sorted((out / "ranks").glob("rank*.parquet")))
    rows = rows[(rows["step"] > 0) & rows["cpu_s"].notna()]
    per = world * rows["step"].nunique() / 1e3  # rank-steps, in ms
    measured = pd.DataFrame(
        {
            "cpu_ms": rows.groupby("kind")["cpu_s"].sum() / per,
            "wall_ms": (rows["end_s"] - rows["start_s"]).groupby(rows["kind"]).sum() / per,
        }
    )
    topo = yaml.safe_load(Path(config["topology"]).read_text())
    topo.get("params", {}).pop("shared_cores", None)
    path = out / "topology-unshared.yaml"
    path.write_text(yaml.safe_dump(topo))
    raw = {
        **config,
        "topology": str(path),
        "cost": {**config.get("cost", {}), "profile": profile},
        "routing": {"kind": "trace", "path": str(out / "routing.npz")},
    }
    trace = simulate(load_config(raw)).trace
    trace = trace[(trace["step"] > 0) & (trace["stream"] == "compute")]
    sim_per = world * trace["step"].nunique() / 1e3
    measured["priced_ms"] = (trace["end_s"] - trace["start_s"]).groupby(trace["kind"].astype(str)).sum() / sim_per
    steps = [
        json.loads(p.read_text())["step_cpu_s"][1:]
        for p in sorted((out / "ranks").glob("rank?*.json"))
        if not p.name.endswith(".routing.json")
    ]
    measured.attrs["step_cpu_ms"] = sum(map(sum, steps)) / sum(map(len, steps)) * 1e3
    return measured


if __name__ == "__main__":
    main()
