"""The simulator backend: a Config (and its lowered Schedule) to a RunResult.

Owns running the SimPy engine on a config's built pieces (its Machine: machine.py; its settings: sim/settings.py),
the checks a simulated run makes of its machine, and the fallback to one lane per rank when lane members diverge;
writes nothing (outputs.py writes a run's files).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np

from piper_sim.analysis.links import link_table
from piper_sim.analysis.run_report import report_of
from piper_sim.analysis.task_arrays import TaskArrays
from piper_sim.collectives.algorithms import check_collective_params
from piper_sim.config import Config
from piper_sim.host_memory import MemoryGuard, RunMemory, available_memory_bytes, check_run_memory, estimate_run_memory
from piper_sim.machine import Machine, build_machine
from piper_sim.progress import bar as progress_bar
from piper_sim.progress import restart, watch
from piper_sim.result import RunResult, steps_frame
from piper_sim.run_wall import RunWork, check_run_wall, duration_text, run_work
from piper_sim.schedule.build import build_schedule
from piper_sim.schedule.communicators import config_reserve_bytes
from piper_sim.schedule.ir import Schedule
from piper_sim.sim.engine import PER_RANK, LaneSplit, Simulation
from piper_sim.sim.host import Asymmetry
from piper_sim.sim.run_records import SimRecords
from piper_sim.sim.settings import settings_of
from piper_sim.topology.placement import check_tensor_groups
from piper_sim.workload.cost import TaskCoster
from piper_sim.workload.memory import headroom_bytes
from piper_sim.workload.task_kinds import Role

GC_THRESHOLD = (50_000, 20, 20)  # Python's cyclic collector while a run is simulated (the default: 700, 10, 10)
# the progress line: simulated seconds reached, out of the expected ones where known (index: no expected total)
SIM_TIME_FORMAT = {
    False: "{desc}: {n:.4g}/{total:.4g} s simulated [{elapsed}<{remaining}]",
    True: "{desc}: {n:.4g} s simulated [{elapsed}]",
}
RESTARTS = (
    "lanes diverged: restarting with lanes split by latency",
    "lanes diverged: restarting with one lane per rank",
)
SPLIT_RESTART = "lanes diverged on {axis} groups: restarting with lanes split by them"


@contextmanager
def fewer_collections() -> Iterator[None]:
    """A run allocates millions of short-lived objects (events, records, tuples) and little cyclic garbage; at
    Python's default threshold the cyclic collector runs every 700 allocations and takes 10-20% of a skewed run
    (benchmarks/bench_sim.py). Collect less often while it runs; the thresholds are restored after."""
    before = gc.get_threshold()
    gc.set_threshold(*GC_THRESHOLD)
    try:
        yield
    finally:
        gc.set_threshold(*before)


def simulate(
    cfg: Config,
    schedule: Schedule | None = None,
    *,
    machine: Machine | None = None,
    progress: bool = False,
    outputs: str | None = None,
    expected_s: float | None = None,
    max_wall_minutes: float | None = None,
) -> RunResult:
    """Simulate the config's training steps; schedule: its lowered schedule (built from cfg when None); machine:
    its machine (build_machine(cfg) when None, after the wall-time check);
    progress: a progress line on stderr (piper_sim.progress) when the event loop runs past a few seconds: the
    simulated time reached, out of expected_s (the simulated seconds the run is expected to reach, e.g. the
    estimator's steps x step time; None: no total and no ETA), and each restart of the run (lanes diverged);
    outputs: what the caller will write of the run (outputs.OUTPUTS; None: nothing), counted in the memory the run
    is checked to need before it starts (host_memory.py: stats["host_memory_estimate_bytes"]); max_wall_minutes: a run
    expected to take longer on this machine is refused before it starts (run_wall.py; None: no limit); the estimate
    is stats["wall_estimate_s"], and the progress line shows it."""
    with fewer_collections():
        return _simulate(cfg, schedule, machine, progress, outputs, expected_s, max_wall_minutes)


def check_wall(cfg: Config, schedule: Schedule, max_wall_minutes: float | None) -> RunWork:
    """The run's expected wall time on this machine (run_wall.py); refused beyond max_wall_minutes (None: no limit)."""
    work = run_work(schedule, cfg.steps, not cfg.routing.is_uniform)
    check_run_wall(work, max_wall_minutes)
    return work


def _simulate(
    cfg: Config,
    schedule: Schedule | None,
    machine: Machine | None,
    progress: bool,
    outputs: str | None,
    expected_s: float | None,
    max_wall_minutes: float | None,
) -> RunResult:
    t0 = time.perf_counter()
    schedule = schedule or build_schedule(cfg)
    work = check_wall(cfg, schedule, max_wall_minutes)
    par = cfg.parallel
    machine = machine or build_machine(cfg)
    topo, profile = machine.topology, machine.profile
    check_collective_params(topo)
    check_tensor_groups(topo, list(machine.placement), par.tp)
    coster = TaskCoster(
        cfg.model, profile, par.tokens_per_microbatch(cfg.model.seq_len), par.split, cfg.flash_attention
    )
    settings = settings_of(cfg)

    def simulation(lanes: LaneSplit) -> Simulation:
        sim = Simulation(schedule, machine, settings, coster, lanes)
        sim.guard = guard
        return sim

    t1 = time.perf_counter()
    total = cfg.steps * schedule.mesh.num_ranks // par.pp * sum(len(p) for p in schedule.stage_programs)
    pairs = par.num_gpus * par.ep if par.ep > 1 else 0  # the GPU pairs of the EP groups' all-to-alls
    memory = check_memory(total, len(topo.capacity_bytes_per_s), pairs, cfg, outputs)
    with MemoryGuard(memory.total_bytes, available=available_memory_bytes) as guard:
        line = progress_bar(
            expected_s,
            f"simulating (about {duration_text(work.wall_s)} expected)",
            show=progress,
            bar_format=SIM_TIME_FORMAT[expected_s is None],
            smoothing=0.0,
        )
        reading = Reading()
        with watch(line, reading):
            reading.sim = simulation(LaneSplit(collapse=cfg.collapse))
            records, fell_back, by_latency, split_axes = _run_lanes(
                reading, simulation, lambda text: restart(line, text)
            )
            reading.end_s = max(float(np.nanmax(end)) for end in records.end_s)
        sim = reading.sim
        t2 = time.perf_counter()
        tasks = TaskArrays(schedule, records.start_s, records.end_s, records.flops, records.bytes, records.cpu_s)
        figures = tasks.figures()
        guard.check()
    links = link_table(topo, records.link_bytes, tasks.last_end_s - tasks.first_start_s)
    experts = sim.experts.summary()
    experts["migration"]["time_fraction"] = (
        tasks.seconds_of(lambda t: t.role == Role.MIGRATE) / schedule.mesh.num_ranks / tasks.last_end_s
    )
    peaks = _per_stage_max(records.peak_memory_bytes, par.pp)
    reserve = config_reserve_bytes(cfg, profile)
    headroom = headroom_bytes(peaks, profile.hbm_bytes, reserve)
    report = report_of(
        figures,
        num_gpus=par.num_gpus,
        peak_flops_per_s=profile.peak_flops_per_s,
        tokens_per_step=par.sequences_per_step * cfg.model.seq_len,
        peak_memory_by_stage=peaks,
        links=links,
        memory_headroom_bytes=headroom,
        fits_memory=[h >= 0 for h in headroom],
        sim_wall_s=time.perf_counter() - t0,
        hbm_bytes=profile.hbm_bytes,
        backend="sim",
        tier="des",
        framework_reserve_bytes=reserve,
        peak_fp8_flops_per_s=profile.peak_fp8_flops_per_s if cfg.model.fp8_recipe else None,
        peak_memory_bytes_first_step=_per_stage_max(records.first_step_peak_memory_bytes, par.pp),
        **experts,
    )
    stats = {
        "setup_s": t1 - t0,
        "event_loop_s": t2 - t1,
        "report_s": time.perf_counter() - t2,
        "num_tasks": tasks.num_rows,
        "num_flows": records.num_flows,
        "num_solves": records.num_solves,
        "num_lanes": records.num_lanes,
        "lanes_by_latency": by_latency,
        "lanes_split_by": list(split_axes),
        "lanes_fell_back": fell_back,
        "num_reserved": records.num_reserved,
        "num_broken": records.num_broken,
        "num_mirrored": records.num_mirrored,
        "host_memory_estimate_bytes": memory.total_bytes,
        "wall_estimate_s": work.wall_s,
    }
    return RunResult(
        backend="sim",
        config=cfg,
        schedule=schedule,
        report=report,
        tasks=tasks,
        steps=steps_frame(report),
        topology=topo,
        placement=machine.placement,
        links=links,
        stats=stats,
    )


def check_memory(tasks: int, links: int, pairs: int, cfg: Config, outputs: str | None) -> RunMemory:
    """The run's estimated peak host memory (host_memory.py); a run that would not fit in the memory available here
    stops before it starts, naming what to lower (rather than being killed for memory after minutes)."""
    memory = estimate_run_memory(tasks, links, pairs, outputs)
    check_run_memory(
        memory,
        cfg.parallel.num_microbatches,
        outputs,
        available_memory_bytes(),
        lambda fewer: estimate_run_memory(tasks, links, pairs, fewer),
    )
    return memory


class Reading:
    """What a simulation's progress line reads (from another thread): the simulated time the run under way has
    reached (0 between a run given up and the next), and the run's end once it has one (lanes' members keep clocks
    of their own, ahead of the event loop's)."""

    def __init__(self) -> None:
        self.sim: Simulation | None = None
        self.end_s: float | None = None

    def __call__(self) -> float:
        sim, end_s = self.sim, self.end_s
        return end_s if end_s is not None else 0.0 if sim is None else float(sim.env.now)


def _run_lanes(
    reading: Reading, simulation: Callable[..., Simulation], restarted: Callable[[str], None]
) -> tuple[SimRecords, bool, bool, tuple[str, ...]]:
    """Run reading.sim; when members of a lane diverge (Asymmetry), again with lanes split by route latency
    (Simulation._by_latency), then, while the divergence names a collective's axis not split yet, with lanes split
    by that axis's groups as well (Simulation._by_groups), and last with one lane per rank; each restart said through
    restarted(text) before the next run starts. A split that gives the same lanes as the run given up, or one lane
    per rank, is not run. reading.sim holds the run under way (None between runs); a run given up is let go.
    Returns (records, fell back to one lane per rank, lanes split by latency, the axes lanes were split by)."""
    lanes, ranks = len(reading.sim.lanes), reading.sim.mesh.num_ranks
    by_latency, axes = False, ()

    def attempt(sim: Simulation) -> tuple[SimRecords | None, str | None]:
        reading.sim = sim
        try:
            return sim.run(), None
        except Asymmetry as diverged:
            reading.sim = None
            return None, diverged.axis

    records, axis = attempt(reading.sim)
    if records is not None:
        return records, False, False, ()
    restarted(RESTARTS[0])
    split = simulation(LaneSplit(by_latency=True))
    if lanes < len(split.lanes) < ranks:  # else the same lanes as a run given up
        by_latency, lanes = True, len(split.lanes)
        records, axis = attempt(split)
        if records is not None:
            return records, False, True, ()
    del split
    while axis is not None and axis not in axes:
        split = simulation(LaneSplit(by_latency=by_latency, axes=(*axes, axis)))
        if not lanes < len(split.lanes) < ranks:  # nothing smaller than the lanes given up, short of one a rank
            del split
            break
        restarted(SPLIT_RESTART.format(axis=axis))
        axes, lanes = (*axes, axis), len(split.lanes)
        records, axis = attempt(split)
        if records is not None:
            return records, False, by_latency, axes
        del split
    restarted(RESTARTS[1])
    reading.sim = simulation(PER_RANK)
    return reading.sim.run(), True, False, ()


def _per_stage_max(per_rank, pp: int) -> list[float]:
    per_stage = len(per_rank) // pp
    return [float(max(per_rank[p * per_stage : (p + 1) * per_stage])) for p in range(pp)]
