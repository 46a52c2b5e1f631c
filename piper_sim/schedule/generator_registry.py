"""Registry of schedule generators: name -> pure function (pp, vpp, num_microbatches) -> stage programs.

Owns the schedule names and each one's layout (ir.Layout: which virtual stage each chunk runs). The
shipped generators (generators.py) are plain functions, named here, so the registry is complete as soon
as this module is imported (no import for its side effects). A schedule defined elsewhere registers with
register_schedule. Must not import simpy, torch or numpy.
"""

from __future__ import annotations

from collections.abc import Callable

from piper_sim.registry import Registry
from piper_sim.schedule import generators
from piper_sim.schedule.ir import Layout, Task

# A generator returns, per pipeline stage, the ordered coarse program: Tasks of kind forward,
# backward (or backward_input + backward_weight for zero-bubble schedules), with ids from
# coarse_task_id and same-rank deps only (B after its F, W after its B).
Generator = Callable[[int, int, int], tuple[tuple[Task, ...], ...]]

SCHEDULES: Registry[Generator] = Registry("schedule")
_LAYOUTS: dict[str, Layout] = {}


def register_schedule(name: str, layout: Layout = Layout.INTERLEAVED) -> Callable[[Generator], Generator]:
    """Decorator: register a generator under `name`, its chunks placed by `layout`."""
    add = SCHEDULES.register(name)

    def register(generator: Generator) -> Generator:
        _LAYOUTS[name] = Layout(layout)
        return add(generator)

    return register


def schedule_layout(name: str) -> Layout:
    """The layout of a registered schedule (ConfigError on `schedule` for an unknown name)."""
    SCHEDULES.get(name, "schedule")
    return _LAYOUTS[name]


register_schedule("gpipe")(generators.gpipe)
register_schedule("1f1b")(generators.one_f_one_b)
register_schedule("interleaved-1f1b")(generators.interleaved_one_f_one_b)
register_schedule("zb-h1")(generators.zb_h1)
register_schedule("dualpipe", Layout.BIDIRECTIONAL)(generators.dualpipe)
register_schedule("dualpipe-v", Layout.V)(generators.dualpipe_v)
