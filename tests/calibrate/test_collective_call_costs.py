"""gloo's per-call cost of all_gather_into_tensor and reduce_scatter_tensor: measured by calibrate (also on its own
into an existing profile, `calibrate --benches`), carried by the CPU profiles and charged by the simulator for
ZeRO's gathers and reduce-scatters and the context-parallel ring; validation leaves nonblocking collectives' rows
out of its phase times."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest
import yaml

from piper_sim.calibrate.cli import check_options
from piper_sim.calibrate.update import check_benches, update_network, with_network
from piper_sim.cli import build_parser
from piper_sim.config import load_config
from piper_sim.errors import ConfigError, PiperError
from piper_sim.schedule.build import build_schedule
from piper_sim.simulator import simulate
from piper_sim.validation.scoring import issued_tasks, phase_times
from piper_sim.workload.profile_file import profile_path
from piper_sim.workload.profile_load import load_profile

CPU_PROFILES = ("cpu-dev", "cpu-2rank", "cpu-8rank")
SHARDED = ("all_gather", "reduce_scatter")


def _fit_s(raw: dict, kind: str, series: str) -> float:
    return raw["measurements"]["network"]["local"][kind][series]["fit"]["overhead_us"] * 1e-6


@pytest.mark.parametrize("name", CPU_PROFILES)
def test_the_cpu_profiles_carry_measured_gather_and_reduce_scatter_call_costs(name):
    raw = yaml.safe_load(profile_path(name).read_text())
    profile = load_profile(name)
    for kind in SHARDED:
        for series in raw["measurements"]["network"]["local"][kind]:
            size = int(series.rpartition("_")[2])
            assert profile.collective_call_s(kind, size) == pytest.approx(_fit_s(raw, kind, series))
            assert _fit_s(raw, kind, series) > 0
    runs = raw["measurements"]["network"]["separate_runs"]
    assert any(
        set(SHARDED) <= set(run["benches"])
        and run["command"].startswith("piper-sim calibrate")
        and run["ranks"] == raw["machine"]["ranks"]
        for run in runs
    )


def _profile_with_costs(gather_us: float, scatter_us: float) -> dict:
    raw = yaml.safe_load(profile_path("cpu-dev").read_text())
    local = raw["measurements"]["network"]["local"]
    for kind, us in (("all_gather", gather_us), ("reduce_scatter", scatter_us)):
        local[kind] = {"groups_of_2": {"fit": {"overhead_us": us}}, "groups_of_4": {"fit": {"overhead_us": us}}}
    return raw


@pytest.mark.parametrize(
    "plan",
    [
        {"optimizer": {"zero": 3}},
        {"optimizer": {"zero": 1}},
        {"parallel": {"pp": 2, "ep": 2, "cp": 2, "num_microbatches": 2}},
    ],
)
def test_the_simulator_charges_each_gather_and_reduce_scatter_the_profiles_call_cost(plan):
    raw = {
        "model": {"preset": "tiny-moe", "num_layers": 2},
        "sim": {"steps": 1},
        "parallel": {"pp": 2, "ep": 2, "num_microbatches": 2},
        "cost": {"profile": _profile_with_costs(700, 300)},
        **plan,
    }
    trace = simulate(load_config(raw)).trace
    for kind, cost_s in (("all_gather", 700e-6), ("reduce_scatter", 300e-6)):
        rows = trace[trace["kind"] == kind]
        assert len(rows) > 0
        assert rows["cpu_s"].to_numpy() == pytest.approx(cost_s)  # one library call each (as the torch backend)
        assert ((rows["end_s"] - rows["start_s"]) >= cost_s).all()


def test_benches_are_checked_before_anything_is_measured(tmp_path):
    assert check_benches("reduce_scatter, all_gather") == ("all_gather", "reduce_scatter")  # in running order
    for bad in ("all_gather,broadcast", " , "):
        with pytest.raises(ConfigError) as err:
            check_benches(bad)
        assert err.value.key == "--benches"
    args = build_parser().parse_args(
        ["calibrate", "--out", str(tmp_path / "p.yaml"), "--benches", "all_gather", "--testbed", "pst"]
    )
    with pytest.raises(ConfigError) as err:
        check_options(args)
    assert err.value.key == "--testbed"
    with pytest.raises(PiperError, match="no profile"):
        update_network(tmp_path / "absent.yaml", ranks=4, benches=("all_gather",), quick=True, command="")
    (tmp_path / "bad.yaml").write_text("a: [1,\n")
    with pytest.raises(PiperError, match="cannot read"):
        update_network(tmp_path / "bad.yaml", ranks=4, benches=("all_gather",), quick=True, command="")
    with pytest.raises(ConfigError) as err:  # cpu-dev was calibrated with 4 ranks
        update_network(profile_path("cpu-dev"), ranks=2, benches=("all_gather",), quick=True, command="")
    assert err.value.key == "--ranks"


def _records(time_us: float) -> list[dict]:
    return [
        {
            "rank": r,
            "machine": {"threads_per_rank": 1},
            "records": [
                {
                    "bench": kind,
                    "level": "local",
                    "group_size": 2,
                    "groups": 2,
                    "bytes": size,
                    "time_s": (time_us + size / 1e3) * 1e-6,
                }
                for kind in ("all_gather", "all_reduce")
                for size in (1024, 65536, 1048576)
            ],
        }
        for r in range(4)
    ]


def test_a_separate_run_replaces_only_its_benches_and_is_recorded():
    raw = yaml.safe_load(profile_path("cpu-dev").read_text())
    run = {"benches": ["all_gather"], "command": "piper-sim calibrate --benches all_gather", "ranks": 4}
    updated = with_network(raw, _records(900.0), run)
    network = updated["measurements"]["network"]
    assert network["local"]["all_gather"]["groups_of_2"]["fit"]["overhead_us"] == pytest.approx(900.0, rel=1e-3)
    assert network["local"]["all_gather"]["groups_of_2"]["fit"]["bandwidth_GBps"] == pytest.approx(1.0, rel=1e-3)
    # the all_reduce it also recorded is not among its benches: the profile's stays
    assert network["local"]["all_reduce"] == raw["measurements"]["network"]["local"]["all_reduce"]
    assert network["separate_runs"][-1] == run
    assert {k: v for k, v in updated.items() if k != "measurements"} == {
        k: v for k, v in raw.items() if k != "measurements"
    }
    assert load_profile(updated).collective_call_s("all_gather", 2) == pytest.approx(900e-6, rel=1e-3)


def test_phase_times_leave_out_the_nonblocking_collectives():
    schedule = build_schedule(
        load_config(
            {"model": "tiny-moe", "parallel": {"pp": 2, "ep": 2, "num_microbatches": 2}, "optimizer": {"zero": 3}}
        )
    )
    issued = issued_tasks(schedule)
    nonblocking = next(t for t in schedule.stage_programs[0] if t.nonblocking)
    blocking = next(t for t in schedule.stage_programs[0] if t.kind == "forward")
    assert nonblocking.task_id in issued and blocking.task_id not in issued
    rows = pd.DataFrame(
        {
            "step": [1, 1, 1],
            "rank": [0, 0, 0],
            "task_id": [nonblocking.task_id, blocking.task_id, "F:send"],
            "kind": [nonblocking.kind.value, "forward", "send"],
            "start_s": [0.0, 0.0, 0.0],
            "end_s": [5.0, 1.0, 7.0],
        }
    )
    assert phase_times(rows, issued).to_dict() == {"forward": 1.0}
    assert phase_times(rows)[nonblocking.kind.value] == 5.0  # without the schedule's ids it is counted


@pytest.mark.slow  # two gloo ranks measure the two collectives (quick sizes), about 20 s on 2 cores
def test_a_separate_run_measures_the_collectives_into_a_profile(tmp_path):
    out = tmp_path / "cpu-2rank.yaml"
    original = profile_path("cpu-2rank").read_text()
    out.write_text(original)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "piper_sim.cli",
            "calibrate",
            "--out",
            str(out),
            "--ranks",
            "2",
            "--quick",
            "--benches",
            "all_gather,reduce_scatter",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    raw, before = yaml.safe_load(out.read_text()), yaml.safe_load(original)
    local = raw["measurements"]["network"]["local"]
    for kind in SHARDED:
        entry = local[kind]["groups_of_2"]
        assert entry["bytes"] == [1024, 16384, 262144] and all(t > 0 for t in entry["time_us"])
        assert load_profile(out).collective_call_s(kind, 2) == pytest.approx(_fit_s(raw, kind, "groups_of_2"))
    assert local["all_to_all"] == before["measurements"]["network"]["local"]["all_to_all"]
    run = raw["measurements"]["network"]["separate_runs"][-1]
    assert run["benches"] == list(SHARDED) and run["sweep"] == "quick" and run["ranks"] == 2
    assert "device_kind: cpu    # what topologies match" in out.read_text()  # its comments kept
