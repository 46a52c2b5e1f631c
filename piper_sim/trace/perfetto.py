"""Chrome/Perfetto trace JSON from a RunTrace: pid = rank, tid = stream, times in microseconds."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

STREAM_TID = {"compute": 0, "p2p": 1, "collective": 2}
MAX_EVENTS = 2_000_000


def write_perfetto(df: pd.DataFrame, path: Path) -> int:
    """Write complete ('X') events; returns how many. Very large traces keep the first step only."""
    if len(df) > MAX_EVENTS:
        df = df[df["step"] == df["step"].min()]
    ranks = sorted(df["rank"].unique().tolist())
    events: list[dict] = []
    for rank in ranks:
        events.append({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}"}})
        for stream, tid in STREAM_TID.items():
            events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": stream}})
    ts = (df["start_s"] * 1e6).round(3).tolist()
    dur = ((df["end_s"] - df["start_s"]) * 1e6).round(3).tolist()
    for row, t, d in zip(df[["rank", "stream", "task_id", "kind", "step", "bytes", "flops", "peers"]].itertuples(
            index=False), ts, dur, strict=True):
        events.append({"ph": "X", "pid": int(row.rank), "tid": STREAM_TID[row.stream], "ts": t, "dur": d,
                       "name": row.task_id, "cat": row.kind,
                       "args": {"step": int(row.step), "bytes": row.bytes, "flops": row.flops, "peers": row.peers}})
    with open(path, "w") as fh:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, fh)
    return len(events)
