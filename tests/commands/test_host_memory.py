"""Host memory: a run's whole peak estimated before it starts (tasks, network, outputs) and refused when this machine
has less available, naming what to lower; a run that drains the machine's memory stops itself with a PiperError;
--outputs chooses the files written; perfetto.json is written a chunk at a time."""

from __future__ import annotations

import json
import math
import time
import tracemalloc

import numpy as np
import pandas as pd
import pytest

from piper_sim import simulator as simulate_module
from piper_sim.cli import main
from piper_sim.config import load_config
from piper_sim.errors import ConfigError
from piper_sim.host_memory import GIB, MARGIN_BYTES, MemoryExceeded, MemoryGuard, estimate_run_memory
from piper_sim.outputs import write_run
from piper_sim.simulator import simulate
from piper_sim.trace.perfetto import write_perfetto

CONFIG = "tiny-moe"


@pytest.fixture(scope="module")
def tiny_result():
    return simulate(load_config(CONFIG))


def _estimate(result, outputs):
    par = result.config.parallel
    return estimate_run_memory(
        len(result.trace), len(result.topology.capacity_bytes_per_s), par.num_gpus * par.ep, outputs
    )


def test_the_estimate_counts_the_outputs_written(tiny_result):
    nothing, report, trace, every = (_estimate(tiny_result, o) for o in (None, "report", "trace", "all"))
    assert every.total_bytes > trace.total_bytes > report.total_bytes > nothing.total_bytes
    assert every.tasks_bytes == nothing.tasks_bytes and every.network_bytes == nothing.network_bytes > 0
    assert every.outputs_bytes - nothing.outputs_bytes == every.total_bytes - nothing.total_bytes
    assert tiny_result.stats["host_memory_estimate_bytes"] == nothing.total_bytes  # simulate() alone writes nothing


def test_a_run_whose_outputs_would_not_fit_is_told_to_write_fewer(tiny_result, monkeypatch):
    cfg = load_config(CONFIG)
    report, every = _estimate(tiny_result, "report"), _estimate(tiny_result, "all")
    available = int(MARGIN_BYTES + (report.total_bytes + every.total_bytes) / 2)
    monkeypatch.setattr(simulate_module, "available_memory_bytes", lambda: available)
    with pytest.raises(ConfigError) as err:
        simulate(cfg, outputs="all")
    assert (err.value.key, err.value.value) == ("--outputs", "all")
    assert str(err.value.allowed).startswith("report here") or str(err.value.allowed).startswith("trace here")
    assert f"{every.total_bytes / GIB:.1f} GiB" in str(err.value) and f"{available / GIB:.1f} GiB available" in str(
        err.value
    )
    assert simulate(cfg, outputs="report").report.step_time_s == tiny_result.report.step_time_s


def test_a_run_too_large_names_the_micro_batches_that_fit(tiny_result, monkeypatch):
    cfg = load_config(CONFIG)
    need = _estimate(tiny_result, "report")
    # room for all but half of what scales with the rank tasks: half the micro-batches fit
    available = math.ceil(MARGIN_BYTES + need.total_bytes - need.per_task_bytes / 2) + 1
    monkeypatch.setattr(simulate_module, "available_memory_bytes", lambda: available)
    with pytest.raises(ConfigError) as err:
        simulate(cfg, outputs="report")
    mb = cfg.parallel.num_microbatches
    assert (err.value.key, err.value.value) == ("parallel.num_microbatches", mb)
    assert f"at most about {mb // 2} here" in str(err.value)


def test_a_run_that_drains_the_memory_stops_itself(monkeypatch):
    cfg = load_config(CONFIG)
    readings = iter([64 * GIB])  # the check before the run passes; then the machine has 100 MiB left
    monkeypatch.setattr(simulate_module, "available_memory_bytes", lambda: next(readings, 100 * 2**20))
    runs = []
    run = simulate_module.Simulation.run
    monkeypatch.setattr(simulate_module.Simulation, "run", lambda self: runs.append(self) or run(self))
    with pytest.raises(MemoryExceeded) as err:
        simulate(cfg)
    total = sum(len(p) for p in runs[0].schedule.stage_programs) * runs[0].per_stage * cfg.steps
    assert 0 < runs[0].tasks_done < total  # stopped in the event loop, at its first lane task
    pairs = cfg.parallel.num_gpus * cfg.parallel.ep
    estimate = estimate_run_memory(total, len(runs[0].topo.capacity_bytes_per_s), pairs, None).total_bytes
    assert f"estimated at {estimate / GIB:.1f} GiB" in str(err.value) and "GiB resident" in str(err.value)
    assert "0.10 GiB available" in str(err.value)


def test_the_guard_trips_from_its_thread_when_memory_drops_under_the_margin():
    readings = iter([8 * GIB, 4 * GIB])
    with MemoryGuard(3 * GIB, available=lambda: next(readings, GIB // 4), margin_bytes=GIB, interval_s=0.01) as guard:
        guard.check()  # 8 GiB at the start: nothing
        deadline = time.monotonic() + 10
        with pytest.raises(MemoryExceeded, match="estimated at 3.0 GiB"):
            while time.monotonic() < deadline:
                guard.check()
                time.sleep(0.01)
    assert not guard._thread.is_alive()


def test_outputs_choose_the_files_written(tiny_result, tmp_path):
    listed = {}
    for outputs in ("report", "trace", "all"):
        write_run(tmp_path / outputs, tiny_result, outputs)
        listed[outputs] = sorted(
            str(p.relative_to(tmp_path / outputs)) for p in (tmp_path / outputs).rglob("*") if p.is_file()
        )
    assert listed["report"] == ["config.yaml", "link_kinds.csv", "links.csv", "report.json"]
    assert listed["trace"] == sorted(listed["report"] + ["trace.parquet"])
    assert listed["all"] == sorted(
        listed["trace"] + ["perfetto.json", "plots/link_utilization.png", "plots/timeline.png"]
    )
    with pytest.raises(ConfigError) as err:
        write_run(tmp_path / "bad", tiny_result, "plots")
    assert err.value.key == "--outputs" and not (tmp_path / "bad").exists()


def test_writing_stops_when_the_guard_trips(tiny_result, tmp_path):
    calls = []

    def check():
        calls.append(1)
        if len(calls) > 2:
            raise MemoryExceeded("stop")

    with pytest.raises(MemoryExceeded):
        write_run(tmp_path / "o", tiny_result, "all", check=check)
    assert (tmp_path / "o" / "report.json").exists() and not (tmp_path / "o" / "perfetto.json").exists()


def test_cli_simulate_outputs_report(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["simulate", CONFIG, "--out", str(out), "--outputs", "report"]) == 0
    files = sorted(p.name for p in out.iterdir() if not p.name.startswith("."))
    assert files == ["config.yaml", "link_kinds.csv", "links.csv", "report.json"]
    assert main(["simulate", CONFIG, "--out", str(tmp_path / "bad"), "--outputs", "none"]) == 2
    assert "--outputs: got 'none'" in capsys.readouterr().err


def _trace(rows: int) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    start = rng.random(rows)
    return pd.DataFrame(
        {
            "rank": rng.integers(0, 16, rows),
            "stream": pd.Categorical(rng.choice(["compute", "p2p", "collective"], rows)),
            "task_id": pd.Categorical([f"F:c0:m{i % 97}:s{i % 13}" for i in range(rows)]),
            "kind": pd.Categorical(rng.choice(["forward", "backward", "send"], rows)),
            "step": np.zeros(rows, int),
            "bytes": rng.random(rows) * 1e6,
            "flops": rng.random(rows) * 1e9,
            "peers": pd.Categorical(rng.choice(["", "3", "ep:0+4"], rows)),
            "start_s": start,
            "end_s": start + rng.random(rows),
        }
    )


def test_perfetto_is_written_a_chunk_at_a_time(tmp_path):
    df = _trace(1_000)
    counted = []
    assert write_perfetto(df, tmp_path / "a.json", on_rows=counted.append, chunk_rows=64) == 1_000 + 16 * 4
    assert sum(counted) == 1_000 and max(counted) == 64
    write_perfetto(df, tmp_path / "b.json", chunk_rows=10_000)
    a = json.loads((tmp_path / "a.json").read_text())
    assert a == json.loads((tmp_path / "b.json").read_text()) and a["displayTimeUnit"] == "ms"
    x = [e for e in a["traceEvents"] if e["ph"] == "X"]
    assert [e["ts"] for e in x] == (df["start_s"] * 1e6).round(3).tolist()
    assert {e["pid"] for e in x} == set(df["rank"].tolist()) and x[5]["name"] == df["task_id"].iloc[5]


def test_perfetto_memory_stays_that_of_a_chunk(tmp_path):
    df = _trace(60_000)
    tracemalloc.start()
    write_perfetto(df, tmp_path / "p.json", chunk_rows=2_000)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < (tmp_path / "p.json").stat().st_size  # 0.4x here; the whole trace's events at once: 3.9x
