"""`simulate --tier estimate`: a config's report from the planner's analytic estimator (planning/estimate.py).

Owns estimate_report: the Report a simulation writes as report.json, with the figures the estimator gives (step
time, throughput, FLOPs, MFU, memory per stage by the resource model) and null for those only the discrete-event
simulation gives (per-step times, fractions of time, all-to-all bandwidth, link loads, imbalance, migration), plus
`estimate`, the estimator's terms. The estimator prices balanced routing, one representative step, and no
contention between concurrent transfers (docs/planning.md); ignored_notes says what in a config it leaves out.
Must not import torch or simpy.
"""

from __future__ import annotations

import time

from piper_sim.analysis.run_report import Report, mfu_over_peak
from piper_sim.config import Config
from piper_sim.machine import Machine
from piper_sim.planning.estimate import config_estimator, estimate_with_memory
from piper_sim.workload.memory import headroom_bytes
from piper_sim.workload.recompute import Recompute

# report.json keys the simulator fills and the estimator cannot: written as null
NOT_ESTIMATED = (
    "step_times_s",
    "compute_fraction",
    "bubble_fraction",
    "exposed_comm_fraction",
    "all_to_all_bandwidth_bytes_per_s",
    "busiest_link",
    "peak_memory_bytes_first_step",
    "imbalance",
    "migration",
)


def estimate_report(cfg: Config, machine: Machine | None = None) -> Report:
    """The estimator's report of a config (tier "estimate") on its machine (built from cfg when None); hfu only
    without recomputation (equal to mfu)."""
    t0 = time.perf_counter()
    built = config_estimator(cfg, machine)
    est, peaks, hbm, reserve = estimate_with_memory(cfg, built)
    headroom = headroom_bytes(peaks, hbm, reserve)
    tokens = cfg.parallel.sequences_per_step * cfg.model.seq_len
    nulls = dict.fromkeys(NOT_ESTIMATED)
    fp8_peak = built[0].profile.peak_fp8_flops_per_s if cfg.model.fp8_recipe else None  # the MFU's other peak
    return Report(
        num_gpus=cfg.parallel.num_gpus,
        num_steps=cfg.steps,
        step_time_s=est.step_time_s,
        tokens_per_step=tokens,
        tokens_per_s=tokens / est.step_time_s,
        model_flops_per_step=est.model_flops_per_step,
        tflops_per_gpu=est.tflops_per_gpu,
        mfu=est.mfu,
        hfu=est.mfu if cfg.recompute == Recompute.NONE else None,
        peak_memory_bytes=[float(p) for p in peaks],
        hbm_bytes=hbm,
        framework_reserve_bytes=reserve,
        memory_headroom_bytes=headroom,
        fits_memory=[h >= 0 for h in headroom],
        mfu_fp8_peak=mfu_over_peak(est.model_flops_per_step, est.step_time_s, cfg.parallel.num_gpus, fp8_peak),
        backend="sim",
        tier="estimate",
        estimate={k: float(v) for k, v in est.__dict__.items()},
        sim_wall_s=time.perf_counter() - t0,
        **nulls,
    )


def expected_run_s(cfg: Config, machine: Machine | None = None) -> float:
    """The simulated seconds a simulation of cfg on its machine (built from cfg when None) is expected to reach (the
    estimate's step time x its steps): the total of simulate's progress line."""
    return estimate_with_memory(cfg, config_estimator(cfg, machine))[0].step_time_s * cfg.steps


def estimate_json(report: Report) -> dict:
    """report.json of the estimate tier: the simulator's keys, null where the estimator has no figure."""
    return report.to_dict(nulls=(*NOT_ESTIMATED, "hfu"))


def ignored_notes(cfg: Config) -> list[str]:
    """What the config asks for that the estimate does not price (each one line)."""
    notes = []
    if not cfg.routing.is_uniform:
        notes.append(f"routing.kind {cfg.routing.kind!r}: the estimate prices balanced (uniform) routing")
    if cfg.migration.active:
        notes.append("migration: the estimate moves no experts")
    if cfg.recompute_layers is not None:
        notes.append(f"recompute_layers {cfg.recompute_layers}: the estimate recomputes every layer of a chunk")
    return notes
