"""From a Config to a simulated run: schedule, topology, placement, cost model, SimPy, trace, report.

Owns the assembly of the simulator's inputs; writes nothing (see outputs.py for files).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pandas as pd

from piper_sim.analysis.report import build_report
from piper_sim.calibrate.load import load_profiles
from piper_sim.config import Config
from piper_sim.routing.models import routing_from_config
from piper_sim.schedule import generators as _generators  # noqa: F401  (registers the schedules)
from piper_sim.schedule.ir import Schedule
from piper_sim.schedule.lower import lower
from piper_sim.schedule.registry import SCHEDULES
from piper_sim.sim.engine import Asymmetry, Simulation
from piper_sim.topology.graph import Topology
from piper_sim.topology.load import load_topology
from piper_sim.topology.placement import place
from piper_sim.trace.runtrace import trace_from_arrays
from piper_sim.workload.cost import TaskCoster
from piper_sim.workload.parallel import stage_layer_split


def build_coarse_schedule(cfg: Config) -> Schedule:
    """The generator's schedule: forward/backward per chunk and microbatch, per pipeline stage."""
    par = cfg.parallel
    generator = SCHEDULES.get(cfg.schedule, "schedule")
    programs = generator(par.pp, par.vpp, par.num_microbatches)
    return Schedule(name=cfg.schedule, mesh=par.mesh, vpp=par.vpp, num_microbatches=par.num_microbatches,
                    stage_programs=programs)


def build_schedule(cfg: Config) -> Schedule:
    """The lowered schedule of one training step for this config."""
    layers = stage_layer_split(cfg.model.num_layers, cfg.parallel.pp * cfg.parallel.vpp)
    migration = bool(cfg.migration.get("enabled")) and cfg.migration.get("policy", "greedy") != "none"
    return lower(build_coarse_schedule(cfg), cfg.model, layers, migration=migration)


@dataclass(kw_only=True)
class SimResult:
    schedule: Schedule
    topology: Topology
    placement: list[str]
    trace: pd.DataFrame
    report: dict
    link_bytes: object  # numpy array, bytes carried per link
    stats: dict


def run_simulation(cfg: Config) -> SimResult:
    t0 = time.perf_counter()
    schedule = build_schedule(cfg)
    par = cfg.parallel
    topo = load_topology(cfg.topology, par.num_gpus)
    placement = place(topo, par.num_gpus, cfg.placement)
    profile, host_profile = load_profiles(cfg.cost_profile)
    coster = TaskCoster(cfg.model, profile, par.micro_batch_size * cfg.model.seq_len)
    routing = routing_from_config(cfg.routing, cfg.model.num_experts, cfg.model.top_k, cfg.seed)
    def simulation(collapse: bool) -> Simulation:
        return Simulation(schedule=schedule, model=cfg.model, parallel=par, topology=topo, placement=placement,
                          coster=coster, routing=routing, all_to_all=cfg.all_to_all, all_reduce=cfg.all_reduce,
                          steps=cfg.steps, flash_attention=cfg.flash_attention, collapse=collapse,
                          migration=cfg.migration, host_profile=host_profile)

    t1 = time.perf_counter()
    fell_back = False
    sim = simulation(cfg.collapse)
    try:
        records = sim.run()
    except Asymmetry:  # members of a lane diverged: simulate every rank on its own
        fell_back = True
        sim = simulation(False)
        records = sim.run()
    t2 = time.perf_counter()
    trace = trace_from_arrays(schedule, records.start_s, records.end_s, records.flops, records.bytes, records.cpu_s)
    per_stage = par.num_gpus // par.pp
    peak = [float(records.peak_memory_bytes[p * per_stage:(p + 1) * per_stage].max()) for p in range(par.pp)]
    wall = time.perf_counter() - t0
    report = build_report(trace, num_gpus=par.num_gpus, peak_flops_per_s=profile.peak_flops_per_s,
                          tokens_per_step=par.sequences_per_step * cfg.model.seq_len, peak_memory_by_stage=peak,
                          sim_wall_s=wall)
    report["hbm_bytes"] = profile.hbm_bytes
    report["peak_memory_bytes_first_step"] = [
        float(records.first_step_peak_memory_bytes[p * per_stage:(p + 1) * per_stage].max()) for p in range(par.pp)]
    report.update(sim.experts.summary())
    migrate = trace[trace["role"] == "migrate"]
    report["migration"]["time_fraction"] = float(
        (migrate["end_s"] - migrate["start_s"]).sum() / max(len(trace["rank"].unique()), 1) / trace["end_s"].max())
    stats = {"setup_s": t1 - t0, "event_loop_s": t2 - t1, "trace_and_report_s": time.perf_counter() - t2,
             "num_tasks": len(trace), "num_flows": records.num_flows, "num_solves": records.num_solves,
             "num_lanes": records.num_lanes, "lanes_fell_back": fell_back}
    return SimResult(schedule=schedule, topology=topo, placement=placement, trace=trace, report=report,
                     link_bytes=records.link_bytes, stats=stats)
