"""The flow network against hand-solved cases: fair sharing, isolated transfers, max-min fairness."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from piper_sim.collectives.algorithms import ALL_TO_ALL, Phase
from piper_sim.network import CollectiveRunner, FlowNetwork, Timeline, max_min_rates
from piper_sim.topology.load import load_topology


def run_flows(capacity, flows, starts=None):
    """flows: list of (links, bytes); returns finish time of each flow."""
    env = simpy.Environment()
    net = FlowNetwork(env, np.asarray(capacity, dtype=float))
    finish = [None] * len(flows)
    starts = starts or [0.0] * len(flows)

    def one(i, links, size, t0):
        yield env.timeout(t0)
        yield net.start(np.zeros(len(links), dtype=np.int64), np.array(links), np.array([float(size)]))
        finish[i] = env.now

    for i, ((links, size), t0) in enumerate(zip(flows, starts, strict=True)):
        env.process(one(i, links, size, t0))
    env.run()
    return finish


def test_two_flows_on_one_link_each_get_half():
    # 1 GB/s link, two 1 GB flows: each at 0.5 GB/s, both end at 2 s
    assert run_flows([1e9], [([0], 1e9), ([0], 1e9)]) == pytest.approx([2.0, 2.0])


def test_flow_speeds_up_when_the_other_ends():
    # 0.5 GB and 1.5 GB: both at 0.5 GB/s until t=1, then the second alone at 1 GB/s for 1 GB -> t=2
    assert run_flows([1e9], [([0], 0.5e9), ([0], 1.5e9)]) == pytest.approx([1.0, 2.0])


def test_late_arrival_shares_from_its_start():
    # A alone 1 s (1 GB done), then shares with B: A's last 1 GB at 0.5 GB/s -> t=3; B 1 GB -> t=3
    assert run_flows([1e9], [([0], 2e9), ([0], 1e9)], starts=[0.0, 1.0]) == pytest.approx([3.0, 3.0])


def test_max_min_on_hand_solved_network():
    # links: L0 cap 10, L1 cap 4. flows: a uses L0; b uses L0+L1; c uses L1.
    # L1 bottleneck: b = c = 2; then a gets 10 - 2 = 8.
    rates = max_min_rates(np.array([0, 1, 1, 2]), np.array([0, 0, 1, 1]), np.ones(3), np.array([10.0, 4.0]))
    assert rates == pytest.approx([8.0, 2.0, 2.0])


def test_max_min_with_weights_is_identical_flows():
    # a flow standing for 3 identical flows on a 12-capacity link with one other flow: each of 4 gets 3
    rates = max_min_rates(np.array([0, 1]), np.array([0, 0]), np.array([3.0, 1.0]), np.array([12.0]))
    assert rates == pytest.approx([3.0, 3.0])


def test_isolated_transfer_takes_latency_plus_bytes_over_bandwidth():
    topo = load_topology(
        {
            "builder": "uniform",
            "params": {
                "gpus_per_node": 2,
                "intra_bandwidth_GBps": 100,
                "intra_latency_us": 1.0,
                "nic_bandwidth_GBps": 10,
                "nic_latency_us": 3.0,
                "switch_latency_us": 0.5,
                "message_overhead_us": 2.0,
            },
        },
        4,
    )
    env = simpy.Environment()
    runner = CollectiveRunner(env, FlowNetwork(env, topo.capacity_bytes_per_s), topo)
    size = 1e8
    phase = Phase(src=np.array([0]), dst=np.array([1]), sizes=np.array([size]))
    done = runner.run([phase], ("n0.g0", "n1.g0"), "t")
    env.run(done)
    # route: gpu->nic (0 latency), nic->switch (3.5 us), switch->nic (3.5 us), nic->gpu (0); 10 GB/s bottleneck
    expected = 2e-6 + 7e-6 + size / 10e9
    assert env.now == pytest.approx(expected, rel=1e-9)


def _two_nodes_of_four():
    """8 GPUs on 2 nodes: 100 GB/s inside a node, a 10 GB/s NIC per GPU, no latencies."""
    return load_topology(
        {
            "builder": "uniform",
            "params": {
                "gpus_per_node": 4,
                "intra_bandwidth_GBps": 100,
                "intra_latency_us": 0.0,
                "nic_bandwidth_GBps": 10,
                "nic_latency_us": 0.0,
                "switch_latency_us": 0.0,
            },
        },
        8,
    )


def test_flat_all_to_all_on_uniform_cluster_is_nic_bound():
    """8 GPUs on 2 nodes, every pair 1 MB: inter-node part limited by each GPU's 10 GB/s NIC."""
    topo = _two_nodes_of_four()
    env = simpy.Environment()
    runner = CollectiveRunner(env, FlowNetwork(env, topo.capacity_bytes_per_s), topo)
    matrix = np.full((8, 8), 1e6)
    phases = ALL_TO_ALL.get("flat")(matrix, topo.gpus, topo)
    done = runner.run(phases, tuple(topo.gpus), "a2a")
    env.run(done)
    # each GPU sends 4 MB off-node through its 10 GB/s NIC link: 0.4 ms; intra-node 3 MB at 100 GB/s is hidden;
    # before it, the split sizes: int64 counts, 32 bytes on each NIC link (3.2 ns at 10 GB/s), too little to share
    # links: they end as they enter
    assert env.now == pytest.approx(4e6 / 10e9, rel=1e-9)


@pytest.mark.parametrize("reserves", [True, False])
@pytest.mark.parametrize("delay_s", [0.0, 1e-5])
def test_a_collective_fires_the_callers_event_at_its_end(reserves, delay_s, monkeypatch):
    """run(done=event) fires the caller's event (value: the time the collective ends) instead of an event of its own,
    as a reservation, as phases run one by one and after a host delay, at the time the run without it ends (whose
    event, a reservation's, has that time as its value)."""
    topo = _two_nodes_of_four()
    monkeypatch.setattr(CollectiveRunner, "reserves", reserves)
    phases = ALL_TO_ALL.get("flat")(np.full((8, 8), 1e6), topo.gpus, topo)
    ends = []
    for given in (True, False):
        env = simpy.Environment()
        runner = CollectiveRunner(env, FlowNetwork(env, topo.capacity_bytes_per_s), topo)
        mine = env.event() if given else None
        returned = runner.run(phases, tuple(topo.gpus), "a2a", delay_s=delay_s, done=mine)
        env.run()
        if given:
            assert mine is not None and mine.processed
            ends.append(mine.value)
        else:  # phases run one by one: the event is the phases' own (their finish times), fired at the end
            assert returned.processed
            ends.append(returned.value if reserves and not delay_s else env.now)
        assert ends[-1] == pytest.approx(delay_s + 4e6 / 10e9, rel=1e-9)
    assert ends[0] == ends[1]


def test_flows_that_end_together_end_in_the_order_they_started():
    # fifty equal flows on one link end at the same instant; their sets are handled in start order, not in
    # the order of their hashes (object addresses, which change between processes), so runs repeat exactly
    env = simpy.Environment()
    net = FlowNetwork(env, np.array([1e9]))
    order: list[int] = []

    def one(i):
        yield net.start(np.zeros(1, dtype=np.int64), np.array([0]), np.array([1e6]))
        order.append(i)

    for i in range(50):
        env.process(one(i))
    env.run()
    assert order == list(range(50))
    assert env.now == pytest.approx(50 * 1e6 / 1e9)


def dense_max_min(entry_flow, entry_link, weight, capacity, live):
    """Reference progressive filling, written plainly over a dense flow x link matrix: raise every rising live flow
    by the largest step no link can refuse, freeze the flows of the links that filled, repeat."""
    crosses = np.zeros((weight.size, capacity.size))
    np.add.at(crosses, (entry_flow, entry_link), 1.0)
    crosses *= weight[:, None]
    rising = live & (crosses.sum(axis=1) > 0)
    rate = np.where(live & ~rising, np.inf, 0.0)
    spare = capacity.astype(float).copy()
    while rising.any():
        load = crosses[rising].sum(axis=0)
        used = load > 0
        step = np.min(spare[used] / load[used])
        rate[rising] += step
        spare -= step * load
        full = used & (spare <= 1e-9 * capacity)
        rising &= ~(crosses[:, full] > 0).any(axis=1)
    return rate


def _solve_wave_by_wave(entry_flow, entry_link, weight, sizes, capacity):
    """Reference: the dense filling on the live flows at every wave, run to the next end."""
    remaining, t, finish = sizes.astype(float).copy(), 0.0, np.full(sizes.size, np.nan)
    while (live := remaining > 1e-3).any():
        rate = dense_max_min(entry_flow, entry_link, weight, capacity, live)
        dt = float(np.min(remaining[live] / rate[live]))
        remaining = np.where(live, remaining - rate * dt, 0.0)
        t += dt
        finish[live & (remaining <= 1e-3)] = t
    return finish


@pytest.mark.parametrize("seed", range(12))
def test_isolated_timeline_gives_the_finish_times_of_a_full_solve_at_every_wave(seed):
    """The compiled timeline (kernels.timeline: each wave's filling resumed at the lowest leaver's level): every
    finish time equals the plain wave-by-wave filling's, on random multi-link flow sets with weights and uneven
    capacities, with or without its rates kept."""
    from piper_sim.network.fairshare import isolated_timeline

    rng = np.random.default_rng(seed)
    num_flows, num_links = int(rng.integers(2, 60)), int(rng.integers(1, 20))
    hops = rng.integers(1, 5, size=num_flows)
    entry_flow = np.repeat(np.arange(num_flows), hops)
    entry_link = rng.integers(0, num_links, size=entry_flow.size)
    weight = rng.integers(1, 4, size=num_flows).astype(float)
    sizes = rng.choice([0.0, 1e3, 5e5, 1e6, 3e6], size=num_flows) * rng.uniform(0.5, 1.5, size=num_flows)
    capacity = rng.choice([1e6, 4e6, 1e7], size=num_links + 3)
    timeline = isolated_timeline(entry_flow, entry_link, weight, sizes, capacity)
    expected = _solve_wave_by_wave(entry_flow, entry_link, weight, sizes, capacity)
    expected[sizes <= 1e-3] = 0.0
    np.testing.assert_allclose(timeline.finish_offset_s, expected, rtol=1e-12, atol=0)
    # the rates it kept carry every flow's bytes by its finish, and none after
    starts = np.concatenate([[0.0], timeline.end_s[:-1]])
    sent = ((timeline.end_s - starts)[:, None] * timeline.rates).sum(axis=0)
    np.testing.assert_allclose(sent, np.where(sizes > 1e-3, sizes, 0.0), rtol=1e-9, atol=1e-2)
    assert not (timeline.rates * (timeline.end_s[:, None] > timeline.finish_offset_s[None, :] + 1e-15)).any()
    # without its rates: the same finish times and duration, and no segments to read
    bare = isolated_timeline(entry_flow, entry_link, weight, sizes, capacity, keep_rates=False)
    assert bare.finish_offset_s.tolist() == timeline.finish_offset_s.tolist()
    assert bare.duration_s == timeline.duration_s
    with pytest.raises(ValueError, match="kept no rates"):
        _ = bare.segments


def test_a_phase_that_ran_alone_recomputes_its_rates_when_asked():
    from piper_sim.network.phase_run import PhaseFlows
    from piper_sim.network.recording import PhaseRecord

    flows = PhaseFlows(np.array([0, 1]), np.array([0, 0]), np.array([100.0, 10.0]))
    # one link of 10 B/s: 5 B/s each until t = 2 (flow 1 ends), then 10 B/s for flow 0 until t = 11
    rec = PhaseRecord(start_s=1.0, end_s=12.0, flows=flows, finish_s=np.array([12.0, 3.0]), rates=None)
    remaining, finish = rec.state_at(5.0, np.array([10.0]))
    assert remaining.tolist() == [100.0 - 10.0 - 20.0, 0.0]
    assert np.isnan(finish[0]) and finish[1] == 3.0


@pytest.mark.parametrize("seed", range(8))
def test_filling_gives_the_rates_of_a_plain_filling_as_flows_leave(seed):
    """Filling.solve(live) on one structure (kernels.refill, resumed after departures) gives the plain dense
    filling's rates at every step of a random departure order, flows crossing no link an infinite rate, and again
    when every flow is back."""
    from piper_sim.network.fairshare import Filling

    rng = np.random.default_rng(100 + seed)
    num_flows, num_links = int(rng.integers(5, 80)), int(rng.integers(2, 25))
    hops = rng.integers(0, 5, size=num_flows)  # some flows cross no link: infinite rate
    entry_flow = np.repeat(np.arange(num_flows), hops)
    entry_link = rng.integers(0, num_links, size=entry_flow.size)
    weight = rng.integers(1, 4, size=num_flows).astype(float) / rng.choice([1.0, 3.0])
    capacity = rng.choice([1e6, 4e6, 1e7], size=num_links)
    filling = Filling(entry_flow, entry_link, weight, capacity)
    live = np.ones(num_flows, dtype=bool)
    for leaver in [None, *rng.permutation(num_flows)[: num_flows - 1]]:
        if leaver is not None:
            live[leaver] = False
        expected = dense_max_min(entry_flow, entry_link, weight, capacity, live)
        np.testing.assert_allclose(filling.solve(live), expected, rtol=1e-12, atol=0)
    live[:] = True
    np.testing.assert_allclose(
        filling.solve(live), dense_max_min(entry_flow, entry_link, weight, capacity, live), rtol=1e-12
    )


def _events_from_zero(capacity, sets):
    """Reference for the live network: flow sets (start time, links per flow, bytes per flow); at every start and
    every end the rates of all live flows are solved from zero (max_min_rates). Returns each flow's finish time."""
    flows = [(t0, links, size) for t0, links_of, sizes in sets for links, size in zip(links_of, sizes, strict=True)]
    starts = np.array([t0 for t0, _, _ in flows])
    remaining = np.array([size for _, _, size in flows], dtype=float)
    finish = np.full(len(flows), np.nan)
    entry_flow = np.concatenate([np.full(len(links), f) for f, (_, links, _) in enumerate(flows)])
    entry_link = np.concatenate([np.asarray(links) for _, links, _ in flows])
    t = 0.0
    while np.isnan(finish).any():
        live = (starts <= t) & np.isnan(finish)
        keep = live[entry_flow]
        rate = np.where(live, max_min_rates(entry_flow[keep], entry_link[keep], np.ones(len(flows)), capacity), 0.0)
        pending = starts[starts > t]
        dt = float(np.min(remaining[live] / rate[live])) if live.any() else np.inf
        if pending.size:
            dt = min(dt, float(pending.min()) - t)
        remaining = np.where(live, remaining - rate * dt, remaining)
        t += dt
        ended = live & (remaining <= 1e-3 * (1 + 1e-9))
        finish[ended] = t
    return finish


@pytest.mark.parametrize("seed", range(6))
def test_the_live_network_with_resumed_fillings_gives_the_finish_times_of_solves_from_zero(seed):
    """Flow sets that start at random times on shared links (components that grow and shrink, solved again at
    every end with the filling resumed): every flow ends when an event simulation solving from zero says."""
    rng = np.random.default_rng(200 + seed)
    num_links = int(rng.integers(2, 8))
    capacity = rng.choice([1e6, 4e6], size=num_links).astype(float)
    sets = []
    for _ in range(int(rng.integers(2, 6))):
        n = int(rng.integers(1, 12))
        links_of = [
            rng.choice(num_links, size=int(rng.integers(1, min(4, num_links + 1))), replace=False) for _ in range(n)
        ]
        sets.append((float(rng.choice([0.0, 0.05, 0.3])), links_of, rng.uniform(1e4, 1e6, size=n)))
    env = simpy.Environment()
    net = FlowNetwork(env, capacity)
    got: dict[int, np.ndarray] = {}

    def one(index, t0, links_of, sizes):
        yield env.timeout(t0)
        entry_flow = np.concatenate([np.full(len(links), f) for f, links in enumerate(links_of)])
        got[index] = np.asarray((yield net.start(entry_flow, np.concatenate(links_of), sizes)))

    for index, (t0, links_of, sizes) in enumerate(sets):
        env.process(one(index, t0, links_of, sizes))
    env.run()
    np.testing.assert_allclose(
        np.concatenate([got[i] for i in range(len(sets))]), _events_from_zero(capacity, sets), rtol=1e-9, atol=0
    )


@pytest.mark.parametrize("small_bytes, shares", [(2.0, False), (200.0, True)])
def test_a_set_too_small_to_share_links_ends_as_it_starts(small_bytes, shares):
    """A flow set whose bytes hold each of its links at most 50 ns (three 2-byte flows on a 10 GB/s link: 0.6 ns)
    takes no part in the sharing: its flows end as they enter and the flow already on the link keeps its rate; at
    200 B a flow (60 ns on link 0) they share the link as any flows do."""
    env = simpy.Environment()
    net = FlowNetwork(env, np.array([10e9, 10e9]))
    big = net.start(np.array([0]), np.array([0]), np.array([1e6]))
    small: list = []

    def later():
        yield env.timeout(1e-5)
        small.append(net.start(np.array([0, 1, 2, 3]), np.array([0, 0, 0, 1]), np.full(4, small_bytes)))

    env.process(later())
    env.run(big)
    env.run()
    finish = small[0].value
    if shares:
        assert big.value[0] > 1e6 / 10e9 * (1 + 1e-12)
        assert finish.max() > 1e-5 + 4 * small_bytes / 10e9 * (1 - 1e-9)  # three of them share link 0 with the big one
    else:
        assert big.value[0] == pytest.approx(1e6 / 10e9, rel=1e-12)
        np.testing.assert_array_equal(finish, 1e-5)


@pytest.mark.parametrize("t0", [0.1, 0.3, 1.7])
def test_a_set_joining_a_memoized_run_as_it_ends_gets_every_finish_time(t0):
    """B starts on A's link at A's end, before A's own timer fires at that instant. now - t_start rounds below A's
    finish offset (checked), so A's memoized run leaves its flow a few ulps of bytes: it must end then, with a
    finite finish time, not stay a flow set with nothing live and a NaN finish (it once stalled a ZeRO-2 plan)."""
    size, capacity = 1e6, 3e10
    duration = size / capacity
    assert (t0 + duration) - t0 < duration  # the rounding this case is about
    env = simpy.Environment()
    net = FlowNetwork(env, np.array([capacity]))
    link = np.zeros(1, dtype=np.int64)
    got = {}

    def start(name, at_s):
        yield env.timeout(at_s)
        got[name] = np.asarray((yield net.start(link, link, np.array([size]), key=name)))

    env.process(start("b", t0 + duration))  # its timer precedes A's at the same instant
    env.process(start("a", t0))
    env.run()
    assert got["a"] == pytest.approx([t0 + duration], rel=1e-12)
    assert got["b"] == pytest.approx([t0 + 2 * duration], rel=1e-12)


def test_an_adopted_set_with_bytes_below_the_threshold_has_ended():
    """A broken reservation's bytes left come from subtracting recorded rates: a flow left with less than
    EPS_BYTES has ended at adoption, with a finish time, while the others run on."""
    env = simpy.Environment()
    net = FlowNetwork(env, np.array([1e9]))
    done = env.event()
    fs = net.adopt(np.array([0, 1]), np.array([0, 0]), np.ones(2), np.array([5e-8, 1e6]), np.full(2, np.nan), 0.0, done)
    net.resolve_sets([fs])
    env.run()
    np.testing.assert_allclose(done.value, [0.0, 1e6 / 1e9], rtol=1e-12)


def _two_gpu_runner():
    topo = load_topology(
        {
            "builder": "uniform",
            "params": {
                "gpus_per_node": 2,
                "intra_bandwidth_GBps": 100,
                "intra_latency_us": 1.0,
                "nic_bandwidth_GBps": 10,
                "nic_latency_us": 3.0,
                "switch_latency_us": 0.5,
            },
        },
        4,
    )
    env = simpy.Environment()
    return env, CollectiveRunner(env, FlowNetwork(env, topo.capacity_bytes_per_s), topo)


def test_a_non_finite_size_fails_at_the_start_naming_the_collective():
    env, runner = _two_gpu_runner()
    gpus = ("n0.g0", "n1.g0")
    phase = Phase(src=np.array([0]), dst=np.array([1]), sizes=np.array([np.nan]))
    done = runner.run([phase], gpus, (gpus, "p2p", "act"))
    with pytest.raises(RuntimeError, match=r"n0\.g0', 'n1\.g0'\), 'p2p', 'act'.*\[nan\]"):
        env.run(done)


@pytest.mark.parametrize("broken", ["finish", "duration"])
def test_a_non_finite_time_fails_where_the_network_makes_it(broken):
    """A flow set whose run gives a NaN finish time or end fails there, naming its key and the value, instead of
    handing NaN on (a NaN timer never fires; a NaN finish time left stages unfinished: a reported deadlock)."""
    env = simpy.Environment()
    net = FlowNetwork(env, np.array([1e9]))
    link, size = np.zeros(1, dtype=np.int64), np.array([1e6])
    end = np.array([np.nan if broken == "duration" else 1e-3])
    finish = np.array([np.nan if broken == "finish" else 1e-3])
    net._timelines[(("grad", 3), size.tobytes())] = Timeline(end, np.array([[1e9]]), finish)  # a corrupt memo
    with pytest.raises(RuntimeError, match=r"\('grad', 3\).*nan"):
        net.start(link, link, size, key=("grad", 3))  # a NaN duration fails here, a NaN finish at its end
        env.run()
