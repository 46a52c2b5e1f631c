"""A pipeline step of many micro-batches at the cost of a few: its figures are affine in the micro-batch count.

With identical micro-batches (uniform routing, no expert migration) and deterministic costs, a pipeline schedule's
timing is a max-plus linear recurrence. Past the pipeline's fill, every further `c` micro-batches (the schedule's
granularity: 1 for 1F1B, pp for interleaved 1F1B) add the same time to the step and the same amounts to every total a
report is made of (busy and idle time, FLOPs, bytes on each link, all-to-all calls, the busiest rank's budget terms),
while the fill, the drain and the gradient reduction after it keep their shape. So the run is simulated at short counts
M1, M1 + c, M1 + 2c, ... (M1 the smallest valid count from pp on; c = PERIOD where the schedule takes such counts and
they leave room for their check: a contended plan can repeat every two micro-batches); as soon as three in a row have
every such total on one line (within TOLERANCE of the total's size), one more run at about twice the last count checks
the line (a contended plan's step can stay on a line for a few counts and then step off it), and where it holds the
figures of the configured count M are the affine extrapolation (Report.extrapolation "exact").

A contended plan's step settles on its line while the split of its waiting between idle time and exposed communication
keeps drifting for many micro-batches (collectives and transfers sharing links change their order). Where the totals are
not on one line but the counted ones are (FLOPs, calls, bytes, memory: COUNTED) and the step is within NEAR_TOLERANCE of
the makespan of the line through the two runs before the last, at the short runs and at the check (near_affine), the
figures are extrapolated on the line through the last short run and the check ("near"): the step as checked, the shares
of the step (compute, idle and exposed time, the busiest rank's budget terms, the all-to-alls' bandwidths) from the
slope of that last span, so they are approximate (docs/performance.md gives the error measured against full runs). Where
no three do within SAVING of M's micro-batches (a fill longer than the counts tried, a regime of a longer period; the
short runs stop at the first count whose line could not be checked within SAVING), where the check fails, where the
schedule is not one of STEADY_SCHEDULES, where micro-batches differ (skewed routing, migration), or where the full run
is quick anyway (FULL_WALL_S), M is simulated in full. What comes back either way is a Report (its
microbatches_simulated says which counts ran) and the busiest rank's error budget; a trace comes only from a full run
(`simulate`). tests/sim/test_steady_state.py holds the extrapolated figures to full runs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from piper_sim.analysis.links import with_utilization
from piper_sim.analysis.run_report import Report, busiest_link_row, mfu_over_peak
from piper_sim.analysis.task_arrays import TaskArrays
from piper_sim.config import Config, with_overrides
from piper_sim.errors import ConfigError
from piper_sim.machine import Machine, build_machine
from piper_sim.result import RunResult, steps_frame
from piper_sim.schedule.build import build_schedule
from piper_sim.schedule.ir import Schedule
from piper_sim.simulator import check_wall, simulate
from piper_sim.trace.runtrace import empty_trace
from piper_sim.workload.memory import headroom_bytes

TOLERANCE = 1e-7  # a second difference this small against the quantity's size is zero (float sums of ~1e6 tasks)
# a contended plan's step: off the line of its last runs by at most this share of the makespan (near_affine)
NEAR_TOLERANCE = 1e-4
# the totals that count work (FLOPs, calls, bytes, memory) and the step's: every other total (compute, idle and
# exposed time, the busiest rank's budget terms, the all-to-alls' bandwidths) shares the step out between its parts
COUNTED = ("model_flops", "hardware_flops", "a2a_calls", "peak:", "first_peak:", "link:")
STEPS = ("makespan_s", "duration_s", "step:")
FULL_WALL_S = 5.0  # a run expected to simulate in less (run_wall.py) is simulated in full: short runs cost setup each
SAVING = 0.7  # the short runs simulate at most this share of the configured count's micro-batches, together
# the schedules whose programs are a fill, one repeating pattern with a bounded number of micro-batches in flight, and
# a drain, each with the multiple of pp from which every stage's program has that pattern (interleaved 1F1B's fill
# holds (vpp - 1) pp + 2 (pp - 1) micro-batch chunks: at M = pp it is all fill and drain). GPipe holds every
# micro-batch in flight, so its peaks and queues grow with M; DualPipe's two directions pair differently as M grows:
# the others are simulated in full.
STEADY_SCHEDULES = {"1f1b": 1, "zb-h1": 1, "interleaved-1f1b": 2}
# the short runs step by 2 micro-batches where the schedule takes them: a contended 1F1B plan can settle into a regime
# of period 2, each pair of micro-batches adding the same time where single ones alternate (the 1.7T model's PP 32
# plan on 1,024 Frontier GCDs with TP 2 and HALO all-to-alls: 0.10248 and 0.10384 s); a line of period 1 is one of 2
PERIOD = 2


@dataclass(frozen=True)
class SteadyRun:
    """A config's figures: report (Report.microbatches_simulated says which counts ran), the busiest rank's error
    budget per step (analysis/budget.py; with "rank" and "step_s"), the links table at the configured count
    (analysis/links.py), and the last run simulated (the full run, or the last short run: its machine and stats)."""

    report: Report
    budget: dict[str, float]
    links: pd.DataFrame | None
    last: RunResult

    def result(self, cfg: Config, schedule: Schedule) -> RunResult:
        """The figures as the configured run's RunResult (schedule: its lowered schedule), for the files of
        `simulate --outputs report`; extrapolated figures come without trace rows (a trace needs the full run)."""
        if self.last.config.parallel.num_microbatches == cfg.parallel.num_microbatches:
            return replace(self.last, report=self.report)
        return replace(
            self.last,
            config=cfg,
            schedule=schedule,
            report=self.report,
            tasks=empty_trace(),
            steps=steps_frame(self.report),
            links=self.links,
        )


def simulate_figures(
    cfg: Config,
    *,
    machine: Machine | None = None,
    progress: bool = False,
    max_wall_minutes: float | None = None,
    short: ShortRuns | None = None,
) -> SteadyRun:
    """The config's figures, extrapolated from short runs where the step is affine in the micro-batch count (module
    docstring), else from one full run (refused past max_wall_minutes: simulator.simulate). machine: the config's
    (built when None); progress: each run's progress line (simulator.simulate); short: short_runs(cfg), where the
    caller has it already."""
    t0 = time.perf_counter()
    short = short or short_runs(cfg)
    machine = machine or build_machine(cfg)
    if short.taken:
        runs: list[RunResult] = []
        sums: list[dict[str, float]] = []
        for count in short.ladder:
            if len(runs) >= 3 and _check_count(cfg, short.ladder[: len(runs) + 1], short.step) is None:
                break  # a line through this count could not be checked within SAVING: no use running it
            built = short.built(count)
            if built is None:
                break
            runs.append(simulate(*built, machine=machine, progress=progress))
            if len(runs) == 1:
                rank = _arrays(runs[0]).busiest_rank()  # one rank's budget in every run
            sums.append(totals(runs[-1], rank, machine))
            counts = short.ladder[: len(runs)]
            if len(runs) < 3 or (
                affine(sums[-3:], counts[-3:], count) is None and near_affine(sums[-3:], counts[-3:], count) is None
            ):
                continue
            check = _check_count(cfg, counts, short.step)  # on a line: a count twice as far checks it
            built = None if check is None else short.built(check)
            if built is None:
                break
            runs.append(simulate(*built, machine=machine, progress=progress))
            sums.append(totals(runs[-1], rank, machine))
            lined, target = [*counts[-3:], check], cfg.parallel.num_microbatches
            at, kind = affine(sums[-4:], lined, target), "exact"
            if at is None:
                at, kind = near_affine(sums[-4:], lined, target), "near"
            if at is None:
                break
            wall_s = time.perf_counter() - t0
            return extrapolated(cfg, at, runs[-1], rank, machine, [*counts, check], wall_s, kind)
    result = simulate(cfg, machine=machine, progress=progress, max_wall_minutes=max_wall_minutes)
    report = replace(result.report, microbatches_simulated=[cfg.parallel.num_microbatches])
    return SteadyRun(report, _arrays(result).budget(), result.links, result)


class ShortRuns:
    """The short runs simulate_figures would take for a config: the counts to try (ladder, steps of `step`), the
    count checking the first three's line, and each count's config and schedule, built once. taken: whether it
    takes them (a ladder of three with room for the check, and a full run expected past FULL_WALL_S); counts and
    wall_s: what it then simulates first and the wall that is expected to take (run_wall.py)."""

    def __init__(self, cfg: Config) -> None:
        self._cfg = cfg
        self._built: dict[int, tuple[Config, Schedule] | None] = {}
        self.ladder = self._ladder()
        self.step = self.ladder[1] - self.ladder[0] if len(self.ladder) > 1 else 1
        self.check = _check_count(cfg, self.ladder[:3], self.step) if self.ladder else None
        first = self.built(self.ladder[0]) if self.check is not None else None
        self.per_microbatch_s = check_wall(*first, None).wall_s / self.ladder[0] if first is not None else 0.0
        self.taken = first is not None and self.per_microbatch_s * cfg.parallel.num_microbatches >= FULL_WALL_S
        self.counts = [*self.ladder[:3], self.check] if self.taken and self.check is not None else []
        self.wall_s = self.per_microbatch_s * sum(self.counts)

    def built(self, microbatches: int) -> tuple[Config, Schedule] | None:
        """The config with `microbatches` micro-batches and its schedule; None where the schedule does not take
        that count."""
        if microbatches not in self._built:
            short = with_overrides(self._cfg, [f"parallel.num_microbatches={microbatches}"])
            try:
                self._built[microbatches] = short, build_schedule(short)
            except ConfigError:
                self._built[microbatches] = None
        return self._built[microbatches]

    def _ladder(self) -> list[int]:
        """The short runs' micro-batch counts to try, in order: M1, M1 + c, M1 + 2c, ... (M1 the smallest count
        from the schedule's steady pattern on (STEADY_SCHEDULES) with M - M1 a multiple of c: PERIOD where the
        schedule takes such counts and the first three leave room for their check, else its granularity; the first
        three valid for the schedule), as many as simulate at most SAVING of the configured
        count M in all; none for a schedule outside STEADY_SCHEDULES or where the run's micro-batches differ (skewed
        routing, migration)."""
        cfg = self._cfg
        par = cfg.parallel
        total = par.num_microbatches
        if cfg.schedule not in STEADY_SCHEDULES or not cfg.routing.is_uniform or cfg.migration.active:
            return []
        first = STEADY_SCHEDULES[cfg.schedule] * par.pp
        # PERIOD first where its check has room, then the smallest step the schedule takes
        for attempt, step in enumerate((PERIOD, *sorted({1, 2, par.pp, 2 * par.pp}))):
            counts = list(range(first + (total - first) % step, total, step))
            while counts and sum(counts) > SAVING * total:
                counts.pop()
            if len(counts) < 3 or any(self.built(m) is None for m in counts[:3]):
                continue
            if attempt == 0 and _check_count(cfg, counts[:3], step) is None:
                continue
            return counts
        return []


def short_runs(cfg: Config) -> ShortRuns:
    """The short runs simulate_figures would take for cfg (ShortRuns)."""
    return ShortRuns(cfg)


def expected_wall_s(cfg: Config) -> float:
    """simulate_figures' expected wall seconds on this machine (run_wall.py): its short runs where it takes them,
    else the full run."""
    short = short_runs(cfg)
    return short.wall_s if short.taken else check_wall(cfg, build_schedule(cfg), None).wall_s


def totals(result: RunResult, rank: int, machine: Machine) -> dict[str, float]:
    """What a run's figures are made of, each a sum over its tasks, links or steps (affine in the micro-batch
    count in the steady state): the step ends, the busy, idle and exposed times the fractions are shares of,
    FLOPs, all-to-all calls and their bandwidths, per-stage memory peaks, per-link bytes, the rank's budget."""
    r, tasks = result.report, _arrays(result)
    makespan = tasks.last_end_s  # a simulated run starts at 0 and has no warm-up step left out
    calls = tasks.a2a_call_bandwidths
    peak = machine.profile.peak_flops_per_s
    out = {
        "makespan_s": makespan,
        "duration_s": tasks.last_end_s - tasks.first_start_s,
        "model_flops": r.model_flops_per_step,
        "hardware_flops": (r.hfu or r.mfu) * r.step_time_s * r.num_gpus * peak,
        "compute_s": float(r.compute_fraction or 0.0) * makespan,
        "idle_s": float(r.bubble_fraction or 0.0) * makespan,
        "exposed_s": float(r.exposed_comm_fraction or 0.0) * makespan,
        "a2a_calls": float(calls.size),
        "a2a_bandwidth_sum": float(calls.sum()),
    }
    out |= {f"step:{i}": float(s) for i, s in enumerate(r.step_times_s or [])}
    out |= {f"peak:{i}": float(p) for i, p in enumerate(r.peak_memory_bytes)}
    out |= {f"first_peak:{i}": float(p) for i, p in enumerate(r.peak_memory_bytes_first_step or [])}
    if result.links is not None:
        out |= {f"link:{name}": float(b) for name, b in zip(result.links["link"], result.links["bytes"], strict=True)}
    out |= {f"budget:{k}": float(v) for k, v in tasks.budget(rank).items() if k != "rank"}
    return out


def _arrays(result: RunResult) -> TaskArrays:
    """A simulated run's task arrays (a measured run has a frame only)."""
    if not isinstance(result.tasks, TaskArrays):
        raise TypeError("steady-state figures need a simulated run's task arrays")
    return result.tasks


def affine(samples: list[dict[str, float]], counts: list[int], target: int) -> dict[str, float] | None:
    """Every quantity at `target` on the line through its values at the first and third of `counts` (three equally
    spaced, then any further ones), or None where a value is off that line by more than TOLERANCE of the quantity's
    size. A quantity a run lacks (a link it did not use) is 0."""
    names, values = _matrix(samples)
    line, slope = _line(values, np.array(counts, dtype=float)[:, None], 0, 2)
    if np.any(np.abs(values - line) > TOLERANCE * np.maximum(np.abs(values).max(axis=0), 1e-12)):
        return None
    return dict(zip(names, (values[0] + slope * (target - counts[0])).tolist(), strict=True))


def near_affine(samples: list[dict[str, float]], counts: list[int], target: int) -> dict[str, float] | None:
    """A contended plan's figures at `target` (module docstring) from three short runs, or three and the check:
    None unless the counted totals (COUNTED) are on one line within TOLERANCE (affine's test) and the step's totals
    (STEPS) within NEAR_TOLERANCE of each run's makespan of the line through the two runs before the last; every
    total on the line through the last two runs."""
    names, values = _matrix(samples)
    at = np.array(counts, dtype=float)[:, None]
    counted = np.array([n.startswith(COUNTED) for n in names])
    steps = np.array([n.startswith(STEPS) for n in names])
    size = np.maximum(np.abs(values).max(axis=0), 1e-12)
    if np.any(np.abs(values - _line(values, at, 0, 2)[0])[:, counted] > TOLERANCE * size[counted]):
        return None
    makespan = values[:, names.index("makespan_s")][:, None]
    if np.any(np.abs(values - _line(values, at, -3, -2)[0])[:, steps] > NEAR_TOLERANCE * makespan):
        return None
    _, slope = _line(values, at, -2, -1)
    return dict(zip(names, (values[-1] + slope * (target - counts[-1])).tolist(), strict=True))


def _matrix(samples: list[dict[str, float]]) -> tuple[list[str], np.ndarray]:
    """The runs' totals as one row per run, a column per name (a total a run lacks, a link it did not use, is 0)."""
    names = sorted(set().union(*samples))
    return names, np.array([[s.get(n, 0.0) for n in names] for s in samples])


def _line(values: np.ndarray, at: np.ndarray, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
    """Every column's line through rows a and b, at each row's count `at` (a column), and its slope."""
    slope = (values[b] - values[a]) / (at[b] - at[a])
    return values[a] + slope * (at - at[a]), slope


def _check_count(cfg: Config, counts: list[int], step: int) -> int | None:
    """The count that checks a line found at counts[-3:]: the first of the schedule's granularity from twice the
    last on; None where it is not below the configured count or would take the short runs past SAVING of it."""
    total = cfg.parallel.num_microbatches
    check = counts[-1] + step * -(-counts[-1] // step)
    if check >= total or sum(counts) + check > SAVING * total:
        return None
    return check


def extrapolated(
    cfg: Config,
    at: dict[str, float],
    last: RunResult,
    rank: int,
    machine: Machine,
    simulated: list[int],
    wall_s: float,
    kind: str = "exact",
) -> SteadyRun:
    """The configured count's figures from its totals `at` (affine, or near_affine: kind "near"); last: a short run
    (the report's form and the links), rank: the budget's, machine: its profile's peaks, simulated: the counts run."""
    r = last.report
    steps = [float(at[f"step:{i}"]) for i in range(len(r.step_times_s or []))]
    step, makespan, gpus = float(np.mean(steps)), at["makespan_s"], r.num_gpus
    peak = machine.profile.peak_flops_per_s
    tokens = cfg.parallel.sequences_per_step * cfg.model.seq_len
    peaks = [at[f"peak:{i}"] for i in range(len(r.peak_memory_bytes))]
    headroom = headroom_bytes(peaks, r.hbm_bytes or 0.0, r.framework_reserve_bytes or 0.0)
    links = _links(last.links, at)
    fp8_peak = None if r.mfu_fp8_peak is None else machine.profile.peak_fp8_flops_per_s
    report = replace(
        r,
        step_time_s=step,
        step_times_s=steps,
        tokens_per_step=tokens,
        tokens_per_s=tokens / step,
        model_flops_per_step=at["model_flops"],
        tflops_per_gpu=at["model_flops"] / step / gpus / 1e12,
        mfu=at["model_flops"] / (step * gpus * peak),
        mfu_fp8_peak=mfu_over_peak(at["model_flops"], step, gpus, fp8_peak),
        hfu=None if r.hfu is None else at["hardware_flops"] / (step * gpus * peak),
        compute_fraction=at["compute_s"] / makespan,
        bubble_fraction=at["idle_s"] / makespan,
        exposed_comm_fraction=at["exposed_s"] / makespan,
        peak_memory_bytes=peaks,
        peak_memory_bytes_first_step=[at[f"first_peak:{i}"] for i in range(len(r.peak_memory_bytes_first_step or []))]
        or r.peak_memory_bytes_first_step,
        memory_headroom_bytes=headroom,
        fits_memory=[h >= 0 for h in headroom],
        all_to_all_bandwidth_bytes_per_s=at["a2a_bandwidth_sum"] / at["a2a_calls"] if at["a2a_calls"] >= 1 else 0.0,
        busiest_link=busiest_link_row(links),
        sim_wall_s=wall_s,
        microbatches_simulated=simulated,
        extrapolation=kind,
    )
    budget = {"rank": rank, **{k.removeprefix("budget:"): v for k, v in at.items() if k.startswith("budget:")}}
    return SteadyRun(report, budget, links, last)


def _links(table: pd.DataFrame | None, at: dict[str, float]) -> pd.DataFrame | None:
    """The links table at the configured count: each link's bytes extrapolated, its utilization over the
    extrapolated run's duration; busiest first."""
    if table is None:
        return None
    return with_utilization(table.assign(bytes=[at.get(f"link:{n}", 0.0) for n in table["link"]]), at["duration_s"])
