"""Ranks that share a machine's cores (the emulated testbed) compute under processor sharing."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from piper_sim.config import load_config
from piper_sim.simulator import simulate

RAW = {"model": "tiny-moe", "parallel": {"pp": 1, "ep": 8, "num_microbatches": 2}}


def first_forward_s(cores: int, profile: str | dict | None = None) -> float:
    # a GPU profile on the CPU testbed (asked for): its cores' sharing alone, without cpu-2rank's measured terms
    raw = {
        **RAW,
        "topology": {"preset": "testbed-flat", "params": {"shared_cores": cores}},
        "cost": {"profile": "mi250x" if profile is None else profile, "allow_device_mismatch": True},
    }
    trace = simulate(load_config(raw)).trace
    first = trace[(trace["task_id"] == "F:c0:m0:s0")]
    assert len(first) == 8 and first["start_s"].nunique() == 1  # all eight ranks start it together
    return float((first["end_s"] - first["start_s"]).iloc[0])


def test_eight_ranks_on_one_core_take_eight_times_longer():
    assert first_forward_s(1) == pytest.approx(8 * first_forward_s(0), rel=1e-9)


def test_eight_ranks_on_two_cores_take_four_times_longer():
    assert first_forward_s(2) == pytest.approx(4 * first_forward_s(0), rel=1e-9)


def test_more_cores_than_ranks_changes_nothing():
    assert first_forward_s(16) == pytest.approx(first_forward_s(0), rel=1e-9)


def _profile_with_core_sharing(levels: list[float], factors: list[float]) -> dict:
    from piper_sim.paths import data_dir

    raw = yaml.safe_load((data_dir("traces/profiles") / "mi250x.yaml").read_text())
    raw["measurements"] = {"core_sharing": {"ranks_per_core": levels, "cpu_time_factor": factors}}
    return raw


def test_ranks_taking_turns_on_a_core_pay_the_measured_core_sharing_factor():
    plain = first_forward_s(0)
    profile = _profile_with_core_sharing([1, 2, 4], [1.0, 1.1, 1.3])
    assert first_forward_s(0, profile) == pytest.approx(plain, rel=1e-9)  # no shared cores: nothing changes
    assert first_forward_s(2, profile) == pytest.approx(4 * 1.3 * plain, rel=1e-9)  # 8 ranks on 2 cores: 4 per core
    assert first_forward_s(4, profile) == pytest.approx(2 * 1.1 * plain, rel=1e-9)
    assert first_forward_s(8, profile) == pytest.approx(plain, rel=1e-9)  # one per core: no sharing


def test_a_malformed_core_sharing_table_is_one_clear_error():
    from piper_sim.errors import ConfigError

    with pytest.raises(ConfigError, match="core_sharing"):
        simulate(load_config({**RAW, "cost": {"profile": _profile_with_core_sharing([2, 1], [1.0, 1.2])}}))


def test_an_all_to_all_in_a_group_of_one_costs_its_measured_host_work():
    # ep 1: the torch backend keeps the rows and makes no library call; the host work around the exchange
    # (packing the expert ids into the dispatched rows, passing the rows) is what the profile measured for it
    from piper_sim.paths import data_dir

    profile = yaml.safe_load((data_dir("traces/profiles") / "cpu-2rank.yaml").read_text())
    ops = profile["measurements"]["framework_overhead_by_model"]["tiny-moe"]["forward"]["ops"]
    for op in ("dispatch:0", "combine:0"):
        ops.pop(op, None)
    raw = {
        **RAW,
        "parallel": {"pp": 2, "ep": 1, "num_microbatches": 2, "micro_batch_size": 2},
        "model": {"preset": "tiny-moe", "seq_len": 128},
        "topology": {"preset": "testbed-flat", "params": {"shared_cores": 2}},
        "cost": {"profile": profile},
    }

    def durations() -> dict[bool, np.ndarray]:
        trace = simulate(load_config(raw)).trace
        a2a = trace[trace["kind"] == "all_to_all"]
        forward_dispatch = a2a["task_id"].str.startswith("F:") & (a2a["role"] == "dispatch")
        return {f: (a2a["end_s"] - a2a["start_s"])[forward_dispatch == f].to_numpy() for f in (True, False)}

    unmeasured = durations()
    assert all(len(d) > 0 and (d == 0).all() for d in unmeasured.values())  # nothing measured: nothing charged
    for op, times_us in (("dispatch:0", [300.0, 400.0, 500.0]), ("combine:0", [30.0, 40.0, 50.0])):
        ops[op] = {
            "kernels": 5,
            "views": 0,
            "time_us": times_us[0],
            "tokens": [8, 256, 1024],
            "time_us_by_tokens": times_us,
        }
    measured = durations()  # 2 x 128 tokens: the times measured at 256 tokens (2 ranks, one core each)
    assert measured[True] == pytest.approx(400e-6, rel=1e-6)
    assert measured[False] == pytest.approx(40e-6, rel=1e-6)


def _profile_with_blocking_wait(loads: list[float], extra_us: list[float], slice_us: float = 1000.0) -> dict:
    raw = _profile_with_core_sharing([1], [1.0])
    raw["measurements"]["blocking_wait"] = {
        "computing_per_core": loads,
        "extra_per_call_us": extra_us,
        "scheduler_slice_us": slice_us,
    }
    return raw


def _first_dispatch(profile: dict | None, parallel: dict | None = None) -> tuple[float, float, float]:
    """(end of the first forward, end of the first dispatch all-to-all, step time) on testbed-flat's two cores."""
    raw = {**RAW, "topology": {"preset": "testbed-flat", "params": {"shared_cores": 2}}}
    if parallel:
        raw["parallel"] = parallel
    if profile is not None:
        raw["cost"] = {"profile": profile, "allow_device_mismatch": True}  # mi250x with host terms, on the testbed
    result = simulate(load_config(raw))
    trace = result.trace
    forward = trace[(trace["kind"] == "forward") & (trace["rank"] == 0)].iloc[0]
    a2a = trace[(trace["kind"] == "all_to_all") & (trace["rank"] == 0)].iloc[0]
    return float(forward["end_s"]), float(a2a["end_s"]), float(trace["end_s"].max())


def test_a_blocking_exchange_waits_the_measured_extra_per_call_at_the_recent_load():
    w_s, slice_s = 100e-6, 1e-3
    plain = _profile_with_core_sharing([1], [1.0])
    forward_end, done, _ = _first_dispatch(plain)
    # the extra grows linearly with the load (w per call at one rank computing per core)
    _, waited, _ = _first_dispatch(_profile_with_blocking_wait([0, 10], [0, 10 * w_s * 1e6], slice_s * 1e6))
    # 8 ranks computed together on 2 cores from 0 to forward_end; the load, averaged over the last scheduler
    # slice, has decayed since, while the exchange ran
    load = 4 * (1 - np.exp(-forward_end / slice_s)) * np.exp(-(done - forward_end) / slice_s)
    assert 0 < load < 4
    assert waited - done == pytest.approx(2 * w_s * load, rel=1e-6)  # flat: two library calls


def test_a_constant_blocking_wait_adds_it_per_call_and_nothing_without_shared_cores():
    plain = _profile_with_core_sharing([1], [1.0])
    _, done, _ = _first_dispatch(plain)
    _, waited, _ = _first_dispatch(_profile_with_blocking_wait([0, 10], [300, 300]))
    assert waited - done == pytest.approx(2 * 300e-6, rel=1e-6)
    raw = {**RAW, "cost": {"profile": _profile_with_blocking_wait([0, 10], [300, 300])}}  # no shared cores
    ends = [simulate(load_config(r)).trace["end_s"].max() for r in (raw, {**RAW, "cost": {"profile": plain}})]
    assert ends[0] == pytest.approx(ends[1], rel=1e-12)


def test_a_rank_blocked_on_a_pipeline_transfer_waits_too():
    # pp2 ep1: no library call in the all-to-alls (groups of one); the second stage blocks on its receives
    parallel = {"pp": 2, "ep": 1, "num_microbatches": 2}
    _, _, plain = _first_dispatch(_profile_with_core_sharing([1], [1.0]), parallel)
    _, _, waited = _first_dispatch(_profile_with_blocking_wait([0, 10], [300, 300]), parallel)
    assert waited >= plain + 300e-6


def test_a_malformed_blocking_wait_table_is_one_clear_error():
    from piper_sim.errors import ConfigError

    with pytest.raises(ConfigError, match="blocking_wait"):
        simulate(load_config({**RAW, "cost": {"profile": _profile_with_blocking_wait([1, 0.5], [1, 2])}}))
    with pytest.raises(ConfigError, match="blocking_wait"):
        simulate(load_config({**RAW, "cost": {"profile": _profile_with_blocking_wait([0, 1], [1, 2], 0)}}))


def test_the_trace_carries_the_cpu_priced_for_each_task_before_sharing():
    raw = {**RAW, "topology": {"preset": "testbed-flat", "params": {"shared_cores": 0}}}
    alone = simulate(load_config(raw)).trace
    compute = alone[alone["stream"] == "compute"]
    # with nothing sharing the cores a compute task lasts exactly the work priced for it
    assert np.allclose(compute["cpu_s"], compute["end_s"] - compute["start_s"], rtol=1e-9, atol=0)
    assert (compute["cpu_s"] > 0).all()
    assert alone.loc[alone["kind"].isin(["send", "recv"]), "cpu_s"].isna().all()
    collectives = alone[alone["stream"] == "collective"]
    assert collectives["cpu_s"].notna().all() and (collectives["cpu_s"] >= 0).all()
    # two ranks per core: the same work priced, in more wall time
    raw["topology"]["params"]["shared_cores"] = 4
    shared = simulate(load_config(raw)).trace
    keys = ["step", "rank", "task_id"]
    both = compute.merge(shared[shared["stream"] == "compute"], on=keys, suffixes=("", "_shared"))
    assert len(both) == len(compute)
    assert np.allclose(both["cpu_s_shared"], both["cpu_s"], rtol=1e-12)
    assert ((both["end_s_shared"] - both["start_s_shared"]) > (both["end_s"] - both["start_s"]) * 1.5).all()
