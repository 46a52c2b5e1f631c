"""Collective algorithms: byte conservation, phase DAGs, and simulated times on uniform clusters."""

from __future__ import annotations

import math

import numpy as np
import pytest
import simpy

from piper_sim.collectives.algorithms import ALL_REDUCE, ALL_TO_ALL, Phase, split_phases
from piper_sim.collectives.hierarchical import host_groups
from piper_sim.network import CollectiveRunner, FlowNetwork
from piper_sim.topology.graph import Topology
from piper_sim.topology.load import load_topology

A2A = ["flat", "pairwise", "halo", "2dh", "bruck", "rccl", "nccl"]
NO_NODE_GATHER = ("flat", "bruck", "halo", "rccl", "nccl")


VENDOR = {"peers_in_flight": 4, "per_peer_us": 3.0, "per_chunk_us": 1.0}  # a vendor model's parameters (tests)


def uniform(num_gpus: int, gpus_per_node: int = 4, nic: float = 10) -> Topology:
    return load_topology(
        {
            "builder": "uniform",
            "params": {"gpus_per_node": gpus_per_node, "intra_bandwidth_GBps": 100, "nic_bandwidth_GBps": nic},
            "collectives": {"rccl": VENDOR, "nccl": VENDOR},
        },
        num_gpus,
    )


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


def halo_parts(phases: list[Phase]) -> tuple[Phase, list[Phase], list[Phase]]:
    """(phase I, the slices of phase II, the slices of phase III) of HALO's data phases (after renumbered
    among the data phases, as split_phases gives them)."""
    return halo_split(split_phases(phases)[1])


def halo_split(data: list[Phase]) -> tuple[Phase, list[Phase], list[Phase]]:
    intra, rest = data[0], data[1:]
    assert intra.name == "intra" and len(rest) % 2 == 0
    return intra, rest[0::2], rest[1::2]


@pytest.mark.parametrize("num_gpus", [8, 16, 24])
@pytest.mark.parametrize("chunk_mib", [0.25, 64.0])
def test_halo_delivers_every_column(num_gpus, chunk_mib):
    """Uneven matrix: I delivers the node-local entries, each II message carries exactly what its sender holds
    for the relay's node, III forwards exactly what the relay got for others; every byte arrives once."""
    topo = uniform(num_gpus)
    topo.collectives = {"halo": {"chunk_MiB": chunk_mib}}
    m = uneven_matrix(num_gpus, seed=num_gpus)
    host, _ = host_groups(topo.gpus, topo)
    phases = ALL_TO_ALL.get("halo")(m, topo.gpus, topo)
    assert_dag(phases)
    data = split_phases(phases)[1]
    intra, inter, redistribute = halo_split(data)
    assert (len(inter) > 1) == (chunk_mib < 1)
    for k, (ii, rr) in enumerate(zip(inter, redistribute, strict=True)):  # slice k: II after II k-1, III after II k
        i_ii = data.index(ii)
        assert data.index(rr) - 1 == i_ii and rr.after == (i_ii,)
        if k:
            assert ii.after == (data.index(inter[k - 1]),)
    assert np.all(host[intra.src] == host[intra.dst])
    n = num_gpus
    sent = sum(np.bincount(p.src * n + p.dst, p.sizes, n * n).reshape(n, n) for p in inter)
    assert np.all(host[np.nonzero(sent)[0]] != host[np.nonzero(sent)[1]])
    for s, r in zip(*np.nonzero(sent), strict=True):  # one message per (sender, node): its rows for that node
        assert sent[s, r] == pytest.approx(m[s, host == host[r]].sum())
    assert np.all((sent > 0).sum(axis=1) <= len(set(host.tolist())) - 1)
    delivered = member_flows(intra, n)[1] + sum(member_flows(p, n)[1] for p in redistribute)
    own = np.array([sum(m[s, r] for s in np.flatnonzero(sent[:, r] > 0)) for r in range(n)])
    np.testing.assert_allclose(delivered + own, m.sum(axis=0) - np.diag(m), rtol=1e-9, atol=1e-3)
    forwarded = sum(member_flows(p, n)[0] for p in redistribute)
    np.testing.assert_allclose(forwarded + own, sent.sum(axis=0), rtol=1e-9, atol=1e-3)


@pytest.mark.parametrize("where", ["uniform", "frontier", "unequal nodes"])
@pytest.mark.parametrize("chunk_mib", [0.25, 64.0])
def test_halo_plan_says_which_chunks_each_flow_carries(where, chunk_mib):
    """HaloPlan (what the torch backend runs): its phases are the registered algorithm's data phases, every
    flow's bytes are the sum of the chunks `carries` names (sliced: 1/slices of each), and every chunk
    reaches its destination once: by phase I on its node, else by phase II to its relay on the
    destination's node and, unless that relay is the destination, by phase III of the same slice."""
    from piper_sim.collectives.halo import _switch_ids, halo_plan, slice_rows
    from piper_sim.collectives.params import algorithm_params

    topo = load_topology("frontier", 32) if where == "frontier" else uniform(24)
    topo.collectives = {**topo.collectives, "halo": {"chunk_MiB": chunk_mib}}
    members = list(topo.gpus)[:6] if where == "unequal nodes" else list(topo.gpus)
    if where == "frontier":
        members = [members[i] for i in (0, 3, 9, 12, 13, 17, 22, 25, 30, 31)]  # uneven nodes, mixed switches
    n = len(members)
    m = np.round(uneven_matrix(n, seed=n))
    host, _ = host_groups(members, topo)
    params = algorithm_params(topo, "halo")
    plan = halo_plan(m, host, _switch_ids(members, topo), params["chunk_bytes"], params["max_slices"])
    data = split_phases(ALL_TO_ALL.get("halo")(m, members, topo))[1]
    assert [p.name for p in plan.phases] == [p.name for p in data]
    for a, b in zip(plan.phases, data, strict=True):
        for field in ("src", "dst", "sizes"):
            np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
        assert a.after == b.after
    assert (plan.slices > 1) == (chunk_mib < 1)
    route: dict[tuple[int, int], list[tuple[str, int, int, int]]] = {}
    for p, phase in enumerate(plan.phases):
        for src, dst, size in zip(phase.src.tolist(), phase.dst.tolist(), phase.sizes, strict=True):
            keys = plan.carries(p, src, dst)
            scale = 1.0 if plan.kind[p] == "intra" else 1.0 / plan.slices
            assert size == pytest.approx(sum(m[k] for k in keys) * scale, rel=1e-12)
            for k in keys:
                route.setdefault(k, []).append((plan.kind[p], plan.slice[p], src, dst))
    # slices of whole rows: every row in exactly one slice
    assert sum(np.subtract(*slice_rows(7, s, plan.slices)[::-1]) for s in range(plan.slices)) == 7
    for s in range(n):
        for d in range(n):
            hops = route.get((s, d), [])
            if s == d or m[s, d] == 0:
                continue
            if host[s] == host[d]:
                assert hops == [("intra", 0, s, d)]
                continue
            relay = plan.relay[s, host[d]]
            assert host[relay] == host[d]
            want = [("inter", k, s, relay) for k in range(plan.slices)]
            if relay != d:
                want += [("redistribute", k, relay, d) for k in range(plan.slices)]
            assert sorted(hops) == sorted(want), (s, d)


def test_halo_stripes_every_node_pair_over_every_nic():
    """Frontier, 4 nodes: every GCD sends one message to every other node through its own NIC (II), each
    GCD receives one message from every other node, and inside a chassis the relay's NIC is on the
    sender's NIC switch (no switch-to-switch hop)."""
    topo = load_topology("frontier", 32)
    phases = ALL_TO_ALL.get("halo")(np.full((32, 32), 1e5), topo.gpus, topo)
    _, (inter,), _ = halo_parts(phases)
    host = np.array([topo.host_of(g) for g in topo.gpus])
    assert inter.src.size == 32 * 3
    np.testing.assert_array_equal(np.bincount(inter.src, minlength=32), 3)
    np.testing.assert_array_equal(np.bincount(inter.dst, minlength=32), 3)
    for s, d in zip(inter.src, inter.dst, strict=True):
        assert host[s] != host[d]
        route = topo.route(topo.gpus[s], topo.gpus[d])
        assert "local" not in {topo.link_kinds[link] for link in route}


@pytest.mark.parametrize("name", A2A)
def test_every_all_to_all_runs_on_the_flow_network(name):
    topo = uniform(16)
    m = uneven_matrix(16)
    assert simulate(ALL_TO_ALL.get(name)(m, topo.gpus, topo), topo) > 0


def test_halo_is_flat_on_a_single_node():
    """One node: HALO is the intra-node all-to-all, the same phases (split sizes included) as flat."""
    topo = uniform(4)
    m = uneven_matrix(8)[:4, :4] + 1e6
    flat, halo = (ALL_TO_ALL.get(a)(m, topo.gpus, topo) for a in ("flat", "halo"))
    assert [p.name for p in halo] == [p.name for p in flat]
    for a, b in zip(halo, flat, strict=True):
        np.testing.assert_array_equal(a.sizes, b.sizes)
    assert simulate(halo, topo) == simulate(flat, topo)


def test_halo_sends_fewer_inter_node_messages_than_flat():
    topo = uniform(16, nic=1)
    m = np.full((16, 16), 1e5)
    flat = ALL_TO_ALL.get("flat")(m, topo.gpus, topo)
    halo = ALL_TO_ALL.get("halo")(m, topo.gpus, topo)
    assert inter_node_messages(flat, topo) == 16 * 12
    assert inter_node_messages(halo, topo) == 16 * 3  # one per member and peer node
    assert inter_node_messages(ALL_TO_ALL.get("2dh")(m, topo.gpus, topo), topo) == 16 * 3
    # same inter-node bytes, so with all NICs busy the times stay within a factor of the flat one
    assert simulate(halo, topo) < 2 * simulate(flat, topo)


@pytest.mark.parametrize("name", A2A)
def test_split_sizes_are_exchanged_before_any_data(name):
    """The counts (8 bytes per pair) go by the algorithm itself; pairwise and 2dh then gather each
    member's row and column inside its node (a ring of 4 members: 3 steps of 2 n int64), as the torch
    backend does. HALO needs no gather: its relays learn what they forward from the counts they relay."""
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
    if name in NO_NODE_GATHER:
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
    reduce, bcast = phases[: len(phases) // 2], phases[len(phases) // 2 :]
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
    if name in NO_NODE_GATHER:
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
