"""The single-GPU check: calibrate compute on this machine's GPU, then run
compute-bound single-GPU cases for real and predict them from that profile alone.

    python3 validation/gpu/device_check.py --out DIR [--quick] [--steps N]

On the device machine run it through validation/gpu/device_check.sh (it installs the carried wheels).
Writes DIR/profile.yaml (the calibrated profile), DIR/runs/NAME/ (each measured run) and
DIR/gpu-validation.md: device, versions, and per case predicted vs measured step time and peak memory
(tensor accounting and, on a GPU, torch.cuda.max_memory_allocated). Runs on a CPU too (then it
validates the CPU; `--quick` calibrates with a reduced sweep).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
# single GPU (pp 1, ep 1), compute-bound: small-moe at growing micro-batches and a longer sequence; the
# preset's bf16 on a GPU (the torch backend runs the model's dtype there), float32 on a CPU
CASES = {
    "small-moe-mb2": {"model": {"preset": "small-moe"}, "micro_batch_size": 2},
    "small-moe-mb8": {"model": {"preset": "small-moe"}, "micro_batch_size": 8},
    "small-moe-seq1024": {"model": {"preset": "small-moe", "seq_len": 1024}, "micro_batch_size": 4},
}


def cli(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "piper_sim", *args], check=True, cwd=ROOT)


def config(case: dict, profile: Path, steps: int, cuda: bool) -> dict:
    model = case["model"] if cuda else {**case["model"], "dtype": "fp32"}
    return {
        "model": model,
        "schedule": "1f1b",
        "parallel": {"pp": 1, "ep": 1, "dp": 1, "num_microbatches": 4, "micro_batch_size": case["micro_batch_size"]},
        "cost": {"profile": str(profile)},
        "sim": {"steps": steps, "seed": 0},
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--quick", action="store_true", help="reduced calibration sweep")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args()
    import torch

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU ({platform.processor()})"
    print(f"device: {device}; torch {torch.__version__}", flush=True)
    profile = out / "profile.yaml"
    t0 = time.perf_counter()
    cli("calibrate", "--out", str(profile), "--ranks", "1", *(["--quick"] if args.quick else []))
    lines = [
        f"# Device check: {device}",
        "",
        f"torch {torch.__version__}, Python {platform.python_version()}, calibration "
        f"{'quick' if args.quick else 'full'} ({time.perf_counter() - t0:.0f} s), {args.steps} steps per case, "
        "steady steps scored (step 0 left out).",
        "",
        "| case | predicted step ms | measured step ms | error | predicted peak MB | measured (tensors) MB "
        "| error | measured (allocator) MB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in args.cases.split(","):
        cfg_path = out / f"{name}.yaml"
        cfg_path.write_text(yaml.safe_dump(config(CASES[name], profile, args.steps, torch.cuda.is_available())))
        run_dir, sim_dir = out / "runs" / name, out / "sims" / name
        cli("run", str(cfg_path), "--out", str(run_dir))
        cli("simulate", str(cfg_path), "--out", str(sim_dir))
        measured = json.loads((run_dir / "report.json").read_text())
        predicted = json.loads((sim_dir / "report.json").read_text())
        m_step, p_step = measured["step_time_s"], predicted["step_time_s"]
        m_mem, p_mem = measured["peak_memory_bytes"][0], predicted["peak_memory_bytes"][0]
        device_mem = (measured.get("peak_device_memory_bytes") or [float("nan")])[0]
        lines.append(
            f"| {name} | {p_step * 1e3:.2f} | {m_step * 1e3:.2f} | {(p_step / m_step - 1) * 100:+.1f}% "
            f"| {p_mem / 1e6:.1f} | {m_mem / 1e6:.1f} | {(p_mem / m_mem - 1) * 100:+.1f}% "
            f"| {device_mem / 1e6:.1f} |"
        )
        print(lines[-1], flush=True)
    (out / "gpu-validation.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / 'gpu-validation.md'}")


if __name__ == "__main__":
    main()
