"""Frontier node graph, dragonfly fabric, DGX rails, placements and their config errors.

Expected numbers are restated here from DESIGN.md section 5 (OLCF Frontier User Guide) and closed forms,
not imported from the builders.
"""

from __future__ import annotations

import itertools
import random
import time

import networkx as nx
import pytest

from piper_sim.errors import ConfigError
from piper_sim.topology.graph import Topology
from piper_sim.topology.load import load_topology
from piper_sim.topology.placement import PLACEMENTS, place

GB = 1e9
# xGMI links between GCD pairs (50 GB/s each per direction), DESIGN.md section 5.
XGMI = {
    (0, 1): 4,
    (2, 3): 4,
    (4, 5): 4,
    (6, 7): 4,
    (0, 6): 2,
    (2, 4): 2,
    (0, 2): 1,
    (1, 3): 1,
    (1, 5): 1,
    (3, 7): 1,
    (4, 6): 1,
    (5, 7): 1,
}
NIC_GCD = {0: 1, 1: 3, 2: 5, 3: 7}  # NIC k hangs off GCD NIC_GCD[k]


def frontier(num_gpus: int = 8 * 512, **params) -> Topology:
    """Frontier with the hashed router these tests take apart (the preset's default spreads detours over every
    path through aggregated outside groups: tests/topology/test_spread_routing.py)."""
    return load_topology(
        {"preset": "frontier", "params": {"valiant": "hashed", "outside_groups": "exact", **params}}, num_gpus
    )


def dragonfly(num_gpus: int | None, **params) -> Topology:
    return load_topology({"preset": "dragonfly", "params": params}, num_gpus)


def xgmi_bandwidth(a: int, b: int) -> float:
    return XGMI.get((min(a, b), max(a, b)), 0) * 50 * GB


def check_path(topo: Topology, src: str, dst: str, links: tuple[int, ...]) -> list[str]:
    """The links chain from src to dst; returns the visited node names."""
    nodes = [src]
    for link in links:
        u, v = topo.links[link]
        assert u == nodes[-1]
        nodes.append(v)
    assert nodes[-1] == dst
    return nodes


def switch_hops(topo: Topology, links: tuple[int, ...]) -> int:
    return sum(1 for link in links if topo.link_kinds[link] in ("local", "global"))


# ---- Frontier node -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def frontier512() -> Topology:
    return frontier()


def test_frontier_node_links_exact(frontier512: Topology) -> None:
    g = frontier512.graph
    for a, b in itertools.permutations(range(8), 2):
        u, v = f"n3.g{a}", f"n3.g{b}"
        expected = xgmi_bandwidth(a, b)
        if expected:
            assert g.edges[u, v]["bandwidth_bytes_per_s"] == expected
            assert g.edges[u, v]["link_kind"] == "xgmi"
        else:
            assert not g.has_edge(u, v)
    xgmi_edges = [e for e in g.edges("n3.g0") if g.edges[e]["link_kind"] == "xgmi"]
    assert len(xgmi_edges) == 3  # GCD 0: to 1, 2 and 6
    assert sum(1 for u, v, d in g.edges(data=True) if d["link_kind"] == "xgmi" and u.startswith("n3.")) == 24
    for i in range(8):
        for u, v in ((f"n3.g{i}", "n3.cpu"), ("n3.cpu", f"n3.g{i}")):
            assert g.edges[u, v]["bandwidth_bytes_per_s"] == 36 * GB and g.edges[u, v]["link_kind"] == "cpu"
    for k, gcd in NIC_GCD.items():
        nic = f"n3.nic{k}"
        assert {n for n in g.successors(nic) if g.nodes[n]["kind"] == "gpu"} == {f"n3.g{gcd}"}
        assert g.edges[f"n3.g{gcd}", nic]["link_kind"] == "gpu_nic"
        (switch,) = [n for n in g.successors(nic) if g.nodes[n]["kind"] == "switch"]
        assert g.edges[nic, switch]["bandwidth_bytes_per_s"] == 25 * GB
        assert g.edges[nic, switch]["link_kind"] == "nic"
    assert sum(1 for n in g.successors("n3.g0") if g.nodes[n]["kind"] == "nic") == 0


def test_gcd_paths_take_documented_hops(frontier512: Topology) -> None:
    for a, b in itertools.permutations(range(8), 2):
        links = frontier512.route(f"n0.g{a}", f"n0.g{b}")
        nodes = check_path(frontier512, f"n0.g{a}", f"n0.g{b}", links)
        assert all(frontier512.link_kinds[link] == "xgmi" for link in links)
        if xgmi_bandwidth(a, b):
            assert len(links) == 1
        else:
            assert len(links) == 2
            widest = max(min(xgmi_bandwidth(a, m), xgmi_bandwidth(m, b)) for m in range(8) if m not in (a, b))
            assert frontier512.path_bandwidth_bytes_per_s(links) == widest
            assert nodes[1].startswith("n0.g")


def test_every_gcd_reaches_its_nic_and_leaves_through_it(frontier512: Topology) -> None:
    g = frontier512.graph
    for a, b in itertools.product(range(8), repeat=2):
        links = frontier512.route(f"n0.g{a}", f"n77.g{b}")
        nodes = check_path(frontier512, f"n0.g{a}", f"n77.g{b}", links)
        nics = [n for n in nodes if g.nodes[n]["kind"] == "nic"]
        assert nics == [f"n0.nic{a // 2}", f"n77.nic{b // 2}"]
        own, dest_nic_gcd = NIC_GCD[a // 2], NIC_GCD[b // 2]
        assert nodes.index(f"n0.nic{a // 2}") == (1 if a == own else 2)
        if a != own:
            assert nodes[1] == f"n0.g{own}"  # GCD 0 leaves via GCD 1, etc.
        assert nodes[-2] == (f"n77.nic{b // 2}" if b == dest_nic_gcd else f"n77.g{dest_nic_gcd}")


# ---- dragonfly ---------------------------------------------------------------------------------
def fabric_counts(topo: Topology) -> dict[str, int]:
    kinds = [topo.link_kinds[i] for i in range(len(topo.links))]
    return {
        "switches": sum(1 for _, d in topo.graph.nodes(data=True) if d["kind"] == "switch" and "host" not in d),
        "local": kinds.count("local"),
        "global": kinds.count("global"),
        "nic": kinds.count("nic"),
    }


@pytest.mark.parametrize("groups,switches,per_switch,links,nics", [(5, 4, 2, 3, 2), (3, 6, 1, 2, 4)])
def test_dragonfly_link_counts_closed_form(groups: int, switches: int, per_switch: int, links: int, nics: int) -> None:
    topo = dragonfly(
        None,
        num_groups=groups,
        switches_per_group=switches,
        nodes_per_switch=per_switch,
        global_links_per_group_pair=links,
        num_nodes=groups * switches * per_switch,
        gpus_per_node=4,
        nics_per_node=nics,
    )
    nodes = groups * switches * per_switch
    assert fabric_counts(topo) == {
        "switches": groups * switches,
        "local": groups * switches * (switches - 1),  # directed, all-to-all
        "global": groups * (groups - 1) * links,  # directed
        "nic": 2 * nodes * nics,
    }
    assert topo.num_hosts == nodes


def test_frontier_512_nodes_fabric(frontier512: Topology) -> None:
    """The job's 4 groups whole; each of the other 70 of the machine's 74 groups as the 16 switches its
    links to the 4 job groups land on (all-to-all joined) and those 16 x 2 directed global links."""
    groups, outside = 512 // 128, 74 - 512 // 128
    assert fabric_counts(frontier512) == {
        "switches": groups * 32 + outside * 16,
        "local": groups * 32 * 31 + outside * 16 * 15,
        "global": groups * (groups - 1) * 4 + outside * groups * 4 * 2,
        "nic": 2 * 512 * 4,
    }
    job = frontier(network_scope="job")
    assert fabric_counts(job) == {
        "switches": groups * 32,
        "local": groups * 32 * 31,
        "global": groups * (groups - 1) * 4,
        "nic": 2 * 512 * 4,
    }
    assert job.notes and "4 of the machine's 74 groups" in job.notes[0]
    assert frontier512.notes == []
    g = frontier512.graph
    for switch in ("g0.sw0", "g2.sw17", "g3.sw31"):
        assert sum(1 for n in g.successors(switch) if g.nodes[n]["kind"] == "nic") == 16
    for host in (0, 5, 130, 511):
        switches = {
            next(n for n in g.successors(f"n{host}.nic{k}") if g.nodes[n]["kind"] == "switch") for k in range(4)
        }
        assert len(switches) == 4  # each NIC of a node on a different switch
        assert {s.split(".")[0] for s in switches} == {f"g{host // 128}"}
    per_switch = [
        sum(
            1
            for n in g.successors(f"g1.sw{s}")
            if g.nodes[n]["kind"] == "switch" and g.edges[f"g1.sw{s}", n]["link_kind"] == "global"
        )
        for s in range(32)
    ]
    assert sum(per_switch) == 73 * 4 and max(per_switch) - min(per_switch) <= 1  # 292 links spread over 32
    job_links = [
        sum(
            1
            for n in job.graph.successors(f"g1.sw{s}")
            if job.graph.nodes[n]["kind"] == "switch" and job.graph.edges[f"g1.sw{s}", n]["link_kind"] == "global"
        )
        for s in range(32)
    ]
    assert sum(job_links) == 3 * 4 and max(job_links) == 1  # spread, one per switch here


def sample_pairs(topo: Topology, n: int, seed: int = 1) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    return [(rng.choice(topo.gpus), rng.choice(topo.gpus)) for _ in range(n)]


def group_of(topo: Topology, node: str) -> int | None:
    data = topo.graph.nodes[node]
    return data.get("group") if data["kind"] == "switch" and "host" not in data else None


def test_minimal_routes_at_most_three_switch_hops(frontier512: Topology) -> None:
    topo = frontier(routing="minimal")
    for src, dst in sample_pairs(topo, 400):
        paths = topo.paths(src, dst)
        assert sum(f for f, _ in paths) == pytest.approx(1.0)
        for _, links in paths:
            check_path(topo, src, dst, links)
            assert switch_hops(topo, links) <= 3
            inter_group = topo.host_of(src) // 128 != topo.host_of(dst) // 128
            assert sum(1 for link in links if topo.link_kinds[link] == "global") == int(inter_group)
    src, dst = "n0.g0", "n300.g0"  # group 0 -> group 2: split over the 4 global links
    assert [f for f, _ in topo.paths(src, dst)] == [0.25] * 4


def test_valiant_routes_go_through_another_group() -> None:
    topo = frontier(routing="valiant")
    seen_mid: dict[tuple[int, int], set[int]] = {}
    for src, dst in sample_pairs(topo, 600):
        ((frac, links),) = topo.paths(src, dst)
        nodes = check_path(topo, src, dst, links)
        g1, g2 = topo.host_of(src) // 128, topo.host_of(dst) // 128
        groups = {group_of(topo, n) for n in nodes} - {None}
        if g1 != g2:
            mids = groups - {g1, g2}
            assert len(mids) == 1 and switch_hops(topo, links) <= 5
            seen_mid.setdefault((g1, g2), set()).update(mids)
    # the whole machine's other 72 groups serve as intermediates (600 pairs: many of them per group pair)
    assert len(seen_mid) == 12 and all(len(m) > 10 for m in seen_mid.values())
    assert set().union(*seen_mid.values()) - {0, 1, 2, 3}
    job = frontier(routing="valiant", network_scope="job")
    for src, dst in sample_pairs(job, 200):
        ((_, links),) = job.paths(src, dst)
        assert {group_of(job, n) for n in check_path(job, src, dst, links)} - {None} <= {0, 1, 2, 3}
    again = frontier(routing="valiant")
    other_seed = frontier(routing="valiant", seed=7)
    pairs = sample_pairs(topo, 200, seed=3)
    assert [topo.paths(*p) for p in pairs] == [again.paths(*p) for p in pairs]
    assert [topo.paths(*p) for p in pairs] != [other_seed.paths(*p) for p in pairs]


def test_adaptive_fractions_sum_to_one() -> None:
    topo = frontier(routing="adaptive", adaptive_minimal_fraction=0.7)
    for src, dst in sample_pairs(topo, 300):
        paths = topo.paths(src, dst)
        assert sum(f for f, _ in paths) == pytest.approx(1.0)
        for _, links in paths:
            check_path(topo, src, dst, links)
        if topo.host_of(src) // 128 != topo.host_of(dst) // 128:
            minimal = sum(
                f
                for f, links in paths
                if switch_hops(topo, links) <= 3 and sum(topo.link_kinds[x] == "global" for x in links) == 1
            )
            assert minimal == pytest.approx(0.7)


# ---- DGX SuperPOD ------------------------------------------------------------------------------
def test_dgx_rails_share_leaves() -> None:
    topo = load_topology("dgx-h100-superpod", 8 * 64)
    g = topo.graph
    for su in range(2):
        for rail in range(8):
            leaf = f"su{su}.leaf{rail}"
            nics = sorted(n for n in g.successors(leaf) if g.nodes[n]["kind"] == "nic")
            assert nics == sorted(f"n{h}.nic{rail}" for h in range(32 * su, 32 * su + 32))
            assert all(g.has_edge(f"n{h}.g{rail}", f"n{h}.nic{rail}") for h in range(32 * su, 32 * su + 32))
    assert g.edges["n0.g0", "n0.nvsw"]["bandwidth_bytes_per_s"] == 450 * GB
    assert g.edges["n0.nic0", "su0.leaf0"]["bandwidth_bytes_per_s"] == 50 * GB
    ((frac, links),) = topo.paths("n0.g3", "n31.g3")  # same rail, same SU: one leaf
    assert [
        n
        for n in check_path(topo, "n0.g3", "n31.g3", links)
        if g.nodes[n]["kind"] == "switch" and "host" not in g.nodes[n]
    ] == ["su0.leaf3"]
    ((frac, links),) = topo.paths("n0.g3", "n40.g5")  # other SU, other rail: ECMP over the 16 spines, one bundle
    assert "spines" in check_path(topo, "n0.g3", "n40.g5", links)
    assert g.edges["su0.leaf3", "spines"]["bandwidth_bytes_per_s"] == 32 * 50 * GB  # 32 uplinks of 400 Gb/s
    pxn = load_topology({"preset": "dgx-h100-superpod", "params": {"cross_rail": "pxn"}}, 8 * 64)
    ((frac, links),) = pxn.paths("n0.g3", "n31.g5")
    assert "su0.leaf5" in check_path(pxn, "n0.g3", "n31.g5", links)


# ---- placements --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "spec", ["contiguous", "switch-packed", {"policy": "scattered", "seed": 3}, list(range(100, 164))]
)
def test_placements_give_distinct_gpus(frontier512: Topology, spec: object) -> None:
    gpus = place(frontier512, 512, spec)
    assert len(gpus) == len(set(gpus)) == 512
    assert all(frontier512.graph.nodes[x]["kind"] == "gpu" for x in gpus)


def test_scattered_is_seeded_and_switch_packed_fills_switches(frontier512: Topology) -> None:
    a = place(frontier512, 64, {"policy": "scattered", "seed": 11})
    assert a == place(frontier512, 64, {"policy": "scattered", "seed": 11})
    assert a != place(frontier512, 64, {"policy": "scattered", "seed": 12})
    assert len({frontier512.host_of(x) for x in a}) == 8
    assert place(frontier512, 64, "switch-packed") == place(frontier512, 64, "contiguous")
    # free nodes of a busy machine: switch 1 of group 0 has three free nodes, group 0 has the most.
    chosen = place(frontier512, 16, {"policy": "switch-packed", "nodes": [0, 5, 6, 7, 130, 131]})
    assert sorted({frontier512.host_of(x) for x in chosen}) == [5, 6]
    assert {"contiguous", "explicit", "switch-packed", "scattered"} <= set(PLACEMENTS.names())


def test_placements_on_dgx_and_dragonfly() -> None:
    for topo in (load_topology("dgx-h100-superpod", 8 * 40), load_topology("dragonfly", 64)):
        for spec in ("contiguous", "switch-packed", "scattered", [1, 0]):
            n = 8 if isinstance(spec, list) else topo.num_gpus
            gpus = place(topo, n, spec)
            assert len(set(gpus)) == n


# ---- errors ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "params,key",
    [
        ({"nic_bandwidth_GBps": -25}, "topology.params.nic_bandwidth_GBps"),
        ({"global_bandwidth_GBps": 0}, "topology.params.global_bandwidth_GBps"),
        ({"nic_gcds": [1, 3, 5, 9]}, "topology.params.nic_gcds"),
        ({"nic_gcds": [1, 1, 5, 7]}, "topology.params.nic_gcds"),
        ({"switches_per_group": 0}, "topology.params.switches_per_group"),
        ({"nodes_per_switch": 0}, "topology.params.nodes_per_switch"),
        ({"routing": "ugal"}, "topology.params.routing"),
        ({"adaptive_minimal_fraction": 1.5}, "topology.params.adaptive_minimal_fraction"),
        ({"num_groups": 2}, "topology.params.num_groups"),
        ({"bogus": 1}, "topology.params.bogus"),
    ],
)
def test_bad_frontier_params_name_the_field(params: dict, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        frontier(8 * 512, **params)
    assert err.value.key == key


def test_other_config_errors(frontier512: Topology) -> None:
    with pytest.raises(ConfigError) as err:
        load_topology("frontier-xl", 8)
    assert err.value.key == "topology"
    with pytest.raises(ConfigError) as err:
        load_topology("frontier", 8 * 10_000)  # more than 77 cabinets
    assert "max_nodes" in str(err.value)
    with pytest.raises(ConfigError) as err:
        place(frontier512, 8 * 513, "switch-packed")
    assert err.value.key == "placement"
    with pytest.raises(ConfigError) as err:
        place(frontier512, 8 * 2, [0, 512])
    assert err.value.key == "placement.nodes"
    with pytest.raises(ConfigError) as err:
        place(frontier512, 8, {"policy": "scattered", "seed": 1, "sorted": False})
    assert err.value.key == "placement.sorted"
    with pytest.raises(ConfigError) as err:
        load_topology({"preset": "dgx-h100-superpod", "params": {"num_spines": 0}}, 8)
    assert err.value.key == "topology.params.num_spines"
    with pytest.raises(ConfigError) as err:
        load_topology({"preset": "dragonfly", "params": {"switches_per_group": 0}}, 8)
    assert err.value.key == "topology.params.switches_per_group"


# ---- speed (printed, not asserted) -------------------------------------------------------------
def test_frontier_4096_gpus_10k_routes_without_networkx_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    start = time.perf_counter()
    topo = frontier(4096, routing="adaptive")
    built = time.perf_counter()

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("networkx path search per GPU pair")

    monkeypatch.setattr(nx, "shortest_path", forbidden)
    monkeypatch.setattr(nx, "all_shortest_paths", forbidden)
    pairs = sample_pairs(topo, 10_000, seed=5)
    for src, dst in pairs:
        topo.paths(src, dst)
    routed = time.perf_counter()
    print(
        f"\nfrontier 512 nodes: build {built - start:.3f} s, 10k routes {routed - built:.3f} s, {len(topo.links)} links"
    )
