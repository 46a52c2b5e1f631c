"""HALO as designed on Frontier nodes: at least as fast as flat on 1 to 8 nodes at every per-GPU buffer,
the same as flat on one node, and every NIC of every node busy in phase II."""

from __future__ import annotations

import numpy as np
import pytest

from piper_sim.collectives.algorithms import ALL_TO_ALL, split_phases
from piper_sim.studies.all_to_all import StudySpec, build_topology
from piper_sim.studies.reduced_collective import run_collective

MIB = 2.0**20
FAST_SIZES_MIB = (1, 16, 256)
ALL_SIZES_MIB = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def times(nodes: int, size_mib: float, spread: bool = True) -> dict[str, float]:
    """Time of flat and HALO (split-size exchange included) with each GPU's buffer of size_mib MiB."""
    spec = StudySpec(topology="frontier", nodes=(nodes,), sizes=("1MiB",), algorithms=("flat",))
    topo, gpus = build_topology(spec, nodes)
    n = len(gpus)
    m = np.full((n, n), size_mib * MIB / n)
    return {
        alg: run_collective(ALL_TO_ALL.get(alg)(m, gpus, topo), gpus, topo, symmetric=True, spread=spread)[1].time_s
        for alg in ("flat", "halo")
    }


def check(nodes: int, size_mib: float) -> None:
    t = times(nodes, size_mib)
    ratio = t["flat"] / t["halo"]
    if nodes == 1:
        assert ratio == pytest.approx(1.0, abs=0.05), (nodes, size_mib, t)
    assert ratio >= 0.95, (nodes, size_mib, t)


@pytest.mark.parametrize("size_mib", FAST_SIZES_MIB)
@pytest.mark.parametrize("nodes", [1, 2, 4, 8])
def test_halo_at_least_as_fast_as_flat(nodes, size_mib):
    check(nodes, size_mib)


@pytest.mark.slow
@pytest.mark.parametrize("size_mib", [s for s in ALL_SIZES_MIB if s not in FAST_SIZES_MIB])
@pytest.mark.parametrize("nodes", [1, 2, 4, 8])
def test_halo_at_least_as_fast_as_flat_every_size(nodes, size_mib):
    check(nodes, size_mib)


@pytest.mark.slow
@pytest.mark.parametrize("nodes", [3, 5, 6, 7])
def test_halo_at_least_as_fast_as_flat_on_odd_node_counts(nodes):
    for size_mib in (1, 8, 64, 256):
        check(nodes, size_mib)


def test_halo_with_hashed_detours_as_simulate_routes_it():
    """The same on 2 nodes with the router's own hashed Valiant detours (what `simulate` runs)."""
    for size in (1, 256):
        t = times(2, size, spread=False)
        assert t["flat"] / t["halo"] >= 0.95


def test_every_nic_sends_and_receives_in_phase_two():
    """2 nodes (the case that ran on one NIC before): all 8 GCDs of each node send, the 4 NICs each carry
    two GCDs' messages out and two in."""
    spec = StudySpec(topology="frontier", nodes=(2,), sizes=("1MiB",), algorithms=("halo",))
    topo, gpus = build_topology(spec, 2)
    phases = split_phases(ALL_TO_ALL.get("halo")(np.full((16, 16), MIB), gpus, topo))[1]
    inter = [p for p in phases if p.name.startswith("inter")][0]
    np.testing.assert_array_equal(np.sort(inter.src), np.arange(16))
    np.testing.assert_array_equal(np.sort(inter.dst), np.arange(16))
    nic = [topo.router.node.gpu_nic[topo.graph.nodes[gpus[s]]["local_index"]] for s in inter.src]
    host = [topo.host_of(gpus[s]) for s in inter.src]
    assert sorted(zip(host, nic, strict=True)) == sorted((h, k) for h in (0, 1) for k in range(4) for _ in (0, 1))
