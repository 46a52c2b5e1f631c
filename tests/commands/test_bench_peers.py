"""benchmarks/bench_peers.py without SimuMax: one line saying so, status 0 (the comparison needs a SimuMax copy)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("given", [False, True], ids=["no-flag", "no-simumax-in-dir"])
def test_bench_peers_without_simumax_says_so_and_exits_0(tmp_path, given):
    script = ROOT / "benchmarks" / "bench_peers.py"
    cmd = [sys.executable, str(script)] + (["--simumax", str(tmp_path)] if given else [])
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PIPER_SIM_PROGRESS": "0"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("bench_peers: no SimuMax") and "nothing run" in lines[0]
    assert out.stderr == ""
