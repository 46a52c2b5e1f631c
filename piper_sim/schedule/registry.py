"""Registry of schedule generators: name -> pure function (pp, vpp, num_microbatches) -> stage programs."""

from __future__ import annotations

from collections.abc import Callable

from piper_sim.registry import Registry
from piper_sim.schedule.ir import Task

# A generator returns, per pipeline stage, the ordered coarse program: Tasks of kind forward,
# backward (or backward_input + backward_weight for zero-bubble schedules), with ids from
# coarse_task_id and same-rank deps only (B after its F, W after its B).
Generator = Callable[[int, int, int], tuple[tuple[Task, ...], ...]]

SCHEDULES: Registry[Generator] = Registry("schedule")
register_schedule = SCHEDULES.register
