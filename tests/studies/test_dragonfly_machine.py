"""The whole machine behind a job: a flat all-to-all across 2 groups of a 74-group dragonfly against the
global links its routes can use (closed forms), exact aggregation of the outside groups, background load,
allocations on the machine, and the job-groups-only option."""

from __future__ import annotations

import numpy as np
import pytest

from piper_sim.collectives.algorithms import ALL_TO_ALL, data_phases
from piper_sim.errors import ConfigError
from piper_sim.studies.reduced_collective import prepare, simulate
from piper_sim.topology.load import load_topology

GLOBAL_BW = 1e9
# 2 groups of 4 switches, 1 node (1 GPU, 1 NIC) per switch, 2 global links per group pair; everything but
# the global links fast and every latency and overhead 0, so the global links bound the all-to-all.
SMALL = {
    "gpus_per_node": 1,
    "nics_per_node": 1,
    "switches_per_group": 4,
    "nodes_per_switch": 1,
    "global_links_per_group_pair": 2,
    "global_bandwidth_GBps": GLOBAL_BW / 1e9,
    "local_bandwidth_GBps": 1e3,
    "nic_bandwidth_GBps": 1e3,
    "intra_bandwidth_GBps": 1e3,
    "gpu_nic_bandwidth_GBps": 1e3,
    "message_overhead_us": 0.0,
    "intra_latency_us": 0.0,
    "gpu_nic_latency_us": 0.0,
    "nic_latency_us": 0.0,
    "local_latency_us": 0.0,
    "global_latency_us": 0.0,
    "switch_latency_us": 0.0,
    "num_groups": 74,
    "routing": "adaptive",
}


def small(**params) -> object:
    return load_topology({"preset": "dragonfly", "params": {**SMALL, **params}}, 8)


def flat_time(topo, size: float = 2.0**20, **kwargs) -> float:
    n = topo.num_gpus
    phases = data_phases(ALL_TO_ALL.get("flat"), np.full((n, n), size), topo.gpus, topo)
    return simulate(prepare(phases, topo.gpus, topo, spread=True, **kwargs), topo).time_s


@pytest.mark.parametrize("outside", ["aggregate", "exact"])
@pytest.mark.parametrize("fraction", [0.5, 1 / 73])
def test_flat_across_two_of_74_groups_is_bound_by_the_global_links_its_routes_use(outside, fraction):
    """T = 4 x 4 x 1 MiB crosses each way between the 2 job groups. A share f takes the L = 2 minimal
    links: f T / (L B); the rest spreads over the L x L detours through each of the 72 other groups, each
    carrying its share over one link out of group 0 and one into group 1: (1 - f) T / (72 L B). The
    all-to-all takes the larger: the minimal links at f = 0.5, and all 73 x L links together, T / (73 L B),
    at f = 1/73."""
    topo = small(adaptive_minimal_fraction=fraction, outside_groups=outside)
    big = 4 * 4 * 2.0**20
    bound = max(fraction * big / (2 * GLOBAL_BW), (1 - fraction) * big / (72 * 2 * GLOBAL_BW))
    assert flat_time(topo, symmetric=outside == "aggregate") == pytest.approx(bound, rel=0.02)
    if fraction < 0.5:
        assert bound == pytest.approx(big / (73 * 2 * GLOBAL_BW))


def test_job_groups_only_is_an_explicit_option():
    """network_scope job: no group to detour through, every byte on the 2 minimal links, T / (L B)."""
    topo = small(network_scope="job")
    assert topo.notes and "2 of the machine's 74 groups" in topo.notes[0]
    assert flat_time(topo) == pytest.approx(4 * 4 * 2.0**20 / (2 * GLOBAL_BW), rel=1e-9)
    machine = small()
    assert machine.notes == [] and flat_time(machine) < flat_time(topo) / 1.9


def test_background_load_takes_its_share_of_the_global_links():
    assert flat_time(small(background_load=0.5)) == pytest.approx(2 * flat_time(small()), rel=1e-9)
    random_bg = small(background_load={"mean": 0.2, "seed": 3}, outside_groups="exact")
    assert flat_time(small()) < flat_time(random_bg)


@pytest.mark.parametrize("algorithm", ["flat", "halo"])
def test_aggregated_outside_groups_and_merged_detours_are_exact(algorithm):
    """A Frontier-like machine of 6 groups (8 switches, chassis of 4 switches, 4 links per group pair), the job
    on 2 groups: the class-aggregated outside groups with the symmetry reductions (what the study runs) give
    the time of every outside group built and every detour routed apart."""
    params = {"switches_per_group": 8, "nodes_per_switch": 1, "global_links_per_group_pair": 4, "num_groups": 6}
    n = 16 * 8
    m = np.full((n, n), 2.0**18)
    times = {}
    for outside, symmetric in (("aggregate", True), ("exact", False)):
        topo = load_topology({"preset": "frontier", "params": {**params, "outside_groups": outside}}, n)
        phases = data_phases(ALL_TO_ALL.get(algorithm), m, topo.gpus, topo)
        prep = prepare(phases, topo.gpus, topo, spread=True, symmetric=symmetric)
        times[outside] = simulate(prep, topo).time_s
        if symmetric:
            assert prep.num_automorphisms > 0
    assert times["aggregate"] == pytest.approx(times["exact"], rel=1e-9)


def test_hashed_detours_need_the_exact_outside_groups():
    topo = small(outside_groups="aggregate", routing="valiant")
    with pytest.raises(ConfigError) as err:
        for dst in topo.gpus[4:]:
            topo.paths(topo.gpus[0], dst)
    assert err.value.key == "topology.params.outside_groups"


def test_allocations_spread_a_job_over_groups():
    frontier = {"preset": "frontier"}
    spread = load_topology({**frontier, "params": {"allocation": {"policy": "spread", "groups": 4, "seed": 1}}}, 8 * 64)
    groups = [spread.router.fabric.home(h)[0] for h in range(64)]
    assert len(set(groups)) == 4 and sorted(np.bincount(groups)[sorted(set(groups))]) == [16] * 4
    rand = load_topology({**frontier, "params": {"allocation": {"policy": "random", "seed": 2}}}, 8 * 64)
    assert len(set(rand.router.fabric.job_groups)) > 20
    explicit = load_topology({**frontier, "params": {"allocation": [5, 700, 9000]}}, 8 * 3)
    assert [explicit.router.fabric.home(h)[0] for h in range(3)] == [0, 5, 70]
    for bad, key in (
        ({"policy": "spread", "groups": 99}, "topology.params.allocation.groups"),
        ({"policy": "random", "sorted": True}, "topology.params.allocation.sorted"),
        ([0, 0], "topology.params.allocation"),
        ("packed", "topology.params.allocation"),
    ):
        with pytest.raises(ConfigError) as err:
            load_topology({**frontier, "params": {"allocation": bad}}, 16)
        assert err.value.key == key
    with pytest.raises(ConfigError) as err:
        load_topology({"preset": "dragonfly", "params": {"allocation": {"policy": "random"}}}, 16)
    assert "num_groups" in str(err.value)
