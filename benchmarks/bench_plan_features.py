"""The plan features at scale (prints figures; no assertions): tensor parallelism, recomputation and ZeRO in the
planner's space, on three questions.

1. DeepSeek-V3 (sequence 4096, 4096 sequences per step) on 512 GPUs of the DGX H100 SuperPOD: the planner's choice,
   its estimated step, TFLOPS/GPU, MFU and peak memory per stage; with --simulate the chosen plan simulated too
   (step, TFLOPS/GPU, MFU, the simulator's wall time).
2. Mixtral 8x22B on 64 Frontier GCDs at one plan (pp 8, ep 8, 1F1B, micro-batch 1, 32 microbatches, sequence
   4096) with recompute none / selective / full: memory per stage and TFLOPS/GCD (resource model, estimator).
3. X-MoE Small on 256 Frontier GCDs, global batch 1024: X-MoE's configuration as `piper-sim reproduce` takes it
   (reproduce.throughput_experiments.baseline_config: the one validate --published scores) beside the planner's plan
   for the same GCDs.

    python benchmarks/bench_plan_features.py [--simulate]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from piper_sim.config import load_config
from piper_sim.planning.estimate import estimate_config
from piper_sim.planning.plan_point import PlanPoint
from piper_sim.planning.planner import PlanRequest, plan
from piper_sim.planning.resource import stage_memory
from piper_sim.reproduce.throughput_experiments import baseline_config
from piper_sim.simulator import simulate
from piper_sim.workload.presets import load_model

GIB = 2**30


def _planned(request: PlanRequest, out: Path, label: str, *, simulate_best: bool) -> None:
    t0 = time.perf_counter()
    result = plan(request, out, workers=0, progress=False)
    best = result.best
    print(
        f"{label}: {len(result.table)} candidates, {int(result.table['fits'].sum())} fit, screened in "
        f"{result.screen_s:.1f} s"
    )
    print(
        f"  chosen {best['label']}: estimated step {best['est_step_time_s']:.2f} s, "
        f"{best['est_tflops_per_gpu']:.1f} TFLOPS/GPU, MFU {100 * best['est_mfu']:.1f}%, "
        f"peak {best['peak_memory_bytes'] / GIB:.1f} GiB"
    )
    point = PlanPoint(
        **{k: best[k].item() if hasattr(best[k], "item") else best[k] for k in PlanPoint.__dataclass_fields__}
    )
    per_stage = [m.peak_bytes / GIB for m in stage_memory(result.model, point)]
    print(f"  peak memory per stage (GiB): {', '.join(f'{g:.1f}' for g in per_stage)}")
    if simulate_best:
        t1 = time.perf_counter()
        report = simulate(load_config(result.best_config())).report
        print(
            f"  simulated: step {report.step_time_s:.2f} s, {report.tflops_per_gpu:.1f} TFLOPS/GPU, MFU "
            f"{100 * report.mfu:.1f}%, peak {max(report.peak_memory_bytes) / GIB:.1f} GiB; simulator wall "
            f"{time.perf_counter() - t1:.1f} s"
        )
    print(f"  ({time.perf_counter() - t0:.1f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--simulate", action="store_true", help="also simulate the planner's choices")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        _planned(
            PlanRequest(
                model="deepseek-v3",
                num_gpus=512,
                global_batch=4096,
                seq_len=4096,
                topology="dgx-h100-superpod",
                profile="h100",
                top_k=0,
            ),
            Path(tmp) / "dsv3",
            "1. DeepSeek-V3, 512 H100",
            simulate_best=args.simulate,
        )

        print("2. Mixtral 8x22B, 64 Frontier GCDs, pp8 ep8 1f1b mbs1 x32, sequence 4096")
        model = {"preset": "mixtral-8x22b", "seq_len": 4096}
        for recompute in ("none", "selective", "full"):
            point = PlanPoint(
                pp=8,
                ep=8,
                dp=1,
                vpp=1,
                micro_batch_size=1,
                num_microbatches=32,
                schedule="1f1b",
                all_to_all="flat",
                recompute=recompute,
            )
            memory = [m.peak_bytes / GIB for m in stage_memory(load_model(model), point)]
            estimate, fits = estimate_config(
                load_config({"model": model, "topology": "frontier", **point.config_sections()})
            )
            print(
                f"  recompute {recompute:>9}: stages {memory[0]:.1f} .. {memory[-1]:.1f} GiB "
                f"({'fits' if fits else 'does not fit'} 64 GB), {estimate.tflops_per_gpu:.1f} TFLOPS/GCD"
            )

        print("3. X-MoE Small, 256 Frontier GCDs, global batch 1024")
        base = load_config(baseline_config("x-moe-small", 256)[0])
        estimate, fits = estimate_config(base)
        par = base.parallel
        print(
            f"  X-MoE's configuration pp1 ep{par.ep} dp{par.dp} z1 {base.collectives.all_to_all}: "
            f"{estimate.tflops_per_gpu:.1f} TFLOPS/GCD, MFU "
            f"{100 * estimate.mfu:.1f}%, all-to-all {estimate.all_to_all_s:.2f} s of {estimate.step_time_s:.2f} s"
            f" ({'fits' if fits else 'does not fit'})"
        )
        if args.simulate:
            report = simulate(base).report
            print(f"    simulated: {report.tflops_per_gpu:.1f} TFLOPS/GCD, MFU {100 * report.mfu:.1f}%")
        _planned(
            PlanRequest(model="x-moe-small", num_gpus=256, global_batch=1024, top_k=0),
            Path(tmp) / "small",
            "  planner",
            simulate_best=args.simulate,
        )


if __name__ == "__main__":
    main()
