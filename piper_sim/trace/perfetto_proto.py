"""perfetto.pftrace: the Tracks (tracks.py) as Perfetto's protobuf trace, built with the `perfetto` package's trace
builder (perfetto.trace_builder.proto_builder; an optional extra: pip install -e '.[perfetto]').

A track descriptor per process (rank or stage) and per stream of it, slice begin and end events (all of them in time
order, an end before a begin at the same time, so slices on a track close before the next opens), a flow id from
each send's slice to its receive's, and a counter track per busiest link with its mean utilization (%). Timestamps
in nanoseconds. Written CHUNK packets at a time: each chunk is a Trace message of its own (a trace file is the
concatenation of Trace messages), so memory stays that of one chunk.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

import numpy as np

from piper_sim.errors import ConfigError
from piper_sim.trace.tracks import STREAM_TID, Tracks

SEQUENCE_ID = 1  # every packet on one trusted sequence (no interned data)
COUNTER_UUID_BASE = 1 << 40  # counter tracks' uuids, apart from the process and thread tracks' (track_uuid)
BEGIN, END, COUNTER = 1, 2, 4  # TrackEvent.Type: TYPE_SLICE_BEGIN, TYPE_SLICE_END, TYPE_COUNTER


def check_installed() -> None:
    """--perfetto proto needs the perfetto package; without it, a ConfigError naming the other formats."""
    if importlib.util.find_spec("perfetto") is None:
        raise ConfigError(
            "--perfetto", "proto", "json or gz here: proto needs the perfetto package (pip install -e '.[perfetto]')"
        )


def track_uuid(pid: int, tid: int | None = None) -> int:
    """The uuid of a process's track (tid None) or of one of its streams' tracks."""
    return ((pid + 1) << 3) | (0 if tid is None else tid + 1)


def write_proto(tracks: Tracks, path: Path, on_rows: Callable[[int], None] | None, chunk: int) -> int:
    """Write tracks to path; on_rows(n) after each chunk of n slices. Returns the packets written."""
    # perfetto: optional (the perfetto extra); check_installed refused --perfetto proto without it
    from perfetto.trace_builder.proto_builder import TraceProtoBuilder

    ev = tracks.events
    flow_out = dict(zip(tracks.flows[:, 0].tolist(), range(1, len(tracks.flows) + 1), strict=True))
    flow_in = dict(zip(tracks.flows[:, 1].tolist(), range(1, len(tracks.flows) + 1), strict=True))
    ts_ns = np.round(ev["ts_us"].to_numpy() * 1e3).astype(np.int64)
    end_ns = ts_ns + np.round(ev["dur_us"].to_numpy() * 1e3).astype(np.int64)
    n = len(ev)
    times = np.concatenate([ts_ns, end_ns])
    # by time; at one time ends (0) before begins (1), the longer of two begins first and the later-begun of two
    # ends first, so that slices with a common bound nest
    order = np.lexsort((np.concatenate([-(end_ns - ts_ns), -ts_ns]), np.repeat([1, 0], n), times))
    names = (
        "pid",
        "tid",
        "name",
        "cat",
        "step",
        "bytes",
        "flops",
        "peers",
        *(("ranks", "end_spread_us") if tracks.aggregated else ()),
    )
    written = 0
    with open(path, "wb") as fh:
        builder = TraceProtoBuilder()
        _descriptors(builder, tracks)
        for first in range(0, len(order), 2 * chunk):
            part = order[first : first + 2 * chunk]
            ids = np.where(part < n, part, part - n)
            columns = {c: ev[c].iloc[ids].tolist() for c in names}
            for j, (i, begin) in enumerate(zip(ids.tolist(), (part < n).tolist(), strict=True)):
                packet = builder.add_packet()
                packet.timestamp = int(ts_ns[i] if begin else end_ns[i])
                packet.trusted_packet_sequence_id = SEQUENCE_ID
                event = packet.track_event
                event.track_uuid = track_uuid(columns["pid"][j], columns["tid"][j])
                if not begin:
                    event.type = END
                    continue
                event.type = BEGIN
                event.name = str(columns["name"][j])
                event.categories.append(str(columns["cat"][j]))
                _annotate(event, columns, j, tracks.aggregated)
                if i in flow_out:
                    event.flow_ids.append(flow_out[i])
                if i in flow_in:
                    event.terminating_flow_ids.append(flow_in[i])
            written += _flush(builder, fh)
            builder = TraceProtoBuilder()
            if on_rows is not None:
                on_rows(int(np.count_nonzero(part < n)))
        _counters(builder, tracks)
        written += _flush(builder, fh)
    return written


def _flush(builder, fh) -> int:
    fh.write(builder.serialize())
    return len(builder.trace.packet)


def _annotate(event, columns: dict[str, list], i: int, aggregated: bool) -> None:
    for name, kind in (
        ("step", "int_value"),
        ("bytes", "double_value"),
        ("flops", "double_value"),
        ("peers", "string_value"),
        *((("ranks", "int_value"), ("end_spread_us", "double_value")) if aggregated else ()),
    ):
        note = event.debug_annotations.add()
        note.name = name
        value = columns[name][i]
        setattr(note, kind, str(value) if kind == "string_value" else value)


def _descriptors(builder, tracks: Tracks) -> None:
    """A process track per pid (rank or stage), a thread track per stream of it, and the links' counter tracks."""
    for pid, name in tracks.process_names.items():
        packet = builder.add_packet()
        desc = packet.track_descriptor
        desc.uuid = track_uuid(pid)
        desc.process.pid, desc.process.process_name = pid, name
        for stream, tid in STREAM_TID.items():
            thread = builder.add_packet().track_descriptor
            thread.uuid, thread.parent_uuid = track_uuid(pid, tid), track_uuid(pid)
            thread.thread.pid, thread.thread.tid, thread.thread.thread_name = pid, pid * 8 + tid + 1, stream
    if tracks.counters:
        pid = tracks.counter_pid
        desc = builder.add_packet().track_descriptor
        desc.uuid = track_uuid(pid)
        desc.process.pid, desc.process.process_name = pid, "links: mean utilization over the run (%)"
        for k, (link, _) in enumerate(tracks.counters):
            counter = builder.add_packet().track_descriptor
            counter.uuid, counter.parent_uuid, counter.name = COUNTER_UUID_BASE + k, track_uuid(pid), link
            counter.counter.unit_name = "%"


def _counters(builder, tracks: Tracks) -> None:
    for ts_ns, scale in ((0, 100.0), (int(round(tracks.end_us * 1e3)), 0.0)):
        for k, (_, utilization) in enumerate(tracks.counters):
            packet = builder.add_packet()
            packet.timestamp = ts_ns
            packet.trusted_packet_sequence_id = SEQUENCE_ID
            packet.track_event.type = COUNTER
            packet.track_event.track_uuid = COUNTER_UUID_BASE + k
            packet.track_event.double_counter_value = round(utilization * scale, 3)
