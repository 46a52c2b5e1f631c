"""Chrome/Perfetto trace JSON from a RunTrace: pid = rank, tid = stream, times in microseconds.

Written as a stream: CHUNK_ROWS rows are turned into events and encoded at a time (the C encoder of json.dumps),
so memory stays that of one chunk whatever the trace's size, and a caller can count the rows written.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pandas as pd

STREAM_TID = {"compute": 0, "p2p": 1, "collective": 2}
MAX_EVENTS = 2_000_000
CHUNK_ROWS = 10_000  # rows encoded at once: about 2.6 kB each in flight (their dicts and JSON), 26 MB


def perfetto_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The rows write_perfetto writes: all of them, or the first step's where there are more than MAX_EVENTS."""
    return df[df["step"] == df["step"].min()] if len(df) > MAX_EVENTS else df


def first_step_rows(df: pd.DataFrame) -> int:
    """How many rows the trace's first step has."""
    return int((df["step"] == df["step"].min()).sum()) if len(df) else 0


def perfetto_row_count(df: pd.DataFrame) -> int:
    """len(perfetto_rows(df)), without copying them."""
    return first_step_rows(df) if len(df) > MAX_EVENTS else len(df)


def write_perfetto(df: pd.DataFrame, path: Path, on_rows: Callable[[int], None] | None = None,
                   chunk_rows: int = CHUNK_ROWS) -> int:
    """Write complete ('X') events of perfetto_rows(df), chunk_rows at a time; on_rows(n) after each chunk of n
    rows. Returns how many events (metadata included)."""
    df = perfetto_rows(df)
    ranks = sorted(df["rank"].unique().tolist())
    meta: list[dict] = []
    for rank in ranks:
        meta.append({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}"}})
        for stream, tid in STREAM_TID.items():
            meta.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": stream}})
    written = 0
    with open(path, "w") as fh:
        fh.write('{"traceEvents": [')
        for events in _chunks(df, meta, chunk_rows, on_rows):
            if events:
                fh.write((", " if written else "") + json.dumps(events)[1:-1])
                written += len(events)
        fh.write('], "displayTimeUnit": "ms"}')
    return written


def _chunks(df: pd.DataFrame, meta: list[dict], chunk_rows: int, on_rows: Callable[[int], None] | None):
    """The metadata events, then the 'X' events of each chunk of chunk_rows rows."""
    yield meta
    for first in range(0, len(df), chunk_rows):
        part = df.iloc[first:first + chunk_rows]
        yield _events(part)
        if on_rows is not None:
            on_rows(len(part))


def _events(df: pd.DataFrame) -> list[dict]:
    """One complete ('X') event per row."""
    ts = (df["start_s"] * 1e6).round(3).tolist()
    dur = ((df["end_s"] - df["start_s"]) * 1e6).round(3).tolist()
    tid = df["stream"].map(STREAM_TID).astype(int).tolist()
    columns = [df[c].tolist() for c in ("rank", "task_id", "kind", "step", "bytes", "flops", "peers")]
    return [{"ph": "X", "pid": int(rank), "tid": t, "ts": start, "dur": d, "name": name, "cat": kind,
             "args": {"step": int(step), "bytes": nbytes, "flops": flops, "peers": peers}}
            for start, d, t, (rank, name, kind, step, nbytes, flops, peers)
            in zip(ts, dur, tid, zip(*columns, strict=True), strict=True)]
