"""Collective algorithms: byte conservation, phase DAGs, and simulated times on uniform clusters."""

from __future__ import annotations

import math

import numpy as np
import pytest
import simpy

from piper_sim.collectives.algorithms import ALL_REDUCE, ALL_TO_ALL, Phase, split_phases
from piper_sim.collectives.hierarchical import halo_relays, host_groups
from piper_sim.sim.collective import CollectiveRunner
from piper_sim.sim.network import FlowNetwork
from piper_sim.topology.graph import Topology
from piper_sim.topology.load import load_topology

A2A = ["flat", "pairwise", "halo", "2dh", "bruck"]


def uniform(num_gpus: int, gpus_per_node: int = 4, nic: float = 10) -> Topology:
    return load_topology({"builder": "uniform", "params": {
        "gpus_per_node": gpus_per_node, "intra_bandwidth_GBps": 100, "nic_bandwidth_GBps": nic}}, num_gpus)


def uneven_matrix(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    m = rng.exponential(1e6, (n, n)) * (rng.random((n, n)) < 0.7)
    m[3, :] = 0.0  # member 3 sends nothing
    m[:, 5] = 0.0  # member 5 receives nothing
    return m


def simulate(phases: list[Phase], topo: Topology) -> float:
    env = simpy.Environment()
    runner = CollectiveRunner(env, FlowNetwork(env, topo.capacity_bytes_per_s), topo)
    env.run(runner.run(phases, tuple(topo.gpus), "c"))
    return env.now


def inter_node_messages(phases: list[Phase], topo: Topology) -> int:
    """Inter-node data messages (the split-size exchange left out)."""
    host = np.array([topo.host_of(g) for g in topo.gpus])
    return sum(int((host[p.src] != host[p.dst]).sum()) * p.messages for p in split_phases(phases)[1])


def assert_dag(phases: list[Phase]) -> None:
    for i, p in enumerate(phases):
        assert all(0 <= a < i for a in p.after), (i, p.after)
        assert p.src.shape == p.dst.shape == p.sizes.shape
        assert np.all(p.sizes >= 0)
        assert not np.any(p.src == p.dst)


def member_flows(p: Phase, n: int) -> tuple[np.ndarray, np.ndarray]:
    return np.bincount(p.src, p.sizes, n), np.bincount(p.dst, p.sizes, n)


@pytest.mark.parametrize("num_gpus", [8, 16])
@pytest.mark.parametrize("name", A2A)
def test_store_and_forward_all_to_all_conserves_bytes(name, num_gpus):
    """Phases in order: nobody sends bytes it does not hold, and every member ends with its column."""
    topo = uniform(num_gpus)
    m = uneven_matrix(num_gpus)
    phases = ALL_TO_ALL.get(name)(m, topo.gpus, topo)
    assert_dag(phases)
    held = m.sum(axis=1)
    for p in split_phases(phases)[1]:  # list order is a topological order (checked by assert_dag)
        out, inn = member_flows(p, num_gpus)
        assert np.all(held - out >= -1e-6 * m.sum())
        held = held - out + inn
    np.testing.assert_allclose(held, m.sum(axis=0), rtol=1e-9, atol=1e-3)
    assert held[5] == pytest.approx(0.0, abs=1e-3)


@pytest.mark.parametrize("num_gpus", [8, 16])
def test_halo_delivers_every_column(num_gpus):
    topo = uniform(num_gpus)
    m = uneven_matrix(num_gpus, seed=num_gpus)
    host, groups = host_groups(topo.gpus, topo)
    phases = ALL_TO_ALL.get("halo")(m, topo.gpus, topo)
    assert_dag(phases)
    meta, (pack, intra, inter, redistribute) = split_phases(phases)
    assert [p.name for p in meta] == ["splits:pack", "splits:intra", "splits:inter", "splits:redistribute",
                                      "splits:node"]
    assert [p.name for p in (pack, intra, inter, redistribute)] == ["pack", "intra", "inter", "redistribute"]
    assert pack.after == () and intra.after == (0,) and inter.after == (0,) and redistribute.after == (2,)
    for p in (pack, intra, redistribute):
        assert np.all(host[p.src] == host[p.dst])
    assert np.all(host[inter.src] != host[inter.dst])
    # packing hands each inter-node sender exactly the node peers' rows it carries
    packed = member_flows(pack, num_gpus)[1]
    for s in np.unique(inter.src):
        peers = (host == host[s]) & (np.arange(num_gpus) != s)
        dests = np.isin(host, host[inter.dst[inter.src == s]])
        assert packed[s] == pytest.approx(m[np.ix_(peers, dests)].sum())
    # one message per ordered node pair
    h = len(groups)
    assert inter.src.size == h * (h - 1)
    delivered = member_flows(intra, num_gpus)[1] + member_flows(redistribute, num_gpus)[1]
    own = np.zeros(num_gpus)
    for s, r, size in zip(inter.src, inter.dst, inter.sizes, strict=True):
        rows = m[host == host[s]][:, host == host[r]]
        assert size == pytest.approx(rows.sum())
        own[r] += m[host == host[s], r].sum()
    delivered += own
    np.testing.assert_allclose(delivered, m.sum(axis=0) - np.diag(m), rtol=1e-9, atol=1e-3)
    # each receiver forwards exactly what it got for others
    forwarded = member_flows(redistribute, num_gpus)[0]
    np.testing.assert_allclose(forwarded + own, member_flows(inter, num_gpus)[1], rtol=1e-9, atol=1e-3)


def test_halo_stripes_node_pairs_over_every_nic():
    topo = uniform(16)
    _, groups = host_groups(topo.gpus, topo)
    relays = halo_relays(groups)
    senders = [s for s, _ in relays.values()]
    receivers = [r for _, r in relays.values()]
    # 4 nodes of 4: each node has 3 outgoing pairs on 3 distinct members, and 3 incoming on 3 distinct members
    assert len(set(senders)) == 12 and len(set(receivers)) == 12


@pytest.mark.parametrize("name", A2A)
def test_every_all_to_all_runs_on_the_flow_network(name):
    topo = uniform(16)
    m = uneven_matrix(16)
    assert simulate(ALL_TO_ALL.get(name)(m, topo.gpus, topo), topo) > 0


def test_halo_matches_flat_on_a_single_node():
    topo = uniform(4)
    m = uneven_matrix(8)[:4, :4] + 1e6
    flat = simulate(ALL_TO_ALL.get("flat")(m, topo.gpus, topo), topo)
    halo = simulate(ALL_TO_ALL.get("halo")(m, topo.gpus, topo), topo)
    assert halo == pytest.approx(flat, rel=0.1)


def test_halo_sends_fewer_inter_node_messages_than_flat():
    topo = uniform(16, nic=1)
    m = np.full((16, 16), 1e5)
    flat = ALL_TO_ALL.get("flat")(m, topo.gpus, topo)
    halo = ALL_TO_ALL.get("halo")(m, topo.gpus, topo)
    assert inter_node_messages(flat, topo) == 16 * 12
    assert inter_node_messages(halo, topo) == 4 * 3
    assert inter_node_messages(ALL_TO_ALL.get("2dh")(m, topo.gpus, topo), topo) == 16 * 3
    # same inter-node bytes, so with all NICs busy the times stay within a factor of the flat one
    assert simulate(halo, topo) < 2 * simulate(flat, topo)


@pytest.mark.parametrize("name", A2A)
def test_split_sizes_are_exchanged_before_any_data(name):
    """The counts (8 bytes per pair) go by the algorithm itself; pairwise, halo and 2dh then gather each
    member's row and column inside its node (a ring of 4 members: 3 steps of 2 n int64), as the torch
    backend does."""
    n = 16
    topo = uniform(n)
    phases = ALL_TO_ALL.get(name)(uneven_matrix(n), topo.gpus, topo)
    meta, data = split_phases(phases)
    counts = ALL_TO_ALL.get(name)(np.full((n, n), 8.0), topo.gpus, topo)
    counts_meta, counts_data = split_phases(counts)
    assert [p.name for p in meta] == [p.name for p in counts_meta]
    for m, c in zip(meta, counts_meta, strict=True):  # the exchange does not depend on the data's sizes
        np.testing.assert_array_equal(m.sizes, c.sizes)
    exchanged = [p for p in meta if p.name != "splits:node"]
    assert [p.name for p in exchanged] == [f"splits:{p.name}" for p in counts_data]
    for m, c in zip(exchanged, counts_data, strict=True):
        np.testing.assert_array_equal(m.sizes, c.sizes)
    if name in ("flat", "bruck"):
        assert meta == exchanged
    else:
        ring = meta[-1]
        assert ring.name == "splits:node" and ring.messages == 3 and ring.after == tuple(range(len(meta) - 1))
        host = np.array([topo.host_of(g) for g in topo.gpus])
        assert np.all(host[ring.src] == host[ring.dst]) and ring.src.size == n
        assert np.all(ring.sizes == 2 * 8 * n * 3)
    # every data phase waits for the whole exchange, directly or through the phases it waits for
    ancestors: list[set[int]] = []
    for p in phases:
        ancestors.append(set(p.after).union(*(ancestors[a] for a in p.after)))
    assert len(data) == len(phases) - len(meta)
    assert all(set(range(len(meta))) <= ancestors[i] | {i} for i in range(len(meta), len(phases)))


def test_bruck_takes_log_rounds():
    topo = uniform(16)
    phases = split_phases(ALL_TO_ALL.get("bruck")(np.ones((16, 16)), topo.gpus, topo))[1]
    assert len(phases) == 4
    for k, p in enumerate(phases):
        np.testing.assert_array_equal(p.dst, (p.src + 2**k) % 16)
        np.testing.assert_allclose(p.sizes, 8.0)  # half of the 16 offsets have bit k set


@pytest.mark.parametrize("n", [2, 5, 8, 16])
def test_tree_all_reduce_has_two_log_rounds(n):
    topo = uniform(16)
    phases = ALL_REDUCE.get("tree")(1e6, topo.gpus[:n], topo)
    assert_dag(phases)
    assert len(phases) == 2 * math.ceil(math.log2(n))
    reduce, bcast = phases[: len(phases) // 2], phases[len(phases) // 2:]
    senders = np.concatenate([p.src for p in reduce])
    receivers = np.concatenate([p.dst for p in bcast])
    # every member but the root sends its partial sum once and receives the result once
    assert sorted(senders.tolist()) == list(range(1, n)) == sorted(receivers.tolist())
    assert all(np.all(p.sizes == 1e6) for p in phases)


def test_hierarchical_all_reduce_beats_ring_across_slow_nodes():
    topo = uniform(16, nic=10)
    size = 1e8
    phases = ALL_REDUCE.get("hierarchical")(size, topo.gpus, topo)
    assert_dag(phases)
    assert [p.name for p in phases] == ["reduce_scatter", "inter", "all_gather"]
    assert phases[1].sizes == pytest.approx(np.full(16, 2 * 3 / 4 * size / 4))
    ring = simulate(ALL_REDUCE.get("ring")(size, topo.gpus, topo), topo)
    hier = simulate(phases, topo)
    tree = simulate(ALL_REDUCE.get("tree")(size, topo.gpus, topo), topo)
    assert hier < ring < tree


@pytest.mark.parametrize("name", A2A)
def test_split_exchange_and_conservation_on_unequal_nodes(name):
    """6 GPUs on nodes of 4 and 2: the node rings have 4 and 2 members (3 steps, the larger ring's), and
    the data phases still deliver every column (2dh falls back to flat's data phases)."""
    topo = uniform(8)
    members = topo.gpus[:6]
    m = uneven_matrix(6)
    phases = ALL_TO_ALL.get(name)(m, members, topo)
    assert_dag(phases)
    meta, data = split_phases(phases)
    ring = [p for p in meta if p.name == "splits:node"]
    if name in ("flat", "bruck"):
        assert not ring
    else:
        (ring,) = ring
        assert ring.src.size == 6 and ring.messages == 3
        np.testing.assert_array_equal(np.sort(ring.dst), np.arange(6))
    held = m.sum(axis=1)
    if name != "halo":  # halo's phase I and II are concurrent; its delivery is checked above
        for p in data:
            out, inn = member_flows(p, 6)
            assert np.all(held - out >= -1e-6 * m.sum())
            held = held - out + inn
        np.testing.assert_allclose(held, m.sum(axis=0), rtol=1e-9, atol=1e-3)
    env = simpy.Environment()
    env.run(CollectiveRunner(env, FlowNetwork(env, topo.capacity_bytes_per_s), topo).run(phases, tuple(members), "u"))
    assert env.now > 0
