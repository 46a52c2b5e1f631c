"""The points of `piper-sim reproduce`: each a pure function of its payload, run in this process or on a Dask worker.

Owns run_point, which dispatches on payload["kind"]:
- "a2a": one all-to-all of `size_per_gpu_bytes` per GPU on `gpus` GPUs of a topology (contiguous placement; the
  topology's own allocation places the job's nodes on the machine), timed by the collective simulator
  (studies.reduced_collective.run_collective) -> time and bus bandwidth per GPU;
- "a2a_study": one node count of the all-to-all study (studies.all_to_all.run_study) -> its rows;
- "memory_map": stage-0 peak memory of every PP x EP mesh of a model and the stage that peaks highest
  (planning.resource.stage_memory);
- "simulate": one config simulated -> the report's figures (and per-step times for multi-step runs);
- "estimate": one config priced by the planner's estimator (planning.estimate.estimate_config);
- "plan": the planner on one model and GPU count -> its chosen plan, estimated or simulated.
Must not import torch.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from piper_sim.collectives.algorithms import ALL_TO_ALL
from piper_sim.config import load_config
from piper_sim.planning.estimate import estimate_config
from piper_sim.planning.plan_point import PlanPoint
from piper_sim.planning.planner import PlanRequest, plan
from piper_sim.planning.resource import stage_memory
from piper_sim.planning.space import divisors
from piper_sim.simulator import simulate
from piper_sim.studies.all_to_all import StudySpec, run_study
from piper_sim.studies.reduced_collective import run_collective
from piper_sim.topology.load import load_topology
from piper_sim.topology.placement import place
from piper_sim.workload.presets import load_model
from piper_sim.workload.task_kinds import Role, TaskKind


def run_point(payload: dict) -> dict:
    return KINDS[payload["kind"]](payload)


def _a2a(payload: dict) -> dict:
    n, size = payload["gpus"], float(payload["size_per_gpu_bytes"])
    topo = load_topology(payload["topology"], n)
    gpus = place(topo, n, "contiguous")
    matrix = np.full((n, n), size / n)
    phases = ALL_TO_ALL.get(payload["algorithm"], "algorithm")(matrix, gpus, topo)
    t0 = time.perf_counter()
    _, run = run_collective(phases, gpus, topo)
    return {
        "time_s": run.time_s,
        "busbw_bytes_per_s": size * (n - 1) / n / run.time_s,
        "hosts": len({topo.host_of(g) for g in gpus}),
        "wall_s": time.perf_counter() - t0,
    }


def _a2a_study(payload: dict) -> dict:
    spec = StudySpec(
        topology=payload["topology"],
        nodes=(payload["nodes"],),
        sizes=tuple(payload["sizes"]),
        algorithms=tuple(payload["algorithms"]),
        size_per="gpu",
    )
    t0 = time.perf_counter()
    rows = [row for row, _ in run_study(spec, log=lambda _s: None)]
    return {"rows": rows, "wall_s": time.perf_counter() - t0}


def _memory_map(payload: dict) -> dict:
    """Every (pp, ep) of a 1F1B plan with micro-batch size 1 on N GPUs at the global batch: stage-0 peak memory."""
    t0 = time.perf_counter()
    model = load_model(payload["model"])
    n, batch = payload["gpus"], payload["global_batch"]
    cells = []
    for pp in [d for d in divisors(n) if d <= model.num_layers]:
        for ep in [d for d in divisors(n // pp) if model.num_experts % d == 0]:
            dp = n // (pp * ep)
            if batch % (dp * ep):
                continue
            point = PlanPoint(
                pp=pp,
                ep=ep,
                dp=dp,
                vpp=1,
                micro_batch_size=1,
                num_microbatches=batch // (dp * ep),
                schedule="1f1b",
                all_to_all="flat",
                recompute=payload["recompute"],
            )
            peaks = [stage.peak_bytes for stage in stage_memory(model, point)]
            cells.append(
                {
                    "pp": pp,
                    "ep": ep,
                    "dp": dp,
                    "stage0_bytes": peaks[0],
                    "peak_stage": max(range(len(peaks)), key=peaks.__getitem__),
                }
            )
    return {"cells": cells, "wall_s": time.perf_counter() - t0}


def _simulate(payload: dict) -> dict:
    t0 = time.perf_counter()
    result = simulate(load_config(payload["config"]))
    r = result.report
    return {
        "step_time_s": r.step_time_s,
        "step_times_s": list(r.step_times_s),
        "mfu": r.mfu,
        "tflops_per_gpu": r.tflops_per_gpu,
        "tokens_per_s": r.tokens_per_s,
        "peak_memory_bytes": max(r.peak_memory_bytes),
        "fits_memory": all(r.fits_memory),
        "all_to_all_fraction": _a2a_fraction(result.trace, r),
        "migration": r.migration or {},
        "exposed_comm_fraction": r.exposed_comm_fraction,
        "bubble_fraction": r.bubble_fraction,
        "wall_s": time.perf_counter() - t0,
    }


def _estimate(payload: dict) -> dict:
    """One config priced by the planner's estimator (the quick tier of a "simulate" point)."""
    t0 = time.perf_counter()
    estimate, fits = estimate_config(load_config(payload["config"]))
    return {
        "step_time_s": estimate.step_time_s,
        "mfu": estimate.mfu,
        "tflops_per_gpu": estimate.tflops_per_gpu,
        "fits_memory": fits,
        "all_to_all_fraction": estimate.all_to_all_s / estimate.step_time_s,
        "wall_s": time.perf_counter() - t0,
    }


def _a2a_fraction(trace, report) -> float:
    """Share of a rank's step time in MoE all-to-alls (dispatch and combine), averaged over ranks."""
    rows = trace[(trace["kind"] == TaskKind.ALL_TO_ALL) & trace["role"].isin([Role.DISPATCH, Role.COMBINE])]
    busy = float((rows["end_s"] - rows["start_s"]).sum())
    return busy / (report.num_gpus * report.num_steps * report.step_time_s)


def _plan(payload: dict) -> dict:
    """The planner's choice (refined by the simulator when top_k > 0) on one model and GPU count."""
    request = PlanRequest(**payload["request"])
    t0 = time.perf_counter()
    # only the best plan that fits is read: the plans that do not fit are not estimated
    result = plan(request, Path(payload["out"]), workers=0, progress=False, estimate_unfit=False)
    best = result.best
    if best is None:
        return {"fits": False, "candidates": len(result.table), "wall_s": time.perf_counter() - t0}
    tier = "DES" if bool(best["refined"]) else "estimate"
    sim = tier == "DES"
    return {
        "fits": True,
        "plan": str(best["label"]),
        "tier": tier,
        "candidates": len(result.table),
        "fitting": int(result.table["fits"].sum()),
        "step_time_s": float(best["step_time_s"]),
        "tflops_per_gpu": float(best["sim_tflops_per_gpu"] if sim else best["est_tflops_per_gpu"]),
        "mfu": float(best["sim_mfu"] if sim else best["est_mfu"]),
        "peak_memory_bytes": float(best["peak_memory_bytes"]),
        "wall_s": time.perf_counter() - t0,
    }


KINDS = {
    "a2a": _a2a,
    "a2a_study": _a2a_study,
    "memory_map": _memory_map,
    "simulate": _simulate,
    "estimate": _estimate,
    "plan": _plan,
}
