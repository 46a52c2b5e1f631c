"""Unit-suffixed keys: converted to SI once, and only finite, non-negative values of a sane size pass."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from piper_sim.errors import ConfigError
from piper_sim.units import to_si


def test_values_convert_to_si():
    assert to_si("nic_bandwidth_GBps", 25) == 25e9
    assert to_si("latency_us", 0) == 0.0
    assert to_si("hbm_GiB", 64) == 64 * 2**30


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, -1.0, 1e30, 10**400])
def test_non_finite_negative_and_absurd_values_name_the_key(value):
    with pytest.raises(ConfigError) as err:
        to_si("nic_bandwidth_GBps", value, where="topology.params.")
    message = str(err.value)
    assert message.startswith("topology.params.nic_bandwidth_GBps")
    assert "a finite number above 0, at most 1e+09" in message


@pytest.mark.parametrize("value", [".nan", ".inf", "1.0e+30"])
def test_the_cli_refuses_them_in_one_line(value, tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "piper_sim.cli",
            "simulate",
            "tiny-moe",
            "--out",
            str(tmp_path),
            "--set",
            f"topology.params.nic_bandwidth_GBps={value}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert "Traceback" not in proc.stderr and len(errors) == 1, proc.stderr
    assert errors[0].startswith("piper-sim: error: topology.params.nic_bandwidth_GBps") and "finite" in errors[0]
