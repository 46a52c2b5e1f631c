"""The planner's refinement within a time budget (`plan --budget 3min`): the top plans, in the order of their
estimates, simulated as Dask tasks (or in this process with --workers 0) for as long as the budget allows.

Owns parse_duration (--budget's values) and refine_points. Each plan's wall time is predicted before it starts from
what drives it (run_wall.py: its rank tasks and skewed all-to-all members), scaled by how far the plans finished so
far ran from their own predictions (run_wall does not model contended networks, which can take several times its
estimate). A plan starts when a worker is free and the budget's time left covers its prediction; the first that does
not fit stops the starting (those after it, estimated slower, stay at the estimate tier too), and the plans under
way finish. Every finished plan is stored at once (store.py): an interrupted refinement, rerun, recomputes none.
Must not import torch.
"""

from __future__ import annotations

import math
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from piper_sim.errors import ConfigError
from piper_sim.points.dask_runner import dask_client, workers_limit
from piper_sim.points.keys import KeyedPoint
from piper_sim.points.store import ResultStore
from piper_sim.progress import bar as progress_bar
from piper_sim.run_wall import duration_text

DURATION_UNITS = {"s": 1.0, "min": 60.0, "h": 3600.0}
MAX_BUDGET_S = 7 * 24 * 3600.0  # a week: past any refinement, and short of a typo's years
DURATION_ALLOWED = "a positive duration with its unit, such as 90s, 3min or 1h (s, min or h; at most a week)"
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(s|min|h)\s*$")


def parse_duration(text: str, key: str = "--budget") -> float:
    """Seconds of a duration such as '90s', '3min', '1.5h'; a ConfigError naming key otherwise."""
    match = _DURATION.match(str(text))
    seconds = float(match[1]) * DURATION_UNITS[match[2]] if match else math.nan
    if not 0 < seconds <= MAX_BUDGET_S:
        raise ConfigError(key, text, DURATION_ALLOWED)
    return seconds


@dataclass
class Refinement:
    """What a refinement did: the rows of the points refined (stored before, or run now), the digests it left at
    the estimate tier (not started within the budget), and each point's predicted and measured wall seconds."""

    rows: dict[str, dict] = field(default_factory=dict)
    left: list[str] = field(default_factory=list)
    predicted_s: dict[str, float] = field(default_factory=dict)
    scale: float = 1.0  # measured over predicted wall, of the points run (1 before any)


def refine_points(
    fn: Callable[[dict], dict],
    points: list[KeyedPoint],
    store: ResultStore,
    predict: Callable[[KeyedPoint], float],
    *,
    budget_s: float | None = None,
    scheduler: str | None = None,
    workers: int | None = None,
    label: str = "refining plans",
    progress: bool = True,
    clock: Callable[[], float] = time.perf_counter,
) -> Refinement:
    """fn(payload) -> row for each of points in their order (the best estimate first) that is not stored, as long as
    budget_s (None: no limit) covers its predicted wall (predict(point), scaled by the plans run so far; row's
    'sim_wall_s' is its measured wall); a point stored under its key is reused and costs nothing. workers=0 runs in
    this process, otherwise on Dask (engine.dask_client), one point per free worker."""
    done = Refinement()
    todo = []
    for point in points:
        row = store.get(point.digest, point.key)
        if row is None:
            todo.append(point)
        else:
            done.rows[point.digest] = row
    start = clock()
    line = progress_bar(len(todo), label, "plans", show=progress and bool(todo))

    def admit(point: KeyedPoint) -> bool:
        """Whether point starts now: the budget's time left covers its scaled prediction (no budget: always)."""
        if budget_s is None:
            return True
        done.predicted_s[point.digest] = predict(point)
        return clock() - start + done.predicted_s[point.digest] * done.scale <= budget_s

    def finish(point: KeyedPoint, row: dict) -> None:
        store.put(point.digest, point.key, row)
        done.rows[point.digest] = row
        measured = [(done.rows[d].get("sim_wall_s"), p) for d, p in done.predicted_s.items() if d in done.rows]
        pairs = [(m, p) for m, p in measured if m and p]
        done.scale = sum(m for m, _ in pairs) / sum(p for _, p in pairs) if pairs else 1.0
        line.update(1)
        if budget_s is not None:
            line.set_postfix_str(f"budget {duration_text(budget_s)}, {duration_text(clock() - start)} used")

    queue = list(todo)
    if workers == 0 or not queue:
        while queue and admit(queue[0]):
            point = queue.pop(0)
            finish(point, fn(point.payload))
    else:
        _on_dask(fn, queue, admit, finish, scheduler, workers, label)
    line.close()
    done.left = [p.digest for p in queue]
    if progress:
        _say(done, points, store, clock() - start, label, budget_s)
    return done


def _on_dask(
    fn, queue: list[KeyedPoint], admit, finish, scheduler: str | None, workers: int | None, label: str
) -> None:
    """Start queue's points on Dask while admit(point) says yes and a worker is free; finish each as it ends."""
    from distributed import as_completed  # distributed: heavy; only when points run on Dask

    with dask_client(scheduler, workers) as client:
        slots = len(client.scheduler_info().get("workers", {})) or workers or workers_limit()
        running = as_completed()
        owner: dict[str, KeyedPoint] = {}
        stopped = False

        def fill() -> None:
            nonlocal stopped
            while queue and not stopped and running.count() < slots:
                if not admit(queue[0]):
                    stopped = True
                    return
                point = queue.pop(0)
                future = client.submit(fn, point.payload, key=f"{label}-{point.digest}", pure=False)
                owner[future.key] = point
                running.add(future)

        fill()
        for future in running:
            finish(owner.pop(future.key), future.result())
            fill()


def _say(
    done: Refinement, points: list[KeyedPoint], store: ResultStore, wall_s: float, label: str, budget_s: float | None
) -> None:
    computed = store.tally.computed
    lines = store.tally.lines(label)
    if computed:
        lines[0] += f" in {wall_s:.1f} s"
    if computed and done.predicted_s:
        lines.append(
            f"{label}: measured wall {done.scale:.2f}x the predicted one (run_wall.py) over the {computed} run"
        )
    if done.left:
        why = f"not started within the budget of {duration_text(budget_s)}" if budget_s is not None else "not run"
        lines.append(f"{label}: {len(done.left)} of {len(points)} left at the estimate tier ({why})")
    print("\n".join(lines), file=sys.stderr)
