"""TaskArrays: a simulated run's tasks as the engine records them, and the report's figures taken from them.

Owns TaskArrays: per stage arrays [step, rank within stage, task index] of each task's start, end, FLOPs, bytes and
host work with the schedule they ran. The figures a report, the steady-state totals and an error budget need (step
ends, FLOPs, each rank's busy time, the all-to-all calls, one rank's rows) are computed from the arrays, per stage,
without the RunTrace frame; the frame (one row per task, piper_sim.trace.runtrace) is built on the first ask only
(`frame`), for the outputs and analyses that read rows. Every figure equals the one the same function of the frame
gives (tests/analysis/test_task_arrays.py). Must not import simpy or torch.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property

import numpy as np
import pandas as pd

from piper_sim.analysis.budget import rank_budget
from piper_sim.analysis.run_report import TraceFigures
from piper_sim.schedule.ir import Schedule, Task
from piper_sim.trace.runtrace import TIMED, group_codes, trace_from_arrays
from piper_sim.workload.task_kinds import RECOMPUTE_KINDS, Stream, TaskKind


def union_length_rows(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Length of the union of each row's [start, end) intervals (arrays [rows, intervals])."""
    if start.shape[1] == 0:
        return np.zeros(start.shape[0])
    order = np.argsort(start, axis=1, kind="stable")  # a rank's tasks in program order: nearly sorted already
    start, end = np.take_along_axis(start, order, axis=1), np.take_along_axis(end, order, axis=1)
    reach = np.maximum.accumulate(end, axis=1)
    prev = np.concatenate([np.full((start.shape[0], 1), -np.inf), reach[:, :-1]], axis=1)
    return np.clip(end - np.maximum(start, prev), 0, None).sum(axis=1)


class TaskArrays:
    """A simulated run's tasks: per stage arrays [step, rank within stage, task index] (stage p's ranks are
    p x ranks per stage onward, its tasks the schedule's stage program in order)."""

    def __init__(
        self,
        schedule: Schedule,
        start_s: list[np.ndarray],
        end_s: list[np.ndarray],
        flops: list[np.ndarray],
        nbytes: list[np.ndarray],
        cpu_s: list[np.ndarray],
    ) -> None:
        self.schedule = schedule
        self.start_s, self.end_s, self.flops, self.bytes, self.cpu_s = start_s, end_s, flops, nbytes, cpu_s
        self.per_stage = schedule.mesh.num_ranks // schedule.mesh.pp
        self.num_steps = start_s[0].shape[0] if start_s else 0

    @cached_property
    def frame(self) -> pd.DataFrame:
        """The RunTrace frame: one row per task (built once, on the first ask)."""
        columns = dict(zip(TIMED, (self.start_s, self.end_s, self.bytes, self.flops, self.cpu_s), strict=True))
        return trace_from_arrays(self.schedule, columns)

    @property
    def num_rows(self) -> int:
        return sum(a.size for a in self.start_s)

    def _mask(self, stage: int, pick: Callable[[Task], bool]) -> np.ndarray:
        return np.array([bool(pick(t)) for t in self.schedule.stage_programs[stage]], dtype=bool)

    @cached_property
    def first_start_s(self) -> float:
        return min(float(np.nanmin(a)) for a in self.start_s)

    @cached_property
    def last_end_s(self) -> float:
        return max(float(np.nanmax(a)) for a in self.end_s)

    def step_ends_s(self) -> np.ndarray:
        """Each step's last task end."""
        return np.nanmax(np.stack([np.nanmax(a, axis=(1, 2)) for a in self.end_s]), axis=0)

    def seconds_of(self, pick: Callable[[Task], bool]) -> float:
        """Total duration of the tasks pick(task) chooses, over every rank and step."""
        return float(
            sum(
                np.nansum(e[:, :, m] - s[:, :, m])
                for p, (s, e) in enumerate(zip(self.start_s, self.end_s, strict=True))
                if (m := self._mask(p, pick)).any()
            )
        )

    def compute_s_by_rank(self) -> np.ndarray:
        """Each rank's summed compute-stream task durations."""
        out = []
        for p, (s, e) in enumerate(zip(self.start_s, self.end_s, strict=True)):
            m = self._mask(p, lambda t: t.stream == Stream.COMPUTE)
            out.append(np.nansum(e[:, :, m] - s[:, :, m], axis=(0, 2)))
        return np.concatenate(out)

    def busiest_rank(self) -> int:
        """The rank with the most compute (ties: the lowest), as analysis.budget.busiest_rank picks on the frame."""
        busy = self.compute_s_by_rank()
        return int(np.flatnonzero(busy == busy.max())[0])

    def rank_rows(self, rank: int) -> pd.DataFrame:
        """One rank's tasks, every step, with the columns an error budget reads (kind, role, stream, start_s,
        end_s; analysis.budget.rank_budget)."""
        stage, local = divmod(rank, self.per_stage)
        program = self.schedule.stage_programs[stage]
        steps = self.num_steps
        return pd.DataFrame(
            {
                "kind": [t.kind.value for t in program] * steps,
                "role": [t.role.value for t in program] * steps,
                "stream": [t.stream.value for t in program] * steps,
                "start_s": self.start_s[stage][:, local, :].reshape(-1).astype(float),
                "end_s": self.end_s[stage][:, local, :].reshape(-1).astype(float),
            }
        )

    def budget(self, rank: int | None = None) -> dict[str, float]:
        """One rank's error budget (analysis.budget.trace_budget of the frame): the busiest rank unless given."""
        rank = self.busiest_rank() if rank is None else rank
        return rank_budget(self.rank_rows(rank), rank, self.num_steps, self.first_start_s, self.last_end_s)

    @cached_property
    def a2a_call_bandwidths(self) -> np.ndarray:
        """analysis.run_report.a2a_call_bandwidths of the frame: per all-to-all call of a positive duration, the
        mean bytes a member sends over the call's duration from the last member's arrival to its end (found once:
        the report and the steady-state totals both read it)."""
        out = []
        for p in range(len(self.start_s)):
            cols = np.flatnonzero(self._mask(p, lambda t: t.kind == TaskKind.ALL_TO_ALL))
            if not cols.size:
                continue
            codes = group_codes(self.schedule, p, cols)  # [rank, call task]: its group
            _, group = np.unique(codes * cols.size + np.arange(cols.size), return_inverse=True)
            group = group.reshape(codes.shape)
            num = int(group.max()) + 1
            steps = self.num_steps
            key = (np.arange(steps)[:, None, None] * num + group[None]).reshape(-1)
            start = self.start_s[p][:, :, cols].reshape(-1)
            end = self.end_s[p][:, :, cols].reshape(-1)
            sent = self.bytes[p][:, :, cols].reshape(-1)
            last = np.full(steps * num, -np.inf)
            ends = np.full(steps * num, -np.inf)
            np.maximum.at(last, key, start)
            np.maximum.at(ends, key, end)
            mean = np.bincount(key, weights=sent, minlength=steps * num) / np.bincount(key, minlength=steps * num)
            duration = ends - last
            ok = duration > 0
            out.append(mean[ok] / duration[ok])
        return np.concatenate(out) if out else np.zeros(0)

    def figures(self) -> TraceFigures:
        """The figures make_report takes from a frame, here from the arrays (every step; none left out)."""
        steps = np.diff(np.concatenate(([0.0], self.step_ends_s()))).tolist()
        busy_compute, busy_any, flops, recompute = [], [], 0.0, 0.0
        for p, (s, e, f) in enumerate(zip(self.start_s, self.end_s, self.flops, strict=True)):
            compute = self._mask(p, lambda t: t.stream == Stream.COMPUTE)
            again = self._mask(p, lambda t: t.kind in RECOMPUTE_KINDS)
            flops += float(np.nansum(f))
            recompute += float(np.nansum(f[:, :, again]))
            busy_compute.append(union_length_rows(*(_by_rank(x[:, :, compute]) for x in (s, e))))
            busy_any.append(union_length_rows(*(_by_rank(x) for x in (s, e))))
        return TraceFigures(
            step_times_s=steps,
            begin_s=0.0,
            end_s=self.last_end_s,
            hardware_flops=flops,
            recompute_flops=recompute,
            busy_compute_s=np.concatenate(busy_compute),
            busy_any_s=np.concatenate(busy_any),
            a2a_call_bandwidths=self.a2a_call_bandwidths,
        )


def _by_rank(x: np.ndarray) -> np.ndarray:
    """[step, rank, task] -> [rank, step x task]."""
    return x.transpose(1, 0, 2).reshape(x.shape[1], -1)
