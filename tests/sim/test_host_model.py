"""The host model is a seam: with the dedicated-device default no host term (shared cores, wake-up waits)
enters a prediction, whatever the profile carries; on a topology whose ranks share cores they do."""

from __future__ import annotations

import pandas as pd
import pytest
import simpy
import yaml

from piper_sim.config import load_config
from piper_sim.paths import data_dir
from piper_sim.sim.host import DedicatedDevice, SharedCores, host_model
from piper_sim.simulator import simulate
from piper_sim.topology.load import load_topology
from piper_sim.workload.profile_file import profile_path
from piper_sim.workload.profile_load import load_profiles


def _profile_with_host_terms() -> dict:
    """mi250x plus the shared-core measurements of the calibrated CPU profile."""
    gpu = yaml.safe_load(profile_path("mi250x").read_text())
    cpu = yaml.safe_load(profile_path("cpu-2rank").read_text())["measurements"]
    return dict(
        gpu,
        name="mi250x-with-host-terms",
        measurements={"core_sharing": cpu["core_sharing"], "blocking_wait": cpu["blocking_wait"]},
    )


def _run(profile, topology: str = "uniform"):
    raw = yaml.safe_load((data_dir("examples") / "testbed-2g.yaml").read_text())
    raw.update(topology=topology, cost={"profile": profile, "allow_device_mismatch": True})  # GPU profiles on CPUs
    return simulate(load_config(raw))


@pytest.mark.parametrize("name", ["mi250x", "h100"])
def test_gpu_profiles_have_no_host_terms(name):
    device, host = load_profiles(name)
    assert host is None and device.peak_flops_per_s > 1e14


def test_host_terms_do_not_enter_a_dedicated_device_prediction():
    with_host = _profile_with_host_terms()
    device, host = load_profiles(with_host)
    assert host is not None and host.core_sharing and host.blocking_wait  # the terms are there to be ignored
    assert isinstance(host_model(simpy.Environment(), load_topology("uniform", 8), host), DedicatedDevice)
    plain, hosted = _run("mi250x"), _run(with_host)
    pd.testing.assert_frame_equal(plain.trace, hosted.trace)
    assert plain.report.step_time_s == hosted.report.step_time_s


def test_shared_cores_bring_the_host_terms_in():
    testbed = str(data_dir("topologies") / "testbed-2g.yaml")
    host = load_profiles(_profile_with_host_terms())[1]
    assert isinstance(host_model(simpy.Environment(), load_topology(testbed, 8), host), SharedCores)
    plain, hosted = _run("mi250x", testbed), _run(_profile_with_host_terms(), testbed)
    assert hosted.report.step_time_s > plain.report.step_time_s  # slowed cores and wake-up waits
