"""The "testbed" topology builder and the emulator's plan: pure data, no root needed."""

from __future__ import annotations

import copy

import pytest
import yaml

from piper_sim.errors import ConfigError
from piper_sim.paths import data_dir
from piper_sim.testbed import netdev
from piper_sim.testbed.cluster_plan import make_plan, plan_from_dict
from piper_sim.topology.load import load_topology

MBIT = 1e6 / 8


def raw(name: str) -> dict:
    return yaml.safe_load((data_dir("topologies") / f"{name}.yaml").read_text())


def kinds_on(topo, src: str, dst: str) -> list[str]:
    return [topo.link_kinds[i] for i in topo.route(src, dst)]


def test_2g_links_and_capacities() -> None:
    topo = load_topology("testbed-2g")
    assert topo.num_gpus == 8 and topo.num_hosts == 4
    # per node: 2 gpus x (intra duplex + gpu_nic duplex) + NIC duplex = 10; 3 switch links x 2
    assert len(topo.links) == 4 * 10 + 3 * 2
    counts = {k: topo.link_kinds.count(k) for k in set(topo.link_kinds)}
    assert counts == {"intra": 16, "gpu_nic": 16, "nic": 8, "local": 4, "global": 2}
    cap = dict(zip(topo.links, topo.capacity_bytes_per_s, strict=True))
    assert cap[("n0.nic0", "s0")] == pytest.approx(100 * MBIT)
    assert cap[("s0", "n0.nic0")] == pytest.approx(100 * MBIT)
    assert cap[("s0", "s1")] == pytest.approx(200 * MBIT)
    assert cap[("s1", "s2")] == cap[("s2", "s1")] == pytest.approx(50 * MBIT)
    assert topo.graph.edges["n0.nic0", "s0"]["latency_s"] == pytest.approx(200e-6)
    assert topo.graph.edges["s1", "s2"]["latency_s"] == pytest.approx(1e-3)


def test_2g_routes() -> None:
    topo = load_topology("testbed-2g")
    # inside a node: through the node switch (loopback), never the shared NIC
    assert kinds_on(topo, "n0.g0", "n0.g1") == ["intra", "intra"]
    # inside a group: NIC, local switch link, NIC; the global link is not used
    assert kinds_on(topo, "n0.g0", "n1.g1") == ["gpu_nic", "nic", "local", "nic", "gpu_nic"]
    # across groups: through the one global link, bottlenecked by it
    route = topo.route("n0.g1", "n3.g0")
    assert kinds_on(topo, "n0.g1", "n3.g0") == ["gpu_nic", "nic", "local", "global", "local", "nic", "gpu_nic"]
    assert topo.path_bandwidth_bytes_per_s(route) == pytest.approx(50 * MBIT)
    assert topo.path_latency_s(route) == pytest.approx(200e-6 + 100e-6 + 1e-3 + 100e-6 + 200e-6)
    # both ranks of node 0 share one NIC link to the switch
    assert topo.route("n0.g0", "n2.g0")[1] == topo.route("n0.g1", "n2.g1")[1]
    assert topo.path_latency_s(topo.route("n0.g0", "n0.g1")) == pytest.approx(8e-6)


def test_flat() -> None:
    topo = load_topology("testbed-flat")
    assert topo.num_gpus == 8 and len(topo.links) == 4 * 10
    route = topo.route("n0.g0", "n3.g1")
    assert kinds_on(topo, "n0.g0", "n3.g1") == ["gpu_nic", "nic", "nic", "gpu_nic"]
    assert topo.path_bandwidth_bytes_per_s(route) == pytest.approx(100 * MBIT)
    assert topo.params.message_overhead_s == pytest.approx(50e-6)


@pytest.mark.parametrize(
    ("change", "key"),
    [
        (lambda p: p.update(nic_speed=1), "nic_speed"),
        (lambda p: p.update(nic_bandwidth_GBps=1), "nic_bandwidth_Mbps"),  # given twice: GBps and Mbps
        (lambda p: p.pop("nic_bandwidth_Mbps"), "nic_bandwidth_GBps"),
        (lambda p: p["nodes"].append({"switch": "s9"}), "nodes[4]"),
        (lambda p: p["switch_links"][0].update(kind="backbone"), "switch_links[0].kind"),
        (lambda p: p["switch_links"][0].update(b="s0"), "switch_links[0]"),
        (lambda p: p.update(switch_links=p["switch_links"][:2]), "switch_links"),  # groups not connected
        (lambda p: p.update(gpus_per_node=0), "gpus_per_node"),
    ],
)
def test_bad_params_name_the_key(change, key: str) -> None:
    spec = raw("testbed-2g")
    change(spec["params"])
    with pytest.raises(ConfigError) as err:
        load_topology(spec)
    assert err.value.key == f"topology.params.{key}"


def test_plan_2g() -> None:
    plan = make_plan(load_topology("testbed-2g"), "pst")
    assert plan.namespaces == [f"pst-n{h}" for h in range(4)] + [f"pst-s{i}" for i in range(4)]
    assert [h.ip for h in plan.hosts] == ["10.250.0.1", "10.250.0.2", "10.250.0.3", "10.250.0.4"]
    assert [(r.rank, r.namespace) for r in plan.ranks][:3] == [(0, "pst-n0"), (1, "pst-n0"), (2, "pst-n1")]
    assert len(plan.links) == 7
    by_name = {link.name: link for link in plan.links}
    nic = by_name["n2.nic0-s2"]
    assert (nic.a.namespace, nic.a.interface, nic.b.namespace, nic.b.interface) == ("pst-n2", "eth0", "pst-s2", "h2")
    assert nic.a_to_b.rate_bytes_per_s == pytest.approx(100 * MBIT)
    assert nic.a_to_b.delay_s == pytest.approx(200e-6)
    glob = by_name["s1-s2"]
    assert glob.kind == "global"
    assert glob.b_to_a.rate_bytes_per_s == pytest.approx(50 * MBIT) and glob.b_to_a.delay_s == pytest.approx(1e-3)
    for link in plan.links:
        assert all(len(end.interface) <= 15 for end in (link.a, link.b))
    assert plan_from_dict(plan.to_dict()) == plan


def test_plan_rejects_loops_and_bad_subnets() -> None:
    spec = copy.deepcopy(raw("testbed-2g"))
    spec["params"]["switch_links"].append({"a": "s0", "b": "s3", "bandwidth_Mbps": 50, "kind": "global"})
    looped = load_topology(spec)  # fine for the simulator
    with pytest.raises(ConfigError, match="loop-free"):
        make_plan(looped)
    topo = load_topology("testbed-flat")
    for subnet in ("192.168.0.0/24", "10.251.0.0/24", "10.250.0.0/30", "nonsense"):
        with pytest.raises(ConfigError):
            make_plan(topo, subnet=subnet)
    with pytest.raises(ConfigError):
        make_plan(topo, prefix="Bad-Prefix")
    with pytest.raises(ConfigError, match="builder: testbed"):
        make_plan(load_topology("uniform", num_gpus=16))


def test_shaping_commands() -> None:
    plan = make_plan(load_topology("testbed-2g"), "pst")
    link = plan.links[0]
    (tbf,) = netdev.shaping_commands(link.a, link.a_to_b, "tap")
    assert tbf[:8] == ["tc", "-n", "pst-n0", "qdisc", "add", "dev", "eth0", "root"]
    assert tbf[tbf.index("rate") + 1] == "100000000bit"
    netem, child = netdev.shaping_commands(link.b, link.b_to_a, "netem")
    assert netem[netem.index("delay") + 1] == "200us" and "tbf" in child and "parent" in child
    assert netdev.create_commands(link, "tap")[0][-4:] == ["eth0", "mode", "tap", "vnet_hdr"]
    assert "veth" in netdev.create_commands(link, "netem")[0]


def test_without_root_the_error_says_so(monkeypatch) -> None:
    from piper_sim.testbed import TestbedUnavailable, down, up

    monkeypatch.setattr("os.geteuid", lambda: 1000)
    for call in (lambda: up("testbed-flat", "pstt"), lambda: down("pstt")):
        with pytest.raises(TestbedUnavailable, match="needs root"):
            call()
