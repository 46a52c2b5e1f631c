"""Hostile values on the surfaces an outside fuzzer found (issue 40): each is one ConfigError naming the user's key,
never an OverflowError, a MemoryError, a TypeError or a silent accept."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import yaml

from piper_sim import cli, outputs, run_commands
from piper_sim.cli import main
from piper_sim.collectives.algorithms import check_collective_params
from piper_sim.config import load_config
from piper_sim.errors import ConfigError
from piper_sim.paths import data_dir
from piper_sim.points import dask_runner
from piper_sim.points.dask_runner import check_scheduler, probe_scheduler, run_points
from piper_sim.points.keys import KeyedPoint
from piper_sim.points.store import ResultStore, row_digest
from piper_sim.routing import trace as trace_module
from piper_sim.routing.replay import load_trace
from piper_sim.rundir import finish, is_unfinished, open_out_dir
from piper_sim.stopping import WORDS, Terminated
from piper_sim.topology.load import load_topology
from piper_sim.workload.presets import load_model
from piper_sim.workload.profile_load import load_profiles

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fuzz"))
from values import npz_bomb, wrapping_counts  # noqa: E402

HF = {
    "model_type": "mixtral",
    "num_hidden_layers": 4,
    "hidden_size": 256,
    "num_attention_heads": 4,
    "vocab_size": 1000,
    "max_position_embeddings": 256,
    "intermediate_size": 256,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
}


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("hidden_size", 10**30),
        ("hidden_size", 2**63),
        ("num_hidden_layers", 10**10),
        ("num_local_experts", 10**9),
        ("vocab_size", 2**63),
        ("max_position_embeddings", 2**40),
    ],
)
def test_hf_config_values_meet_the_yaml_paths_bounds(tmp_path: Path, key: str, value: int) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**HF, key: value}))
    with pytest.raises(ConfigError) as err:
        load_model(str(path))
    assert err.value.key == f"hf_config.{key}" and err.value.value == value
    yaml_key = {
        "hidden_size": "d_model",
        "num_hidden_layers": "num_layers",
        "num_local_experts": "num_experts",
        "vocab_size": "vocab_size",
        "max_position_embeddings": "seq_len",
    }[key]
    with pytest.raises(ConfigError, match=f"model.{yaml_key}"):  # the same bound on the YAML path
        load_model({"preset": "tiny-moe", yaml_key: value})


def _profile(tmp_path: Path, base: str, edit) -> str:
    raw = yaml.safe_load((data_dir("traces/profiles") / f"{base}.yaml").read_text())
    edit(raw)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def _framework(raw: dict) -> dict:
    return raw["measurements"]["framework_overhead"]


@pytest.mark.parametrize(
    ("edit", "key"),
    [
        (lambda r: r.update(measurements=[1, 2]), "cost.profile.measurements"),
        (lambda r: r["measurements"].update(network="x"), "cost.profile.measurements.network"),
        (
            lambda r: r["measurements"].update(optimizer={"per_tensor_us": "x"}),
            "cost.profile.measurements.optimizer.per_tensor_us",
        ),
        (lambda r: r["measurements"].update(framework_overhead=[1]), "cost.profile.measurements.framework_overhead"),
        (lambda r: _framework(r).update(micro_model="abc"), "cost.profile.measurements.framework_overhead.micro_model"),
        (
            lambda r: _framework(r).update(micro_model={"num_experts": 4}),
            "cost.profile.measurements.framework_overhead.micro_model.num_layers",
        ),
        (lambda r: _framework(r).update(shapes=[[1]]), "cost.profile.measurements.framework_overhead.shapes"),
        (
            lambda r: _framework(r)["forward"]["ops"]["embed"].update(tokens=[1]),
            "cost.profile.measurements.framework_overhead",
        ),
    ],
)
def test_profile_measurements_of_the_wrong_type_name_their_key(tmp_path: Path, edit, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_profiles(_profile(tmp_path, "cpu-2rank", edit))
    assert err.value.key == key


def test_a_mapping_key_that_is_not_a_name_is_refused_by_its_path(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("model: tiny-moe\nsim: {steps: 1, 1: 2, b: 3}\n")
    with pytest.raises(ConfigError) as err:
        load_config(str(path))
    assert err.value.key == "sim.1"
    with pytest.raises(ConfigError, match="--set sim.1"):
        load_config("tiny-moe", ["sim={1: 2, b: 3}"])


@pytest.mark.parametrize(("key", "value"), [("seed", "abc"), ("seed", 1.5), ("nic_switch_spread", "abc")])
def test_frontier_checks_seed_and_spread_with_its_default_auto_fraction(key: str, value: object) -> None:
    with pytest.raises(ConfigError) as err:
        load_topology({"preset": "frontier", "params": {key: value}}, 8)
    assert err.value.key == f"topology.params.{key}"


def test_huge_capacity_factor_and_world_are_refused() -> None:
    with pytest.raises(ConfigError, match="routing.capacity_factor"):
        load_config("tiny-moe", ["routing.capacity_factor=1.0e+300"])
    with pytest.raises(ConfigError, match="at most 1,048,576 GPUs"):
        load_config("tiny-moe", ["parallel.dp=1048576"])


@pytest.mark.parametrize(
    ("entry", "key"),
    [
        ({"halo": {"chunk_MiB": 0}}, "halo.chunk_MiB"),
        ({"halo": {"max_slices": 0}}, "halo.max_slices"),
        ({"rccl": {"net_chunk_MiB": 0}}, "rccl.net_chunk_MiB"),
        ({"rccl": {"rings": ["0 1 2"]}}, "rccl.rings"),
        ({"bogus": {"x": 1}}, "bogus"),
    ],
)
def test_a_machines_collective_parameters_are_read_whether_used_or_not(entry: dict, key: str) -> None:
    topo = load_topology({"preset": "frontier", "collectives": entry}, 8)
    with pytest.raises(ConfigError) as err:
        check_collective_params(topo)
    assert err.value.key == f"topology.collectives.{key}"


def test_an_unknown_profile_names_the_file_looked_for() -> None:
    with pytest.raises(ConfigError, match="no file .*traces/profiles/bogus.yaml"):
        load_config("tiny-moe", ["cost.profile=bogus"])


def test_set_extends_on_a_named_profile_extends_it() -> None:
    cfg = load_config("tiny-moe", ["cost.profile=mi250x", "cost.profile.extends=h100"])
    assert cfg.cost_profile == {"extends": "h100"}
    assert load_profiles(cfg.cost_profile)[0].name == load_profiles("h100")[0].name


def _trace_arrays() -> dict[str, np.ndarray]:
    with np.load(data_dir("traces/routing") / "tiny-moe-stdlib-captured.npz") as npz:
        return {k: npz[k] for k in npz.files}


def _refused_as_routing_path(path: Path) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        load_trace(str(path), 8)
    assert err.value.key == "routing.path" and err.value.value == str(path)
    return err.value


def test_a_npy_array_given_as_a_routing_trace_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "counts.npy"
    np.save(path, _trace_arrays()["counts"])
    assert "single .npy array" in _refused_as_routing_path(path).allowed


def test_a_trace_declaring_terabytes_is_refused_from_its_headers_before_loading(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "bomb.npz"
    path.write_bytes(npz_bomb(_trace_arrays(), "counts", (2**20, 2**20, 4)))  # 32 TiB declared
    assert path.stat().st_size < 10_000
    monkeypatch.setattr(trace_module.np, "load", lambda *a, **k: pytest.fail("loaded before the size check"))
    assert f"{trace_module.TRACE_BYTES_LIMIT:,}" in _refused_as_routing_path(path).allowed


@pytest.mark.parametrize(
    "edit",
    [
        lambda a: a.update(counts=wrapping_counts(a["counts"])),
        lambda a: a.update(counts=a["counts"] * 1e30),
        lambda a: a.update(meta=np.array(json.dumps({**json.loads(str(a["meta"])), "tokens_per_step": 2**63}))),
    ],
    ids=["uint64-wrapping", "float-1e30", "meta-2^63"],
)
def test_trace_counts_beyond_int64_are_refused_not_wrapped(tmp_path: Path, edit) -> None:
    arrays = _trace_arrays()
    edit(arrays)
    path = tmp_path / "t.npz"
    np.savez(path, **arrays)
    _refused_as_routing_path(path)


ROW = {"step_time_s": 0.25, "mfu": 0.4}


def _damaged_records(key: str) -> dict[str, bytes]:
    edited = {"key": key, "row": {**ROW, "step_time_s": 0.5}, "row_sha256": row_digest(ROW)}
    return {
        "truncated": json.dumps({"key": key, "row": ROW}).encode()[:20],
        "binary": bytes(range(256)),
        "empty-file": b"",
        "not-a-mapping": b"[1, 2]",
        "key-not-text": json.dumps({"key": [1], "row": ROW}).encode(),
        "row-missing": json.dumps({"key": key}).encode(),
        "row-empty": json.dumps({"key": key, "row": {}}).encode(),
        "row-nan": json.dumps({"key": key, "row": {k: float("nan") for k in ROW}}).encode(),
        "row-edited": json.dumps(edited).encode(),
        "nested-deep": b"[" * 100_000 + b"]" * 100_000,
    }


@pytest.mark.parametrize("kind", sorted(_damaged_records("k")))
def test_a_damaged_stored_point_is_recomputed_and_said(tmp_path: Path, kind: str, capsys) -> None:
    point = KeyedPoint("d" * 16, "k", {"x": 1})
    ResultStore(tmp_path).put(point.digest, point.key, ROW)
    stored = tmp_path / "points" / f"{point.digest}.json"
    stored.write_bytes(_damaged_records(point.key)[kind])
    calls = []
    store = ResultStore(tmp_path)
    rows = run_points(lambda payload: calls.append(payload) or dict(ROW), [point], store, workers=0)
    assert rows == {point.digest: ROW} and calls == [point.payload]
    assert store.tally.as_dict() == {"reused": 0, "stale": 0, "unreadable": 1, "computed": 1}
    assert "1 stored point was unreadable and is recomputed" in capsys.readouterr().err
    again = ResultStore(tmp_path)  # the recomputed row was stored whole
    assert again.get(point.digest, point.key) == ROW and again.tally.reused == 1


HOLD = """
import sys, time
from piper_sim.rundir import open_out_dir
open_out_dir(sys.argv[1], "simulate")
print("held", flush=True)
time.sleep(60)
"""


def test_a_second_command_on_a_folder_being_written_is_refused(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = sorted(p.name for p in out.iterdir())
        assert main(["simulate", "tiny-moe", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert "--out" in err and "writing this one now" in err and len(err.strip().splitlines()[-1]) < 300
        assert sorted(p.name for p in out.iterdir()) == before == [".piper-sim.json", "UNFINISHED"]  # untouched
    finally:
        holder.kill()
        holder.wait(timeout=30)
    assert main(["simulate", "tiny-moe", "--out", str(out)]) == 0  # the holder's lock went with it
    assert (out / "report.json").exists() and not is_unfinished(out)


def test_a_claimed_folder_is_free_again_once_its_command_finished(tmp_path: Path) -> None:
    out = open_out_dir(tmp_path / "out", "simulate")
    finish(out)
    done = subprocess.run(
        [sys.executable, "-c", HOLD.replace("time.sleep(60)", ""), str(out)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout.strip() == "held"


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_full_disk_names_the_file_and_out(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / ".piper-sim.json").write_text(json.dumps({"command": "sweep"}))
    (out / "sweep.csv").symlink_to("/dev/full")  # every write to it: ENOSPC
    assert main(["sweep", "tiny-moe", "--grid", "parallel.pp=1", "--workers", "0", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("piper-sim: error: --out") and "sweep.csv" in err and os.strerror(errno.ENOSPC) in err


def test_a_write_that_finds_the_disk_full_names_its_file(tmp_path: Path, monkeypatch, capsys) -> None:
    def full(*args, **kwargs) -> None:
        raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))  # as a write or close raises it: no file named

    monkeypatch.setattr(outputs, "write_perfetto", full)
    assert main(["simulate", "tiny-moe", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("piper-sim: error: --out") and "perfetto.json" in err and os.strerror(errno.EDQUOT) in err


@contextmanager
def tcp_service(greeting: bytes | None):
    """A throwaway TCP server on localhost that sends `greeting` on accept (None: waits, silent) and holds the
    connection; yields its tcp:// address."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = server.accept()
                held.append(conn)
                if greeting is not None:
                    conn.sendall(greeting)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"tcp://127.0.0.1:{server.getsockname()[1]}"
    finally:
        server.close()
        for conn in held:
            conn.close()


def test_a_scheduler_address_that_is_not_dask_is_refused_saying_what_answered(capsys) -> None:
    greeting = b"SSH-2.0-OpenSSH_9.6\r\n"  # as Dask reads it: a message of 3.5e18 bytes
    with tcp_service(greeting) as address:
        with pytest.raises(ConfigError) as err:
            check_scheduler(address)
        assert err.value.key == "--scheduler" and "not Dask" in err.value.allowed
        assert main(["sweep", "tiny-moe", "--grid", "parallel.pp=1", "--scheduler", address, "--out", "unused"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("piper-sim: error: --scheduler")


def test_a_silent_service_is_refused_after_the_connect_timeout(monkeypatch) -> None:
    monkeypatch.setattr(dask_runner, "CONNECT_TIMEOUT_S", 0.5)
    with tcp_service(None) as address:
        start = time.perf_counter()
        with pytest.raises(ConfigError, match="sent nothing") as err:
            check_scheduler(address)
    assert err.value.key == "--scheduler" and time.perf_counter() - start < 5


@pytest.mark.parametrize("address", ["ucx://127.0.0.1:8786", "tls://127.0.0.1:8786", "inproc://x", "tcp://host"])
def test_an_unsupported_scheduler_protocol_is_refused_by_name(address: str) -> None:
    with pytest.raises(ConfigError) as err:
        check_scheduler(address)
    assert err.value.key == "--scheduler" and (
        address.split(":")[0] + "://" in err.value.allowed or "HOST:PORT" in err.value.allowed
    )


def test_a_dask_scheduler_passes_the_probe() -> None:
    from distributed import LocalCluster

    with LocalCluster(n_workers=0, processes=False, protocol="tcp://", dashboard_address=None) as cluster:
        check_scheduler(cluster.scheduler_address)
        probe_scheduler(cluster.scheduler_address.removeprefix("tcp://"))  # host:port is tcp


def _cli(argv: list[str], cwd: Path, timeout_s: float = 120) -> subprocess.CompletedProcess:
    """piper-sim in a subprocess, killed at the time limit (a hang fails the test, never the suite)."""
    return subprocess.run(
        [sys.executable, "-m", "piper_sim.cli", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize(
    ("argv", "key"),
    [
        (["reproduce", "a2a-levels", "--quick", "--workers", "-1"], "--workers"),
        (["reproduce", "a2a-levels", "--quick", "--workers", "1000"], "--workers"),
        (
            [
                "study",
                "scaling",
                "tiny-moe",
                "--gpus",
                "8,99999999999",
                "--strong",
                "--global-batch",
                "8",
                "--topology",
                "uniform",
            ],
            "--gpus",
        ),
    ],
    ids=["reproduce-workers--1", "reproduce-workers-1000", "scaling-gpus-1e11"],
)
def test_worker_and_gpu_counts_beyond_their_bounds_are_refused_at_once(
    tmp_path: Path, argv: list[str], key: str
) -> None:
    done = _cli([*argv, "--out", "out"], tmp_path, timeout_s=60)
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1].startswith(f"piper-sim: error: {key}")
    assert not (tmp_path / "out").exists()  # refused before the folder was claimed


def test_workers_up_to_the_cores_are_taken() -> None:
    dask_runner.check_workers(dask_runner.workers_limit())
    dask_runner.check_workers(0)
    with pytest.raises(ConfigError):
        dask_runner.check_workers(dask_runner.workers_limit() + 1)


def _sweep_on_a_cluster(tmp_path: Path) -> subprocess.Popen:
    """A sweep on a LocalCluster of 2 workers, in a process group of its own, once its first point is stored (the
    workers are up and computing)."""
    grid = "sim.steps=" + ",".join(str(n) for n in range(4, 40))
    proc = subprocess.Popen(
        [sys.executable, "-m", "piper_sim.cli", "sweep", "small-moe", "--grid", grid, "--workers", "2", "--out", "out"],
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while not list((tmp_path / "out" / "points").glob("*.json")):
        assert proc.poll() is None and time.monotonic() < deadline, "the sweep ended or stalled before its first point"
        time.sleep(0.2)
    return proc


def _stderr_after(proc: subprocess.Popen, timeout_s: float = 60) -> str:
    try:
        return proc.communicate(timeout=timeout_s)[1]  # ends when the workers and the resource tracker have too
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def test_ctrl_c_of_a_run_on_a_local_cluster_prints_one_line(tmp_path: Path) -> None:
    proc = _sweep_on_a_cluster(tmp_path)
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: to the whole process group, workers included
    err = _stderr_after(proc)
    assert proc.returncode == 130 and err.strip().splitlines()[-1] == "piper-sim: interrupted"
    assert "Traceback" not in err and "KeyboardInterrupt" not in err and "ERROR" not in err


def test_a_killed_run_leaves_no_resource_tracker_warning(tmp_path: Path) -> None:
    proc = _sweep_on_a_cluster(tmp_path)
    proc.kill()  # SIGKILL of the command alone: its workers and resource tracker outlive it
    err = _stderr_after(proc)
    assert proc.returncode == -signal.SIGKILL and "leaked semaphore" not in err and "Traceback" not in err


@pytest.mark.parametrize(("stop", "code"), [(KeyboardInterrupt, 130), (Terminated, 143)])
def test_a_stopped_testbed_run_says_the_testbed_stays_up(tmp_path: Path, monkeypatch, capsys, stop, code) -> None:
    def stopped(args) -> int:
        raise stop  # as the signal lands while the ranks run

    monkeypatch.setattr(run_commands, "cmd_run", stopped)
    assert cli.main(["testbed", "run", "testbed-2g", "--prefix", "pst", "--out", str(tmp_path / "o")]) == code
    err = capsys.readouterr().err.strip().splitlines()
    assert "the testbed stays up" in err[-2] and "testbed down --prefix pst" in err[-2]
    assert err[-1] == f"piper-sim: {WORDS[code]}"
