"""Outputs that scale: the trace written to Parquet in row groups (read back equal), the Perfetto trace as JSON,
gzipped JSON or protobuf (--perfetto) with flow arrows from sends to receives and link counters, one track per
pipeline stage past a size (--perfetto-detail), and the flags' errors."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pandas as pd
import pytest

from piper_sim.cli import main
from piper_sim.config import load_config
from piper_sim.errors import ConfigError
from piper_sim.outputs import check_perfetto, write_run
from piper_sim.simulator import simulate
from piper_sim.trace import perfetto_proto, tracks
from piper_sim.trace.perfetto import check_format
from piper_sim.trace.runtrace import normalize, read_trace, write_trace
from piper_sim.trace.tracks import AGGREGATE_ROWS, build_tracks, check_detail, choose_detail


@pytest.fixture(scope="module")
def run():
    """tiny-moe on the uniform cluster: PP 2 x EP 2, 2 ranks a stage, sends and receives between the stages."""
    return simulate(load_config("tiny-moe"))


def _events(path: Path) -> list[dict]:
    return json.loads(path.read_text())["traceEvents"]


def test_parquet_row_groups_read_back_equal_to_the_trace(run, tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    path = write_trace(run.trace, tmp_path, row_group_rows=100)
    assert pq.ParquetFile(path).num_row_groups == math.ceil(len(run.trace) / 100) > 1
    pd.testing.assert_frame_equal(read_trace(tmp_path), normalize(run.trace))
    counted = []
    write_trace(run.trace, tmp_path, "csv", row_group_rows=300, on_rows=counted.append)
    assert counted == [300, 300, 300, len(run.trace) - 900]
    pd.testing.assert_frame_equal(
        normalize(pd.read_csv(tmp_path / "trace.csv").fillna({"peers": "", "role": ""})), normalize(run.trace)
    )


def test_the_flags_errors_name_the_flag_and_what_is_allowed(monkeypatch):
    with pytest.raises(ConfigError, match="--perfetto.*json.*gz.*proto.*none"):
        check_format("xml")
    with pytest.raises(ConfigError, match="--perfetto.*none with --outputs report"):
        check_perfetto("report", "json")
    assert check_perfetto("report", None) == "none" and check_perfetto("all", None) == "json"
    assert check_perfetto("trace", "none") == "none"
    with pytest.raises(ConfigError, match="--perfetto-detail.*auto.*rank.*stage"):
        check_detail("pid")
    monkeypatch.setattr(perfetto_proto.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match="--perfetto.*json or gz here: proto needs the perfetto package"):
        check_format("proto")


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--perfetto", "xml"], "--perfetto"),
        (["--outputs", "trace", "--perfetto", "gz"], "--perfetto"),
        (["--perfetto-detail", "all"], "--perfetto-detail"),
    ],
)
def test_simulate_refuses_a_bad_flag_before_it_runs(tmp_path, capsys, argv, flag):
    assert main(["simulate", "tiny-moe", "--out", str(tmp_path / "out"), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("piper-sim: error:") and flag in err
    assert not (tmp_path / "out").exists()


def test_detail_aggregates_past_the_threshold():
    assert choose_detail("auto", AGGREGATE_ROWS) == "rank" and choose_detail("auto", AGGREGATE_ROWS + 1) == "stage"
    assert choose_detail("rank", 10**9) == "rank" and choose_detail("stage", 1) == "stage"


def test_write_run_gives_stage_tracks_past_the_threshold_and_rank_tracks_when_forced(run, tmp_path, monkeypatch):
    monkeypatch.setattr(tracks, "AGGREGATE_ROWS", len(run.trace) - 1)
    write_run(tmp_path / "auto", run, "all")
    write_run(tmp_path / "rank", run, "all", detail="rank")
    staged = [e for e in _events(tmp_path / "auto" / "perfetto.json") if e["ph"] == "X"]
    ranked = [e for e in _events(tmp_path / "rank" / "perfetto.json") if e["ph"] == "X"]
    assert {e["pid"] for e in staged} == {0, 1} and {e["pid"] for e in ranked} == {0, 1, 2, 3}
    assert len(staged) == len(run.trace) // 2 and len(ranked) == len(run.trace)
    monkeypatch.setattr(tracks, "AGGREGATE_ROWS", len(run.trace))
    write_run(tmp_path / "under", run, "all")
    assert {e["pid"] for e in _events(tmp_path / "under" / "perfetto.json") if e["ph"] == "X"} == {0, 1, 2, 3}


def test_a_stage_event_is_the_envelope_of_its_ranks(run):
    df = run.trace.copy()
    df.loc[(df["rank"] == 1) & (df["task_id"] == "F:c0:m0:s0"), "end_s"] += 1e-3  # rank 1 ends 1 ms later
    ev = build_tracks(df, "stage", ranks_per_stage=2).events
    ev = ev[(ev["pid"] == 0) & (ev["step"] == 0)].set_index(
        ev["name"].astype(str)[(ev["pid"] == 0) & (ev["step"] == 0)]
    )
    rows = df[(df["rank"] < 2) & (df["step"] == 0)]
    for task, group in rows.groupby("task_id", observed=True):
        e = ev.loc[str(task)]
        assert e["ts_us"] == round(group["start_s"].min() * 1e6, 3) and e["ranks"] == 2
        assert e["ts_us"] + e["dur_us"] == pytest.approx(group["end_s"].max() * 1e6, abs=2e-3)
    assert ev.loc["F:c0:m0:s0", "end_spread_us"] == pytest.approx(1e3)
    assert (ev.drop(index="F:c0:m0:s0")["end_spread_us"] == 0).all()


@pytest.mark.parametrize("detail", ["rank", "stage"])
def test_every_send_has_a_flow_arrow_to_its_receive(run, detail):
    t = build_tracks(run.trace, detail, ranks_per_stage=2, links=run.links)
    ev = t.events
    sends = ev[ev["cat"].astype(str) == "send"]
    assert len(t.flows) == len(sends) > 0
    s, r = ev.iloc[t.flows[:, 0]], ev.iloc[t.flows[:, 1]]
    assert (s["cat"].astype(str).to_numpy() == "send").all() and (r["cat"].astype(str).to_numpy() == "recv").all()
    assert (s["peer_pid"].to_numpy() == r["pid"].to_numpy()).all() and (
        r["peer_pid"].to_numpy() == s["pid"].to_numpy()
    ).all()
    for col in ("step", "microbatch"):
        assert (s[col].to_numpy() == r[col].to_numpy()).all()
    assert (s["role"].astype(str).to_numpy() == r["role"].astype(str).to_numpy()).all()


def test_json_and_gz_hold_the_same_events_with_flows_and_counters(run, tmp_path):
    write_run(tmp_path / "j", run, "all", perfetto="json")
    paths = write_run(tmp_path / "g", run, "all", perfetto="gz")
    assert paths["perfetto"].name == "perfetto.json.gz" and not (tmp_path / "g" / "perfetto.json").exists()
    plain = _events(tmp_path / "j" / "perfetto.json")
    assert json.loads(gzip.decompress(paths["perfetto"].read_bytes()))["traceEvents"] == plain
    phases = pd.Series([e["ph"] for e in plain]).value_counts()
    sends = int((run.trace["kind"] == "send").sum())
    assert phases["s"] == phases["f"] == sends and phases["X"] == len(run.trace)
    counters = [e for e in plain if e["ph"] == "C"]
    busiest = run.links.sort_values("utilization", ascending=False).iloc[0]
    assert counters[0]["name"] == busiest["link"]
    assert counters[0]["args"]["utilization_pct"] == round(busiest["utilization"] * 100, 3)
    assert write_run(tmp_path / "n", run, "all", perfetto="none").get("perfetto") is None


def test_proto_holds_a_slice_per_event_flows_and_counters(run, tmp_path):
    pb = pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2")
    paths = write_run(tmp_path / "p", run, "all", perfetto="proto", detail="rank")
    trace = pb.Trace()
    trace.ParseFromString(paths["perfetto"].read_bytes())
    events = [p for p in trace.packet if p.HasField("track_event")]
    kinds = pd.Series([p.track_event.type for p in events]).value_counts()
    assert kinds[perfetto_proto.BEGIN] == kinds[perfetto_proto.END] == len(run.trace)
    assert kinds[perfetto_proto.COUNTER] == 2 * min(len(run.links), tracks.COUNTER_LINKS)
    out = sorted(f for p in events for f in p.track_event.flow_ids)
    assert out == sorted(f for p in events for f in p.track_event.terminating_flow_ids)
    assert len(out) == int((run.trace["kind"] == "send").sum())
    # on each track, slices nest: every end closes the slice opened last, at that slice's own end
    ev = build_tracks(run.trace, "rank").events
    ends = {
        (int(pid), str(name), int(step)): round(ts * 1e3) + round(dur * 1e3)
        for pid, name, step, ts, dur in zip(ev["pid"], ev["name"], ev["step"], ev["ts_us"], ev["dur_us"], strict=True)
    }
    open_ends: dict[int, list[int]] = {}
    for p in events:
        e = p.track_event
        if e.type == perfetto_proto.BEGIN:
            step = next(a.int_value for a in e.debug_annotations if a.name == "step")
            open_ends.setdefault(e.track_uuid, []).append(ends[((e.track_uuid >> 3) - 1, e.name, step)])
        elif e.type == perfetto_proto.END:
            assert open_ends[e.track_uuid].pop() == p.timestamp
    assert not any(open_ends.values())
    names = {p.track_descriptor.process.process_name for p in trace.packet if p.HasField("track_descriptor")}
    assert {"rank 0", "rank 3"} <= names


def test_cli_writes_the_chosen_perfetto_file(tmp_path, capsys):
    assert main(["simulate", "tiny-moe", "--out", str(tmp_path / "o"), "--perfetto", "gz"]) == 0
    assert (tmp_path / "o" / "perfetto.json.gz").exists() and not (tmp_path / "o" / "perfetto.json").exists()
    assert "perfetto.json.gz" in capsys.readouterr().out


def test_the_memory_estimate_counts_the_rank_events_of_the_default_detail():
    from piper_sim import host_memory

    assert host_memory.AGGREGATE_ROWS == AGGREGATE_ROWS
    small, large = (
        host_memory.estimate_run_memory(n, 0, 0, "all").outputs_bytes
        - host_memory.estimate_run_memory(n, 0, 0, "trace").outputs_bytes
        for n in (1_000, 10**7)
    )
    assert large - small < 2 * host_memory.RANK_EVENT_BYTES * AGGREGATE_ROWS  # bounded: stage tracks beyond
    assert small >= host_memory.RANK_EVENT_BYTES * 1_000
