"""Perfetto traces of a RunTrace (tracks.py chooses what they show): Chrome's JSON trace format, plain
(perfetto.json) or gzipped (perfetto.json.gz), or Perfetto's protobuf (perfetto.pftrace, perfetto_proto.py).

JSON: pid = rank (or stage), tid = stream, times in microseconds; complete ('X') events, flow events ('s', 'f')
from each send to its receive, and counter ('C') events of the busiest links' mean utilization. Written as a
stream: CHUNK_ROWS events are built and encoded at a time (the C encoder of json.dumps), so memory stays that of
one chunk whatever the trace's size, and a caller can count the rows written.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pandas as pd

from piper_sim.errors import ConfigError
from piper_sim.trace.perfetto_proto import check_installed, write_proto
from piper_sim.trace.tracks import STREAM_TID, Tracks, build_tracks

FORMATS = {
    "json": "perfetto.json (Chrome's JSON trace format; the default)",
    "gz": "perfetto.json.gz (the same, gzipped: about 10x smaller)",
    "proto": "perfetto.pftrace (Perfetto's protobuf; needs the perfetto package: pip install -e '.[perfetto]')",
    "none": "no Perfetto trace",
}
FILE_NAMES = {"json": "perfetto.json", "gz": "perfetto.json.gz", "proto": "perfetto.pftrace"}
MAX_EVENTS = 2_000_000
CHUNK_ROWS = 10_000  # rows encoded at once: about 2.6 kB each in flight (their dicts and JSON), 26 MB
GZIP_LEVEL = 1  # zlib's fastest level: 4x the speed of its default 6 for a few percent more bytes on these traces


def check_format(fmt: str) -> str:
    """fmt, when it is one of FORMATS (--perfetto) and what it needs is installed."""
    if fmt not in FORMATS:
        raise ConfigError("--perfetto", fmt, "; ".join(f"{k}: {v}" for k, v in FORMATS.items()))
    if fmt == "proto":
        check_installed()
    return fmt


def perfetto_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The rows write_perfetto writes: all of them, or the first step's where there are more than MAX_EVENTS."""
    return df[df["step"] == df["step"].min()] if len(df) > MAX_EVENTS else df


def first_step_rows(df: pd.DataFrame) -> int:
    """How many rows the trace's first step has."""
    return int((df["step"] == df["step"].min()).sum()) if len(df) else 0


def perfetto_row_count(df: pd.DataFrame) -> int:
    """len(perfetto_rows(df)), without copying them."""
    return first_step_rows(df) if len(df) > MAX_EVENTS else len(df)


def write_perfetto(
    df: pd.DataFrame,
    path: Path,
    on_rows: Callable[[int], None] | None = None,
    chunk_rows: int = CHUNK_ROWS,
    *,
    fmt: str = "json",
    detail: str = "rank",
    ranks_per_stage: int | None = None,
    links: pd.DataFrame | None = None,
) -> int:
    """Write the tracks of perfetto_rows(df) at detail rank or stage (tracks.build_tracks) as fmt (json, gz,
    proto), chunk_rows events at a time; on_rows(n) after each chunk of n events. Returns how many events
    (metadata, flows and counters included; a protobuf trace's: its packets)."""
    tracks = build_tracks(perfetto_rows(df), detail, ranks_per_stage, links)
    if fmt == "proto":
        return write_proto(tracks, path, on_rows, chunk_rows)
    written = 0
    with gzip.open(path, "wt", compresslevel=GZIP_LEVEL) if fmt == "gz" else open(path, "w") as fh:
        fh.write('{"traceEvents": [')
        for events in _chunks(tracks, chunk_rows, on_rows):
            if events:
                fh.write((", " if written else "") + json.dumps(events)[1:-1])
                written += len(events)
        fh.write('], "displayTimeUnit": "ms"}')
    return written


def _chunks(tracks: Tracks, chunk_rows: int, on_rows: Callable[[int], None] | None) -> Iterator[list[dict]]:
    """The metadata events, the 'X' events of each chunk of chunk_rows events, the flows, the counters."""
    yield _meta(tracks)
    events = tracks.events
    for first in range(0, len(events), chunk_rows):
        part = events.iloc[first : first + chunk_rows]
        yield _slices(part, tracks.aggregated)
        if on_rows is not None:
            on_rows(len(part))
    for first in range(0, len(tracks.flows), chunk_rows):
        yield _flows(events, tracks.flows[first : first + chunk_rows], first)
    yield _counters(tracks)


def _meta(tracks: Tracks) -> list[dict]:
    meta: list[dict] = []
    for pid, name in tracks.process_names.items():
        meta.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}})
        for stream, tid in STREAM_TID.items():
            meta.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": stream}})
    return meta


def _slices(ev: pd.DataFrame, aggregated: bool) -> list[dict]:
    """One complete ('X') event per row; an aggregated one says its ranks and their ends' spread."""
    columns = [
        ev[c].tolist() for c in ("pid", "tid", "ts_us", "dur_us", "name", "cat", "step", "bytes", "flops", "peers")
    ]
    more = [ev[c].tolist() for c in ("ranks", "end_spread_us")] if aggregated else [[None] * len(ev)] * 2
    out = []
    for pid, tid, ts, dur, name, cat, step, nbytes, flops, peers, ranks, spread in zip(*columns, *more, strict=True):
        args = {"step": step, "bytes": nbytes, "flops": flops, "peers": peers}
        if aggregated:
            args["ranks"], args["end_spread_us"] = ranks, spread
        out.append({"ph": "X", "pid": pid, "tid": tid, "ts": ts, "dur": dur, "name": name, "cat": cat, "args": args})
    return out


def _flows(ev: pd.DataFrame, pairs, first_id: int) -> list[dict]:
    """A flow arrow ('s' at the send's start, 'f' bound to the receive) per pair of positions."""
    out = []
    ends = [[ev[c].to_numpy()[pairs[:, side]].tolist() for c in ("pid", "tid", "ts_us")] for side in (0, 1)]
    for i, (sp, st, sts, rp, rt, rts) in enumerate(zip(*ends[0], *ends[1], strict=True)):
        fid = first_id + i + 1
        out.append({"ph": "s", "id": fid, "cat": "p2p", "name": "p2p", "pid": sp, "tid": st, "ts": sts})
        out.append({"ph": "f", "bp": "e", "id": fid, "cat": "p2p", "name": "p2p", "pid": rp, "tid": rt, "ts": rts})
    return out


def _counters(tracks: Tracks) -> list[dict]:
    """The busiest links' mean utilization (%) as counters of a process of their own, from 0 to the trace's end."""
    if not tracks.counters:
        return []
    pid = tracks.counter_pid
    out: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": pid, "args": {"name": "links: mean utilization over the run (%)"}}
    ]
    for ts, scale in ((0.0, 100.0), (tracks.end_us, 0.0)):
        out.extend(
            {"ph": "C", "pid": pid, "ts": ts, "name": link, "args": {"utilization_pct": round(u * scale, 3)}}
            for link, u in tracks.counters
        )
    return out
