"""The events a Perfetto trace shows of a RunTrace: one per task on a track per rank (full detail), or one per task
of a pipeline stage on a track per stage (aggregated); the flow arrows from each send to its receive; the busiest
links' utilization as counters.

Owns Tracks and how the detail is chosen (DETAILS, choose_detail: aggregated by default past AGGREGATE_ROWS rows);
the writers (perfetto.py: JSON, gzipped JSON; perfetto_proto.py: protobuf) read Tracks only.

An aggregated event is the envelope of a task over its stage's ranks: it starts at the earliest rank's start and
ends at the latest rank's end; its args say how many ranks it covers and how far apart their ends are
(end_spread_us: 0 where the stage's ranks ran the task in step, as they do under uniform routing, where the
simulator runs a stage's ranks as one lane).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from piper_sim.errors import ConfigError
from piper_sim.workload.task_kinds import P2P_KINDS, Stream, TaskKind

STREAM_TID = {Stream.COMPUTE: 0, Stream.P2P: 1, Stream.COLLECTIVE: 2}
DETAILS = {
    "auto": "one track per rank up to AGGREGATE_ROWS trace rows, one per pipeline stage beyond (the default)",
    "rank": "one track per rank and stream, whatever the size",
    "stage": "one track per pipeline stage and stream: each task's envelope over the stage's ranks",
}
# past this many trace rows a trace shows one track per stage (auto): perfetto.json takes about 190 B and 6 us a
# row to write on this machine (dense-100b-frontier's 511k rows: 97 MB in 2.9 s, benchmarks/bench_memory.py), and
# Perfetto's UI loads a JSON trace of about 1M events slowly; a 200k-row trace is about 38 MB
AGGREGATE_ROWS = 200_000
COUNTER_LINKS = 16  # the busiest links shown as utilization counters


def check_detail(detail: str) -> str:
    """detail, when it is one of DETAILS (--perfetto-detail)."""
    if detail not in DETAILS:
        raise ConfigError("--perfetto-detail", detail, "; ".join(f"{k}: {v}" for k, v in DETAILS.items()))
    return detail


def choose_detail(detail: str, rows: int) -> str:
    """rank or stage: what `detail` (DETAILS) gives for a trace of `rows` rows."""
    if check_detail(detail) == "auto":
        return "stage" if rows > AGGREGATE_ROWS else "rank"
    return detail


@dataclass(frozen=True)
class Tracks:
    """What a Perfetto trace shows: events (one row per slice: pid, tid, ts_us, dur_us, name, cat and its args
    step, bytes, flops, peers, and where aggregated ranks and end_spread_us), the name of each pid, the flow arrows
    (send's event index, receive's event index) and the link counters (link name, mean utilization 0-1) over
    [0, end_us]."""

    events: pd.DataFrame
    process_names: dict[int, str]
    flows: np.ndarray  # shape (n, 2): positions into events
    counters: list[tuple[str, float]]
    end_us: float
    aggregated: bool

    @property
    def counter_pid(self) -> int:
        """The pid of the links' counters: one past every track's."""
        return max(self.process_names, default=-1) + 1


def build_tracks(
    df: pd.DataFrame, detail: str, ranks_per_stage: int | None = None, links: pd.DataFrame | None = None
) -> Tracks:
    """The Tracks of trace rows df at detail rank or stage (choose_detail); ranks_per_stage: the ranks of a
    pipeline stage (stage = rank // ranks_per_stage; needed for stage); links: the run's link table (link,
    utilization), whose busiest COUNTER_LINKS become counters."""
    if detail == "stage":
        if not ranks_per_stage:
            raise ValueError("stage tracks need ranks_per_stage")
        events, names = _stage_events(df, ranks_per_stage)
    else:
        events, names = _rank_events(df)
    end_us = float(events["ts_us"].add(events["dur_us"]).max()) if len(events) else 0.0
    counters = []
    if links is not None and len(links):
        busiest = links.sort_values("utilization", ascending=False).head(COUNTER_LINKS)
        counters = [(str(link), float(u)) for link, u in zip(busiest["link"], busiest["utilization"], strict=True)]
    return Tracks(
        events=events,
        process_names=names,
        flows=flow_pairs(events),
        counters=counters,
        end_us=end_us,
        aggregated=detail == "stage",
    )


def _times(start_s: pd.Series, end_s: pd.Series) -> tuple[pd.Series, pd.Series]:
    """(ts_us, dur_us) at ns resolution: the end rounded as every start is, so that a slice ending where the next
    begins ends at that next one's rounded start (rounding the duration alone can end it 1 ns past it)."""
    ts = (start_s * 1e6).round(3)
    return ts, ((end_s * 1e6).round(3) - ts).round(3)


def _rank_events(df: pd.DataFrame) -> tuple[pd.DataFrame, dict[int, str]]:
    ts, dur = _times(df["start_s"], df["end_s"])
    events = pd.DataFrame(
        {
            "pid": df["rank"].to_numpy(np.int64),
            "tid": _tids(df["stream"]),
            "ts_us": ts.to_numpy(),
            "dur_us": dur.to_numpy(),
            "name": _labels(df["task_id"]),
            "cat": _labels(df["kind"]),
            "step": df["step"].to_numpy(np.int64),
            "bytes": df["bytes"].to_numpy(),
            "flops": df["flops"].to_numpy(),
            "peers": _labels(df["peers"]),
            "peer_pid": _peer_ranks(df["peers"], df["kind"]),
        }
    )
    _p2p_keys(events, df)
    return events, {int(r): f"rank {r}" for r in sorted(df["rank"].unique().tolist())}


def stage_rows(df: pd.DataFrame, ranks_per_stage: int) -> pd.DataFrame:
    """One row per task of each pipeline stage and step: its envelope over the stage's ranks (start_s the earliest
    start, end_s the latest end, first_end_s the earliest end, ranks how many), with the first rank's kind, stream,
    bytes, flops, peers (and role and microbatch where df has them); stage = rank // ranks_per_stage."""
    extra = [c for c in ("role", "microbatch") if c in df.columns]
    grouped = df.assign(stage=df["rank"].to_numpy(np.int64) // ranks_per_stage).groupby(
        ["step", "stage", "task_id"], observed=True, sort=False
    )
    return grouped.agg(
        start_s=("start_s", "min"),
        end_s=("end_s", "max"),
        first_end_s=("end_s", "min"),
        ranks=("rank", "size"),
        kind=("kind", "first"),
        stream=("stream", "first"),
        bytes=("bytes", "first"),
        flops=("flops", "first"),
        peers=("peers", "first"),
        **{c: (c, "first") for c in extra},
    ).reset_index()


def _stage_events(df: pd.DataFrame, ranks_per_stage: int) -> tuple[pd.DataFrame, dict[int, str]]:
    agg = stage_rows(df, ranks_per_stage).rename(columns={"stage": "pid"})
    ts, dur = _times(agg["start_s"], agg["end_s"])
    peer_rank = _peer_ranks(agg["peers"], agg["kind"])
    events = pd.DataFrame(
        {
            "pid": agg["pid"].to_numpy(np.int64),
            "tid": _tids(agg["stream"]),
            "ts_us": ts.to_numpy(),
            "dur_us": dur.to_numpy(),
            "name": _labels(agg["task_id"]),
            "cat": _labels(agg["kind"]),
            "step": agg["step"].to_numpy(np.int64),
            "bytes": agg["bytes"].to_numpy(),
            "flops": agg["flops"].to_numpy(),
            "peers": np.where(
                peer_rank >= 0, "stage " + (peer_rank // ranks_per_stage).astype(str), agg["peers"].astype(str)
            ),
            "ranks": agg["ranks"].to_numpy(np.int64),
            "end_spread_us": ((agg["end_s"] - agg["first_end_s"]) * 1e6).round(3).to_numpy(),
            "peer_pid": np.where(peer_rank >= 0, peer_rank // ranks_per_stage, -1),
        }
    )
    _p2p_keys(events, agg)
    stages = sorted(agg["pid"].unique().tolist())
    names = {p: f"stage {p} (ranks {p * ranks_per_stage}-{(p + 1) * ranks_per_stage - 1})" for p in stages}
    return events, names


def _labels(column: pd.Series) -> pd.Categorical | np.ndarray:
    """A label column as it is (a categorical stays codes into its labels: no string per row)."""
    return column.array if isinstance(column.dtype, pd.CategoricalDtype) else column.astype(str).to_numpy()


def _tids(stream: pd.Series) -> np.ndarray:
    return stream.astype(str).map(STREAM_TID).fillna(len(STREAM_TID)).to_numpy(np.int64)


def _peer_ranks(peers: pd.Series, kind: pd.Series) -> np.ndarray:
    """The other rank of each send and receive (its peers label is the rank); -1 elsewhere."""
    p2p = kind.astype(str).isin(P2P_KINDS).to_numpy()
    out = np.full(len(peers), -1, dtype=np.int64)
    text = peers.astype(str).to_numpy()[p2p]
    ok = np.char.isdigit(text.astype(str)) if len(text) else np.zeros(0, bool)
    idx = np.flatnonzero(p2p)[ok]
    out[idx] = text[ok].astype(np.int64)
    return out


def _p2p_keys(events: pd.DataFrame, source: pd.DataFrame) -> None:
    """Columns flow_pairs matches sends and receives by: role and micro-batch, where the trace has them."""
    for col in ("role", "microbatch"):
        if col in source.columns:
            events[col] = _labels(source[col]) if col == "role" else source[col].to_numpy(np.int64)


def flow_pairs(events: pd.DataFrame) -> np.ndarray:
    """(send position, receive position) of each transfer: a send on track a to b is paired with the receive on b
    from a of the same step, role and micro-batch, the n-th send with the n-th receive in time. Empty where the
    events have no role or micro-batch."""
    if "role" not in events.columns or "microbatch" not in events.columns:
        return np.zeros((0, 2), dtype=np.int64)
    p2p = events[(events["peer_pid"] >= 0) & events["cat"].astype(str).isin(P2P_KINDS)]
    send = p2p["cat"].astype(str).to_numpy() == TaskKind.SEND
    keys = pd.DataFrame(
        {
            "pos": p2p.index.to_numpy(),
            "send": send,
            "ts": p2p["ts_us"].to_numpy(),
            "step": p2p["step"].to_numpy(),
            "role": p2p["role"].to_numpy(),
            "mb": p2p["microbatch"].to_numpy(),
            "src": np.where(send, p2p["pid"], p2p["peer_pid"]),
            "dst": np.where(send, p2p["peer_pid"], p2p["pid"]),
        }
    ).sort_values("ts", kind="stable")
    by = ["step", "role", "mb", "src", "dst"]
    keys["n"] = keys.groupby([*by, "send"], sort=False).cumcount()
    pairs = keys[keys["send"]].merge(keys[~keys["send"]], on=[*by, "n"], suffixes=("_s", "_r"))
    return pairs[["pos_s", "pos_r"]].to_numpy(np.int64).reshape(-1, 2)
