"""RunTrace: one row per executed task, the same schema for simulated and measured runs.

Owns the schema, building it from the simulator's arrays, and CSV/Parquet I/O. A task's global
id is "r<rank>:<task_id>"; a comparison joins on (step, rank, task_id).
Columns: step, rank, task_id, kind, stream, microbatch, chunk, layer, role, peers, start_s,
end_s, bytes, flops, cpu_s. peers: the other rank of a send/recv, or "<axis>:<first rank>+<size>" for a
collective's group. Times in seconds from the start of the run. cpu_s: CPU seconds of a blocking task --
on a real run, what the rank's main thread used during it; on a simulated one, the work priced for it
on one core with nothing sharing it (a collective: its host work); NaN for send/recv and for traces
written before the column existed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from piper_sim.errors import PiperError
from piper_sim.schedule.ir import Schedule
from piper_sim.workload.mesh import GROUP_AXES
from piper_sim.workload.task_kinds import P2P_KINDS

COLUMNS = (
    "step",
    "rank",
    "task_id",
    "kind",
    "stream",
    "microbatch",
    "chunk",
    "layer",
    "role",
    "peers",
    "start_s",
    "end_s",
    "bytes",
    "flops",
    "cpu_s",
)
CATEGORICAL = ("task_id", "kind", "stream", "role", "peers")
ROW_GROUP_ROWS = 131_072  # rows of a Parquet row group (and of a CSV chunk): about 6 MB of this schema in flight


AXES = GROUP_AXES


def peer_codes(schedule: Schedule, stage: int) -> tuple[np.ndarray, list[str]]:
    """Codes [rank within stage, task] into the peer label categories, without a per-row Python loop.

    Categories: "" (0), then each rank's number (1 + rank), then "<axis>:<first>+<size>" per axis
    and first rank of a group (1 + N + axis_index * N + first); a group's ranks need not be consecutive.
    """
    mesh = schedule.mesh
    n_ranks = mesh.num_ranks
    ranks = np.array(mesh.stage_ranks(stage))
    program = schedule.stage_programs[stage]
    size = {axis: len(mesh.group(0, axis)) for axis in AXES}
    codes = np.zeros((ranks.size, len(program)), dtype=np.int64)
    collectives = [i for i, task in enumerate(program) if task.is_collective]
    codes[:, collectives] = group_codes(schedule, stage, collectives)
    for i, task in enumerate(program):
        if task.kind in P2P_KINDS:
            codes[:, i] = 1 + ranks + (task.peer_stage - stage) * (n_ranks // mesh.pp)
    categories = (
        [""] + [str(r) for r in range(n_ranks)] + [f"{axis}:{f}+{size[axis]}" for axis in AXES for f in range(n_ranks)]
    )
    return codes, categories


def group_codes(schedule: Schedule, stage: int, columns: Sequence[int] | np.ndarray) -> np.ndarray:
    """peer_codes of the collective tasks at `columns` of the stage's program: [rank within stage, column], each
    naming the task's group (1 + N + axis_index * N + the group's first rank)."""
    mesh = schedule.mesh
    ranks = mesh.stage_ranks(stage)
    program = schedule.stage_programs[stage]
    axes = [program[i].group_axis for i in columns]
    if not axes:
        return np.zeros((len(ranks), 0), dtype=np.int64)
    first = {axis: np.array([mesh.group(int(r), axis)[0] for r in ranks]) for axis in set(axes)}
    base = np.array([1 + mesh.num_ranks * (1 + AXES.index(axis)) for axis in axes], dtype=np.int64)
    return base[None, :] + np.stack([first[axis] for axis in axes], axis=1)


def _categorical(values_by_stage: list[list[str]], reps: list[int]) -> pd.Categorical:
    """One categorical column from each stage's per-task labels, tiled reps[p] times: codes into the sorted
    labels of every stage (the categories normalize gives), without a string per row."""
    categories = sorted({v for values in values_by_stage for v in values})
    index = {v: i for i, v in enumerate(categories)}
    codes = np.concatenate(
        [
            np.tile(np.array([index[v] for v in values], dtype=np.int64), r)
            for values, r in zip(values_by_stage, reps, strict=True)
        ]
    )
    return pd.Categorical.from_codes(codes, categories=pd.Index(categories, dtype=str))


TIMED = ("start_s", "end_s", "bytes", "flops", "cpu_s")  # the columns a simulated run records per task


def trace_from_arrays(schedule: Schedule, arrays: dict[str, list[np.ndarray]]) -> pd.DataFrame:
    """Build the trace from per-stage arrays indexed [step, rank within stage, task index], one list per TIMED
    column."""
    start_s = arrays["start_s"]
    mesh = schedule.mesh
    per_stage = mesh.num_ranks // mesh.pp
    programs = schedule.stage_programs
    shapes = [start_s[p].shape for p in range(len(programs))]  # (steps, ranks, tasks)
    reps = [steps * ranks for steps, ranks, _ in shapes]

    def per_task(attr) -> np.ndarray:
        return np.concatenate(
            [
                np.tile(np.array([attr(t) for t in program], dtype=np.int64), r)
                for program, r in zip(programs, reps, strict=True)
            ]
        )

    columns: dict[str, object] = {
        "step": np.concatenate([np.repeat(np.arange(steps), ranks * n) for steps, ranks, n in shapes]),
        "rank": np.concatenate(
            [
                p * per_stage + np.tile(np.repeat(np.arange(ranks), n), steps)
                for p, (steps, ranks, n) in enumerate(shapes)
            ]
        ),
        "task_id": _categorical([[t.task_id for t in program] for program in programs], reps),
        "kind": _categorical([[t.kind.value for t in program] for program in programs], reps),
        "stream": _categorical([[t.stream.value for t in program] for program in programs], reps),
        "microbatch": per_task(lambda t: t.microbatch),
        "chunk": per_task(lambda t: t.chunk),
        "layer": per_task(lambda t: t.layer),
        "role": _categorical([[t.role.value for t in program] for program in programs], reps),
    }
    peers = [peer_codes(schedule, p) for p in range(len(programs))]
    labels = sorted({categories[c] for codes, categories in peers for c in np.unique(codes).tolist()})
    where = {c: i for i, c in enumerate(labels)}
    columns["peers"] = pd.Categorical.from_codes(
        np.concatenate(
            [
                np.tile(np.array([where.get(c, -1) for c in categories])[codes.reshape(-1)], steps)
                for (codes, categories), (steps, _, _) in zip(peers, shapes, strict=True)
            ]
        ),
        categories=pd.Index(labels, dtype=str),
    )
    for name in TIMED:
        columns[name] = np.concatenate([a.reshape(-1) for a in arrays[name]]).astype(float)
    return pd.DataFrame(columns, copy=False)  # the new arrays as they are: no second copy of a large run's trace


def empty_trace() -> pd.DataFrame:
    """A trace of no rows, in the schema's columns and dtypes."""
    return normalize(pd.DataFrame({c: [] for c in COLUMNS}))


def normalize(df: pd.DataFrame) -> pd.DataFrame:
    """Column order and dtypes of the schema; sorted by (step, rank, start)."""
    if "cpu_s" not in df.columns:  # a trace written before the column existed
        df = df.assign(cpu_s=np.nan)
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise PiperError(f"trace is missing columns {missing}; the schema is {list(COLUMNS)}")
    df = df[list(COLUMNS)].copy()
    for col in ("step", "rank", "microbatch", "chunk", "layer"):
        df[col] = df[col].astype(np.int64)
    for col in TIMED:
        df[col] = df[col].astype(float)
    for col in CATEGORICAL:
        df[col] = df[col].astype(str).astype("category")
    return df


def trace_file(out_dir: Path, fmt: str = "parquet") -> Path:
    """The file write_trace writes: trace.parquet, or trace.csv (asked for, or pyarrow missing)."""
    if fmt == "parquet":
        try:  # pyarrow: optional (the parquet extra); without it the trace is CSV
            import pyarrow  # noqa: F401
        except ImportError:
            fmt = "csv"
    return out_dir / f"trace.{fmt}"


def write_trace(
    df: pd.DataFrame,
    out_dir: Path,
    fmt: str = "parquet",
    *,
    row_group_rows: int = ROW_GROUP_ROWS,
    on_rows: Callable[[int], None] | None = None,
) -> Path:
    """Write the trace to trace_file(out_dir, fmt): Parquet in row groups of row_group_rows rows, each converted
    and written in turn (the whole table is never held twice), or CSV in chunks of as many rows; on_rows(n) after
    each chunk of n rows."""
    path = trace_file(out_dir, fmt)
    chunks = range(0, max(len(df), 1), row_group_rows)
    if path.suffix == ".parquet":
        # pyarrow: optional (the parquet extra); trace_file chose Parquet only where it is installed
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = pa.Schema.from_pandas(df.iloc[:0], preserve_index=False)
        with pq.ParquetWriter(path, schema) as writer:
            for first in chunks:
                part = df.iloc[first : first + row_group_rows]
                writer.write_table(
                    pa.Table.from_pandas(part, schema=schema, preserve_index=False), row_group_size=row_group_rows
                )
                if on_rows is not None:
                    on_rows(len(part))
        return path
    for first in chunks:
        part = df.iloc[first : first + row_group_rows]
        part.to_csv(path, index=False, mode="w" if first == 0 else "a", header=first == 0)
        if on_rows is not None:
            on_rows(len(part))
    return path


def read_trace(run_dir: Path) -> pd.DataFrame:
    for name, reader in (("trace.parquet", pd.read_parquet), ("trace.csv", pd.read_csv)):
        path = Path(run_dir) / name
        if path.exists():
            df = reader(path)
            df["peers"] = df["peers"].fillna("")
            df["role"] = df["role"].fillna("")
            return normalize(df)
    raise PiperError(f"{run_dir}: no trace.parquet or trace.csv (run `piper-sim simulate` or `run` first)")
