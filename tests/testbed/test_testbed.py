"""The emulated cluster: namespaces, shaped links, clean teardown, measured bandwidth and RTT.

Needs root and iproute2 (ip, tc); skipped with the reason otherwise. Uses the prefix "pstt" so a
testbed someone keeps up under the default prefix is never touched.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from piper_sim.testbed import down, exec_in, measure_link, status, unavailable_reason, up
from piper_sim.testbed.emulator import default_state_path
from piper_sim.testbed.processes import PACKAGE_ROOT, delayline_pids
from piper_sim.testbed.shell import TestbedError, list_namespaces
from piper_sim.topology.load import load_topology

REASON = unavailable_reason()
pytestmark = [pytest.mark.root, pytest.mark.skipif(REASON is not None, reason=REASON or "")]
PREFIX = "pstt"


def snapshot() -> dict[str, str]:
    """What the root namespace shows: namespaces, interfaces (without counters), qdiscs."""

    def out(*argv: str) -> str:
        return subprocess.run(argv, check=True, capture_output=True, text=True).stdout

    links = sorted(line.split(":")[1].strip() for line in out("ip", "-o", "link", "show").splitlines())
    return {"netns": out("ip", "netns", "list"), "links": "\n".join(links), "qdisc": out("tc", "qdisc", "show")}


def configured_rtt_s(topology: str, host_a: int, host_b: int) -> float:
    topo = load_topology(topology)
    a, b = f"n{host_a}.nic0", f"n{host_b}.nic0"
    return topo.path_latency_s(topo.route(a, b)) + topo.path_latency_s(topo.route(b, a))


@pytest.fixture
def clean():
    down(PREFIX)
    before = snapshot()
    yield before
    down(PREFIX)


def test_up_down_leaves_nothing(clean) -> None:
    bed = up("testbed-flat", PREFIX)
    assert sorted(ns for ns in list_namespaces() if ns.startswith(f"{PREFIX}-")) == sorted(bed.plan.namespaces)
    st = status(PREFIX)
    assert st["healthy"] and st["missing_namespaces"] == []
    assert bed.rank_map()[7] == (f"{PREFIX}-n3", "10.250.0.4")
    state = json.loads(default_state_path(PREFIX).read_text())
    assert state["rank_map"]["2"] == [f"{PREFIX}-n1", "10.250.0.2"] and len(state["plan"]["links"]) == 4
    addr = subprocess.run(
        exec_in(1, ["ip", "-o", "-4", "addr", "show", "dev", "eth0"], prefix=PREFIX),
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert "10.250.0.2/24" in addr
    qdiscs = subprocess.run(
        ["tc", "-n", f"{PREFIX}-s0", "qdisc", "show", "dev", "h1"], check=True, capture_output=True, text=True
    ).stdout
    assert "tbf" in qdiscs and "rate 100Mbit" in qdiscs
    with pytest.raises(TestbedError, match="already up"):
        up("testbed-flat", PREFIX)
    removed = down(PREFIX)
    assert sorted(removed["namespaces"]) == sorted(bed.plan.namespaces)
    assert snapshot() == clean
    assert not default_state_path(PREFIX).exists() and delayline_pids(PREFIX) == []
    assert down(PREFIX) == {"processes": [], "namespaces": [], "links": [], "files": []}  # idempotent
    assert not status(PREFIX)["up"]


def test_down_after_crash_finds_leftovers_by_prefix(clean, tmp_path: Path) -> None:
    """The process that ran up() dies; its state file is lost; down(prefix) still removes everything."""
    state = tmp_path / "state.json"
    code = f"from piper_sim.testbed import up; up('testbed-2g', {PREFIX!r}, state_path={str(state)!r})"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=PACKAGE_ROOT, timeout=60)
    bed_delayline = delayline_pids(PREFIX)
    state.unlink()
    stray = subprocess.Popen(exec_in(0, ["sleep", "60"], prefix=PREFIX))  # a process left inside a node
    try:
        time.sleep(0.2)
        removed = down(PREFIX)
    finally:
        if stray.poll() is None:
            stray.kill()
        stray.wait()
    assert len(removed["namespaces"]) == 8
    assert set(bed_delayline) <= set(removed["processes"]) and stray.pid in removed["processes"]
    assert snapshot() == clean and delayline_pids(PREFIX) == []


def test_nic_link_bandwidth_and_rtt(clean) -> None:
    up("testbed-flat", PREFIX)
    m = measure_link(PREFIX, 0, 1, 3_000_000)
    rate = 100e6 / 8
    assert 0.75 * rate <= m.bandwidth_bytes_per_s <= 1.25 * rate, m
    want = configured_rtt_s("testbed-flat", 0, 1)  # 4 x 0.2 ms
    assert 0.8 * want <= m.rtt_min_s <= 1.5 * want + 0.2e-3, m


def test_veth_links_without_delay(clean) -> None:
    """delay="none": plain veth pairs with tbf (the netem mode's data path, minus netem)."""
    bed = up("testbed-flat", PREFIX, delay="none")
    assert bed.delay_mode == "none" and bed.delayline_pid is None and delayline_pids(PREFIX) == []
    m = measure_link(PREFIX, 2, 3, 3_000_000)
    assert 0.75 * 100e6 / 8 <= m.bandwidth_bytes_per_s <= 1.25 * 100e6 / 8, m
    assert m.rtt_min_s < 0.5e-3, m  # no emulated latency (the delayed flat testbed has 0.8 ms)


def test_failed_up_removes_what_it_created(clean, monkeypatch) -> None:
    from piper_sim.testbed import netdev

    def broken(link, mode, bridges):
        if link.kind == "global":
            raise TestbedError("injected failure")
        return original(link, mode, bridges)

    original = netdev.link_commands
    monkeypatch.setattr(netdev, "link_commands", broken)
    with pytest.raises(TestbedError, match="injected"):
        up("testbed-2g", PREFIX)
    assert snapshot() == clean and not default_state_path(PREFIX).exists() and delayline_pids(PREFIX) == []


def test_global_link_is_slower_than_inside_a_group(clean) -> None:
    up("testbed-2g", PREFIX)
    local = measure_link(PREFIX, 0, 1, 3_000_000)
    remote = measure_link(PREFIX, 0, 2, 3_000_000)
    back = measure_link(PREFIX, 3, 1, 1_000_000)
    assert remote.bandwidth_bytes_per_s < 0.75 * local.bandwidth_bytes_per_s, (local, remote)
    assert 0.75 * 50e6 / 8 <= remote.bandwidth_bytes_per_s <= 1.25 * 50e6 / 8, remote
    assert 0.75 * 50e6 / 8 <= back.bandwidth_bytes_per_s <= 1.25 * 50e6 / 8, back
    for m, (a, b) in ((local, (0, 1)), (remote, (0, 2)), (back, (3, 1))):
        want = configured_rtt_s("testbed-2g", a, b)
        assert 0.8 * want <= m.rtt_min_s <= 1.5 * want + 0.2e-3, (want, m)
    assert remote.rtt_min_s > local.rtt_min_s + 1.5e-3


def test_status_of_a_testbed_that_is_down_exits_non_zero(capsys):
    from piper_sim.cli import main

    assert main(["testbed", "status", "--prefix", "pstz"]) == 1
    assert json.loads(capsys.readouterr().out)["up"] is False


def _up_in_a_process(prefix: str, created: int) -> subprocess.Popen:
    """`piper-sim testbed up testbed-2g` (8 namespaces) in a process of its own, returned once it has created
    `created` namespaces, part-way through."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "piper_sim", "testbed", "up", "testbed-2g", "--prefix", prefix],
        cwd=PACKAGE_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while sum(ns.startswith(f"{prefix}-") for ns in list_namespaces()) < created:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.005)
    return proc


@pytest.mark.parametrize(
    ("sig", "times", "code"), [(signal.SIGINT, 1, 130), (signal.SIGTERM, 1, 143), (signal.SIGINT, 3, 130)]
)
def test_up_stopped_part_way_removes_what_it_created(clean, sig, times, code) -> None:
    """Ctrl-C or SIGTERM while `testbed up` builds: it removes everything and says so; more Ctrl-Cs while it
    removes do not cut the removal short."""
    proc = _up_in_a_process(PREFIX, 3)
    for _ in range(times):
        proc.send_signal(sig)
        time.sleep(0.01)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert "stopped part-way; what it had created is removed" in err and "Traceback" not in err
    assert snapshot() == clean and not default_state_path(PREFIX).exists() and delayline_pids(PREFIX) == []


def test_up_killed_part_way_leaves_what_down_removes(clean, capsys) -> None:
    """SIGKILL leaves a half-built testbed: status exits 1, a second up refuses naming the command that removes
    it, and `testbed down` leaves nothing."""
    from piper_sim.cli import main

    proc = _up_in_a_process(PREFIX, 3)
    proc.kill()
    proc.communicate(timeout=60)
    assert snapshot() != clean
    assert main(["testbed", "status", "--prefix", PREFIX]) == 1
    assert main(["testbed", "up", "testbed-2g", "--prefix", PREFIX]) == 2
    assert f"left over ({PREFIX}-" in capsys.readouterr().err
    assert main(["testbed", "up", "testbed-2g", "--prefix", PREFIX]) == 2
    assert f"run `piper-sim testbed down --prefix {PREFIX}` first" in capsys.readouterr().err
    assert main(["testbed", "down", "--prefix", PREFIX]) == 0
    assert snapshot() == clean and not default_state_path(PREFIX).exists() and delayline_pids(PREFIX) == []
