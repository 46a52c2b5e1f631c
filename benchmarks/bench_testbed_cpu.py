"""CPU the ranks of a validation case use while it trains on the testbed (needs root).

    python benchmarks/bench_testbed_cpu.py flat-zb-pp4ep2-flat [--steps 30]

Runs the case's config for --steps steps on its testbed (prefix pstc) and samples the rank processes'
CPU time (user + system per thread, from /proc/PID/task/TID/stat), the delay line's and every other
process's every 0.25 s. Prints the CPU seconds the
ranks used per wall second over the last two thirds of the run (at most the machine's cores) and per
rank per step, to compare with the compute and collective host time the simulator charges (reported by
`piper-sim simulate` on the same config). Used by validation/README.md ("Known gaps").
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("case")
    parser.add_argument("--steps", type=int, default=30)
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
            samples.append((time.monotonic(), *cpu_by_part()))
            time.sleep(0.25)

    with tempfile.TemporaryDirectory() as tmp:
        cfg_path = Path(tmp) / "config.yaml"
        cfg_path.write_text(yaml.safe_dump(config))
        cli = ["piper-sim", "testbed"]
        subprocess.run([*cli, "down", "--prefix", "pstc"], capture_output=True)
        subprocess.run([*cli, "up", str((case_dir / case["testbed"]).resolve()), "--prefix", "pstc"], check=True,
                       capture_output=True)
        sampler = threading.Thread(target=sample)
        sampler.start()
        t0 = time.monotonic()
        try:
            run = subprocess.run([*cli, "run", str(cfg_path), "--prefix", "pstc", "--out", str(Path(tmp) / "out")],
                                 capture_output=True, text=True)
        finally:
            done.set()
            sampler.join()
            subprocess.run([*cli, "down", "--prefix", "pstc"], capture_output=True)
        if run.returncode != 0:
            raise SystemExit(run.stderr.strip().splitlines()[-1])
        step_s = json.loads((Path(tmp) / "out" / "report.json").read_text())["step_time_s"]
    wall = time.monotonic() - t0
    alive = [s for s in samples if s[2] == world]
    a, b = alive[len(alive) // 3], alive[-2]
    span = b[0] - a[0]
    used = {k: (b[1].get(k, 0.0) - a[1].get(k, 0.0)) / span for k in b[1]}
    rate = sum(v for k, v in used.items() if k.startswith("rank thread"))
    print(f"{args.case}: {world} ranks, {args.steps} steps in {wall:.1f} s (incl. start-up), "
          f"steady step {step_s * 1e3:.0f} ms")
    print(f"ranks' CPU seconds per wall second (steady): {rate:.2f} of {os.cpu_count()} cores")
    print(f"CPU per rank per step: {rate * step_s / world * 1e3:.0f} ms")
    print("CPU seconds per wall second by part (steady):")
    for name, value in sorted(used.items(), key=lambda kv: -kv[1]):
        if value >= 0.005:
            print(f"  {name:40s} {value:5.2f}   per rank per step {value * step_s / world * 1e3:6.1f} ms")

if __name__ == "__main__":
    main()
