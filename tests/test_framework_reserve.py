"""The framework reserve: the config's, else the profile's (cited), else 10% of HBM; shown in report.json."""

from __future__ import annotations

import pytest

from piper_sim.calibrate.load import load_profile
from piper_sim.config import load_config
from piper_sim.errors import ConfigError
from piper_sim.simulate import simulate
from piper_sim.workload.memory import FRAMEWORK_RESERVE_FRACTION, reserve_bytes

GIB = 2**30
SMALL = {"model": "small-moe", "topology": "uniform", "parallel": {"pp": 2, "ep": 2, "num_microbatches": 2}}


def test_the_reserve_is_the_configs_then_the_profiles_then_a_fraction_of_hbm():
    mi250x, cpu = load_profile("mi250x"), load_profile("cpu-dev")
    assert mi250x.hbm_bytes == pytest.approx(68_702_699_520, rel=1e-4)  # a GCD as ROCm reports it
    assert reserve_bytes(mi250x) == pytest.approx(6e9, rel=1e-3)
    assert reserve_bytes(mi250x, 2 * GIB) == 2 * GIB
    assert cpu.framework_reserve_bytes is None
    assert reserve_bytes(cpu) == pytest.approx(FRAMEWORK_RESERVE_FRACTION * cpu.hbm_bytes)


def test_a_config_sets_the_reserve_and_the_report_carries_it():
    report = simulate(load_config({**SMALL, "cost": {"profile": "mi250x", "framework_reserve_GiB": 1.5}})).report
    assert report.framework_reserve_bytes == 1.5 * GIB
    assert report.memory_headroom_bytes[0] == pytest.approx(report.hbm_bytes - 1.5 * GIB - report.peak_memory_bytes[0])
    default = simulate(load_config({**SMALL, "cost": {"profile": "mi250x"}})).report
    assert default.framework_reserve_bytes == pytest.approx(reserve_bytes(load_profile("mi250x")))
    for bad in (-1, "lots", True, 1e9):
        with pytest.raises(ConfigError) as err:
            load_config({**SMALL, "cost": {"profile": "mi250x", "framework_reserve_GiB": bad}})
        assert err.value.key == "cost.framework_reserve_GiB"


def test_a_profiles_reserve_must_leave_hbm():
    profile = {"extends": "mi250x", "framework_reserve_GiB": 70}
    with pytest.raises(ConfigError) as err:
        load_profile(profile)
    assert err.value.key == "cost.profile.framework_reserve_GiB"
