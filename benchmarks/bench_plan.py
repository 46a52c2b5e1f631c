"""Planner speed and agreement (prints figures; no assertions).

1. The screen: every candidate plan of a model on N GPUs of Frontier, scored by the resource model and the
   analytic estimator: candidates, how many fit, wall time, per candidate.
2. The refinement: the top K by the estimate simulated (those that fit; with --ignore-memory the top K
   whatever their memory, to time the simulator and rank the two tiers when nothing fits): wall time and the
   Spearman rank correlation of estimated and simulated step times. --budget refines as many as fit in the time
   (plan --budget: refine.refine_points), and says which were left at the estimate tier.
3. The engine: a 200-point sweep (tiny-moe on the uniform cluster) with 1 and 2 Dask workers.

    python benchmarks/bench_plan.py [--model weak-1.7t --gpus 1024 --global-batch 4096 --seq-len 4096]
                                    [--top 16] [--workers N] [--budget 3min] [--ignore-memory] [--skip-sweep]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from piper_sim.analysis.ranking import spearman
from piper_sim.planning.plan_point import PlanPoint
from piper_sim.planning.planner import PlanRequest, refine_wall_s, screen, simulate_point
from piper_sim.planning.refine import parse_duration, refine_points
from piper_sim.points.keys import keyed_point
from piper_sim.points.store import ResultStore
from piper_sim.studies.config_sweep import run_sweep

SWEEP_BASE = {"model": "tiny-moe", "topology": "uniform", "parallel": {"pp": 1, "ep": 1, "num_microbatches": 4}}
SWEEP_GRID = [
    "parallel.pp=1,2",
    "parallel.ep=1,2",
    "collectives.all_to_all=flat,halo",
    "parallel.num_microbatches=4,8,12,16,20",
    "parallel.micro_batch_size=1,2,3,4,5",
]  # 200 points


def bench_screen(args: argparse.Namespace) -> None:
    request = PlanRequest(
        model=args.model,
        num_gpus=args.gpus,
        global_batch=args.global_batch,
        topology="frontier",
        seq_len=args.seq_len,
        top_k=args.top,
    )
    t0 = time.perf_counter()
    model, table, hbm, reserve = screen(request)
    wall = time.perf_counter() - t0
    t1 = time.perf_counter()
    screen(request)  # again, warm: what one more model or batch on the same process costs
    warm = time.perf_counter() - t1
    print(
        f"screen: {model.name} ({model.total_params() / 1e9:.0f} B params) on {args.gpus} Frontier GCDs, "
        f"global batch {args.global_batch} x {model.seq_len} tokens"
    )
    print(
        f"  candidates {len(table)}, fit in memory {int(table['fits'].sum())} "
        f"(usable {(hbm - reserve) / 2**30:.1f} GiB per GCD)"
    )
    print(
        f"  wall {wall:.2f} s cold ({wall / len(table) * 1e3:.2f} ms per candidate), {warm:.2f} s warm "
        f"({warm / len(table) * 1e3:.3f} ms per candidate)"
    )
    least = table.sort_values("peak_memory_bytes").iloc[0]
    print(f"  least memory: {least['label']} at {least['peak_memory_bytes'] / 2**30:.1f} GiB")
    pool = table if args.ignore_memory else table[table["fits"]]
    top = pool.sort_values("est_step_time_s").head(args.top)
    if top.empty:
        print("  refinement: no plan fits (rerun with --ignore-memory to time the simulator on the top plans)")
        return
    points = []
    for _, row in top.iterrows():
        config = request.config(
            PlanPoint(
                **{k: row[k].item() if hasattr(row[k], "item") else row[k] for k in PlanPoint.__dataclass_fields__}
            )
        )
        points.append(keyed_point({"config": config}))
    with tempfile.TemporaryDirectory() as tmp:
        t2 = time.perf_counter()
        budget = None if args.budget is None else parse_duration(args.budget)
        done = refine_points(
            simulate_point,
            points,
            ResultStore(Path(tmp)),
            refine_wall_s,
            budget_s=budget,
            workers=args.workers,
            label="refining",
        )
        refine = time.perf_counter() - t2
    ran = [i for i, p in enumerate(points) if p.digest in done.rows]
    sim = [done.rows[points[i].digest]["sim_step_time_s"] for i in ran]
    rho = spearman(top["est_step_time_s"].iloc[ran].tolist(), sim) if len(ran) >= 3 else float("nan")
    best = ran[min(range(len(sim)), key=sim.__getitem__)] if sim else None
    within = f" within {args.budget}" if args.budget else ""
    print(
        f"  refinement of the top {len(points)}{' (memory ignored)' if args.ignore_memory else ''}{within} on "
        f"{args.workers if args.workers is not None else 'one per core'} worker(s): {refine:.1f} s, {len(ran)} "
        f"refined; rank correlation estimate vs simulation {rho:.2f}"
    )
    for i, p in enumerate(points):
        row = done.rows.get(p.digest)
        wall = f"{row['sim_wall_s']:.1f} s" if row else "left at the estimate tier"
        predicted = done.predicted_s.get(p.digest)
        print(f"    {top.iloc[i]['label']}: {wall}" + (f" (predicted {predicted:.1f} s)" if predicted else ""))
    if best is not None:
        print(
            f"  best simulated: {top.iloc[best]['label']}: {done.rows[points[best].digest]['sim_step_time_s']:.3f} "
            f"s per step, {done.rows[points[best].digest]['sim_tflops_per_gpu']:.1f} TFLOPS/GPU, "
            f"{top.iloc[best]['peak_memory_bytes'] / 2**30:.1f} GiB peak"
        )


def bench_sweep() -> None:
    print("sweep: 200 points of tiny-moe on the uniform cluster")
    times = {}
    for workers in (1, 2):
        out = Path(tempfile.mkdtemp())
        t0 = time.perf_counter()
        table = run_sweep(SWEEP_BASE, SWEEP_GRID, out, workers=workers, progress=False)
        times[workers] = time.perf_counter() - t0
        shutil.rmtree(out)
        print(f"  {workers} worker(s): {len(table)} points in {times[workers]:.1f} s")
    print(f"  speed-up with 2 workers: {times[1] / times[2]:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="weak-1.7t")
    parser.add_argument("--gpus", type=int, default=1024)
    parser.add_argument("--global-batch", type=int, default=4096)
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--top", type=int, default=16)
    parser.add_argument("--workers", type=int, default=None, help="Dask workers for the refinement (0: in process)")
    parser.add_argument("--budget", default=None, help="refine as many of the top plans as fit in this time (3min)")
    parser.add_argument("--ignore-memory", action="store_true")
    parser.add_argument("--skip-sweep", action="store_true")
    args = parser.parse_args()
    bench_screen(args)
    if not args.skip_sweep:
        bench_sweep()


if __name__ == "__main__":
    main()
