"""Exact flow aggregation, vectorized routes, and the all-to-all study (CSV, HALO vs flat)."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import simpy

from piper_sim.cli import main as cli_main
from piper_sim.collectives.algorithms import ALL_TO_ALL, split_phases
from piper_sim.network import CollectiveRunner, FlowNetwork, lump, merge_identical
from piper_sim.studies.all_to_all import KIND_COLUMNS, STUDY_COLUMNS, StudySpec, write_study
from piper_sim.studies.reduced_collective import prepare, run_collective, simulate
from piper_sim.studies.routes import RouteTable, mix64_array
from piper_sim.topology.load import load_topology
from piper_sim.topology.spread import all_detours
from piper_sim.topology.structured import mix64

UNIFORM = {
    "builder": "uniform",
    "params": {"gpus_per_node": 8, "intra_bandwidth_GBps": 100, "nic_bandwidth_GBps": 12.5, "message_overhead_us": 2.0},
}
DRAGONFLY = {"preset": "dragonfly", "params": {"num_groups": 3}}


def engine_time(phases, topo) -> float:
    """The reference: the engine's CollectiveRunner on the unreduced flows."""
    env = simpy.Environment()
    env.run(CollectiveRunner(env, FlowNetwork(env, topo.capacity_bytes_per_s), topo).run(phases, tuple(topo.gpus), 0))
    return env.now


def flows_time(entry_flow, entry_link, sizes, capacity, weight=None) -> float:
    env = simpy.Environment()
    net = FlowNetwork(env, capacity)
    env.run(net.start(entry_flow, entry_link, sizes, weight=weight))
    return env.now


# ---- exactness -----------------------------------------------------------------------------------
def test_merging_identical_flows_is_exact():
    rng = np.random.default_rng(1)
    capacity = rng.uniform(1e9, 5e9, 6)
    routes = [(0, 1), (1, 0), (2,), (0, 1), (3, 4, 5), (2,), (0, 1), (5, 4, 3)]  # repeats, reordered links
    sizes = np.array([1e8, 1e8, 3e8, 1e8, 2e8, 3e8, 5e7, 2e8])
    entry_flow = np.concatenate([[f] * len(r) for f, r in enumerate(routes)])
    entry_link = np.concatenate([r for r in routes])
    merged = merge_identical(entry_flow, entry_link, sizes)
    assert merged.sizes.size == 4 and merged.weight.sum() == 8  # (0,1)x3 splits by size: 1e8 x3 merge, 5e7 alone
    assert flows_time(merged.entry_flow, merged.entry_link, merged.sizes, capacity, merged.weight) == pytest.approx(
        flows_time(entry_flow, entry_link, sizes, capacity), rel=1e-12
    )


def test_lumping_symmetric_flows_gives_one_class():
    # 4 flows, each on its own 1 GB/s link and all on one shared 2 GB/s link: one class, rate 0.5 GB/s
    entry_flow = np.repeat(np.arange(4), 2)
    entry_link = np.array([0, 4, 1, 4, 2, 4, 3, 4])
    capacity = np.array([1e9, 1e9, 1e9, 1e9, 2e9])
    lp = lump(entry_flow, entry_link, np.full(4, 1e9), capacity)
    assert lp.exact_check and lp.num_flow_classes == 1 and lp.num_link_classes == 2
    assert flows_time(lp.entry_flow, lp.entry_link, lp.sizes, lp.capacity, lp.weight) == pytest.approx(2.0)


@pytest.mark.parametrize(("spec", "num_gpus"), [(UNIFORM, 32), ({"preset": "frontier"}, 16), (DRAGONFLY, 24)])
@pytest.mark.parametrize("algorithm", ["flat", "halo", "2dh"])
@pytest.mark.parametrize("matrix", ["uniform", "uneven"])
def test_lumped_run_equals_the_engine(spec, num_gpus, algorithm, matrix):
    topo = load_topology(spec, num_gpus)
    n = topo.num_gpus
    m = (
        np.full((n, n), 2.0**20)
        if matrix == "uniform"
        else np.random.default_rng(0).exponential(1e6, (n, n)) * (np.random.default_rng(1).random((n, n)) < 0.5)
    )
    phases = ALL_TO_ALL.get(algorithm)(m, topo.gpus, topo)
    prep, run = run_collective(phases, topo.gpus, topo)
    assert prep.lumped.exact_check
    assert run.time_s == pytest.approx(engine_time(phases, topo), rel=1e-12)
    if matrix == "uniform":
        assert prep.lumped.num_flow_classes < prep.num_routed


@pytest.mark.parametrize("algorithm", ["flat", "2dh"])
@pytest.mark.parametrize("spec", [UNIFORM, {"preset": "frontier", "params": {"routing": "minimal"}}])
def test_host_symmetry_reduction_is_exact(spec, algorithm):
    topo = load_topology(spec, 64)
    # the data phases (2dh's ring gather of the splits is not host-invariant; the study times it apart)
    phases = split_phases(ALL_TO_ALL.get(algorithm)(np.full((64, 64), 2.0**20), topo.gpus, topo))[1]
    prep = prepare(phases, topo.gpus, topo, symmetric=True)
    assert prep.symmetric and prep.num_routed < prep.num_sub_flows
    run = simulate(prep, topo)
    assert run.time_s == pytest.approx(engine_time(phases, topo), rel=1e-12)
    np.testing.assert_allclose(
        run.link_bytes, simulate(prepare(phases, topo.gpus, topo), topo).link_bytes, rtol=1e-9, atol=1e-3
    )


def test_spread_detours_lump_exactly_and_contain_the_hashed_choice():
    topo = load_topology(DRAGONFLY, 48)
    fabric = topo.router.fabric
    for key in range(50):
        a, b = fabric.switch_name(0, key % 4), fabric.switch_name(1 + key % 2, (key // 2) % 4)
        assert fabric.valiant_path(a, b, mix64(key)) in [seq for seq, _ in all_detours(fabric, a, b)]
    phases = ALL_TO_ALL.get("flat")(np.full((48, 48), 2.0**20), topo.gpus, topo)
    lumped = simulate(prepare(phases, topo.gpus, topo, spread=True, symmetric=True), topo).time_s
    assert lumped == pytest.approx(
        simulate(prepare(phases, topo.gpus, topo, spread=True, lump_flows=False), topo).time_s, rel=1e-12
    )


@pytest.mark.parametrize(
    "spec",
    [
        {"preset": "frontier"},
        {"preset": "dragonfly", "params": {"num_groups": 3, "routing": "valiant"}},
        {"preset": "dgx-h100-superpod"},
        UNIFORM,
    ],
)
def test_vectorized_routes_match_topology_paths(spec):
    topo = load_topology(spec, 64)
    rng = np.random.default_rng(0)
    src, dst = rng.integers(0, topo.num_gpus, 300), rng.integers(0, topo.num_gpus, 300)
    keep = src != dst
    src, dst = src[keep], dst[keep]
    sf = RouteTable(topo, topo.gpus).sub_flows(src, dst)
    got: dict[int, list] = {}
    for k in range(sf.pair.size):
        links = tuple(sf.entry_link[sf.entry_flow == k].tolist())
        got.setdefault(int(sf.pair[k]), []).append((round(float(sf.fraction[k]), 12), links))
    for p, (s, d) in enumerate(zip(src.tolist(), dst.tolist(), strict=True)):
        expect = [(round(f, 12), links) for f, links in topo.paths(topo.gpus[s], topo.gpus[d])]
        assert sorted(got[p]) == sorted(expect)


def test_mix64_vectorized():
    values = np.array([0, 1, 7, 2**40 + 3])
    assert mix64_array(5, values, 3).tolist() == [mix64(5, int(v), 3) for v in values]


# ---- the study -----------------------------------------------------------------------------------
def test_study_writes_csv_and_plots(tmp_path):
    out = tmp_path / "study"
    rc = cli_main(
        [
            "study",
            "all-to-all",
            "--topology",
            "uniform",
            "--nodes",
            "1,2",
            "--sizes",
            "64KiB,1MiB",
            "--algorithms",
            "flat,2dh,halo",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    with (out / "study.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == STUDY_COLUMNS and len(rows) == 2 * 3 * 2
    two = {(r["algorithm"], r["size"]): r for r in rows if r["nodes"] == "2"}
    flat = two[("flat", "1MiB")]
    n = 16
    assert flat["size_per"] == "gpu" and float(flat["bytes_per_gpu"]) == 2**20  # the default: each GPU's buffer
    assert float(flat["busbw_bytes_per_s"]) == pytest.approx(
        2**20 * (n - 1) / n / float(flat["time_s"])
    )  # bus bandwidth = bytes each GPU sends to others / time
    assert flat["busiest_link_kind"] in ("gpu_nic", "nic")
    with (out / "link_kinds.csv").open() as f:
        assert list(next(csv.DictReader(f))) == KIND_COLUMNS
    for name in ("bandwidth.png", "speedup.png", "link_kinds.png", "tables.md", "study.yaml"):
        assert (out / name).exists(), name


def test_interrupted_study_keeps_completed_rows(tmp_path):
    calls = []

    def log(line: str) -> None:
        calls.append(line)
        if len(calls) == 4:  # after the second completed run
            raise KeyboardInterrupt

    spec = StudySpec(topology="uniform", nodes=(1, 2), sizes=("1MiB",), algorithms=("flat", "halo"))
    with pytest.raises(KeyboardInterrupt):
        write_study(spec, tmp_path, log)
    with (tmp_path / "study.csv").open() as f:
        assert len(list(csv.DictReader(f))) == 1


@pytest.mark.parametrize("chunk_mib", [64.0, 1.0])
def test_halo_vs_flat_on_one_non_blocking_switch(chunk_mib):
    """Uniform cluster: every NIC on one non-blocking switch, 9 nodes x 8 GPUs, 1 MiB per pair (o = 2 us).

    Flat exchanges the split sizes by itself (71 messages per GPU), then sends 64 MiB per GPU through its
    NIC: T = 64 MiB / 12.5 GB/s, plus 71 o. HALO exchanges the sizes by itself (phase I, 7 messages,
    concurrent with II, 8 messages; then III, 7), then every GPU sends one 8 MiB message to each of the 8
    other nodes through its own NIC (T again: the NICs carry what flat's do) while phase I runs on the node
    switch, and each relay forwards 7/8 of what it got (56 MiB over the 100 GB/s node link). Unpipelined
    (64 MiB chunks: one slice) that forwarding is a store-and-forward stage after T and HALO runs at 0.94
    of flat; cut into S = 8 slices of 1 MiB, slice s is forwarded while slice s + 1 is in flight (disjoint
    links), so only the last slice's forwarding shows and each slice pays its 8 posts again: HALO then
    matches flat (flat's 2 x 71 posted messages cost about what HALO's 8 x 8 posts and last slice do).
    """
    topo = load_topology({**UNIFORM, "collectives": {"halo": {"chunk_MiB": chunk_mib}}}, 72)
    m = np.full((72, 72), 2.0**20)
    t = {
        alg: run_collective(ALL_TO_ALL.get(alg)(m, topo.gpus, topo), topo.gpus, topo)[1].time_s
        for alg in ("flat", "halo")
    }
    big_t, o, relay = 64 * 2.0**20 / 12.5e9, 2e-6, 56 * 2.0**20 / 100e9
    inter = topo.path_latency_s(topo.route(topo.gpus[0], topo.gpus[8]))
    intra = topo.path_latency_s(topo.route(topo.gpus[0], topo.gpus[1]))
    assert t["flat"] == pytest.approx((71 * o + inter) + (big_t + 71 * o + inter), rel=1e-3)
    splits = max(7 * o + intra, 8 * o + inter) + (7 * o + intra)
    slices = 1 if chunk_mib > 8 else 8
    halo = splits + big_t + slices * (8 * o + inter) + relay / slices + 7 * o + intra
    assert t["halo"] == pytest.approx(halo, rel=1e-3)
    if slices == 1:
        assert 0.93 < t["flat"] / t["halo"] < 0.95
    else:
        assert 1.0 < t["flat"] / t["halo"] < 1.01


def test_tapered_dragonfly_halo_vs_flat_ratio_and_reason():
    """Across dragonfly groups (2 groups, 2 x 25 GB/s global links per direction for 8 nodes per group).

    Both move the same bytes over the same saturated global links (busiest kind "global" for both), so HALO
    and flat take the same time to within 1%: HALO's forwarding inside the node is pipelined behind the
    transfer, and its fewer messages (at most 15 per phase against flat's 63) save 0.1 ms of a 21 ms
    transfer.
    """
    topo = load_topology({"preset": "dragonfly"}, 64)
    m = np.full((64, 64), 2.0**20)
    phases = {alg: ALL_TO_ALL.get(alg)(m, topo.gpus, topo) for alg in ("flat", "halo")}
    runs = {alg: run_collective(ph, topo.gpus, topo) for alg, ph in phases.items()}
    t = {alg: run.time_s for alg, (_, run) in runs.items()}
    assert t["flat"] / t["halo"] == pytest.approx(1.0, abs=0.01)
    for _, run in runs.values():
        util = run.link_bytes / (topo.capacity_bytes_per_s * run.time_s)
        assert topo.link_kinds[int(np.argmax(util))] == "global" and util.max() > 0.93
    global_links = [i for i, kind in enumerate(topo.link_kinds) if kind == "global"]
    flat_bytes, halo_bytes = (runs[a][1].link_bytes[global_links].sum() for a in ("flat", "halo"))
    assert halo_bytes == pytest.approx(flat_bytes, rel=1e-9)


@pytest.mark.parametrize("routing", ["minimal", "adaptive"])
def test_switch_automorphisms_reduce_exactly(routing):
    """A small Frontier-like dragonfly (3 groups of 8 switches, 4 global links per group pair): chassis-block
    rotations (paired across groups) are verified automorphisms; the reduced run equals the unreduced one."""
    params = {
        "switches_per_group": 8,
        "nodes_per_switch": 1,
        "global_links_per_group_pair": 4,
        "num_groups": 3,
        "routing": routing,
    }
    topo = load_topology({"preset": "frontier", "params": params}, 192)
    phases = ALL_TO_ALL.get("flat")(np.full((192, 192), 2.0**20), topo.gpus, topo)
    spread = routing == "adaptive"
    reduced = prepare(phases, topo.gpus, topo, symmetric=True, spread=spread)
    assert reduced.num_automorphisms >= 1
    full = prepare(phases, topo.gpus, topo, spread=spread, symmetric=False)
    assert reduced.num_routed < full.num_routed / 2
    t = simulate(reduced, topo).time_s
    assert t == pytest.approx(simulate(full, topo).time_s, rel=1e-12)
    if routing == "minimal":
        assert t == pytest.approx(engine_time(phases, topo), rel=1e-12)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("counts", ["ones", "mixed"])
def test_the_sorted_equitability_check_agrees_with_the_histogram(seed, counts, monkeypatch):
    """_links_equitable's two ways (one dense histogram; sorted keys for many links x flow classes) give the same
    answer, on partitions that are equitable and on ones a swapped incidence spoils."""
    import numpy as np

    import piper_sim.network.aggregate as aggregate

    rng = np.random.default_rng(seed)
    num_links, num_fcls = 12, 5
    lcls = rng.integers(0, 3, size=num_links)
    pattern = {c: rng.integers(0, 3, size=num_fcls) for c in range(3)}  # flows of each class per link, by class
    local_link, fcol = [], []
    for link in range(num_links):
        for f, n in enumerate(pattern[int(lcls[link])]):
            local_link += [link] * int(n)
            fcol += [f] * int(n)
    local_link, fcol = np.array(local_link), np.array(fcol)
    entry_count = np.ones(fcol.size) if counts == "ones" else rng.choice([1.0, 2.0], size=fcol.size)
    lcount = np.ones(num_links)
    cases = [(local_link, fcol)]
    if fcol.size > 1:  # move one incidence to another link: usually no longer equitable
        moved = local_link.copy()
        moved[0] = (moved[0] + 1) % num_links
        cases.append((moved, fcol))
    for links, cols in cases:
        dense = aggregate._links_equitable(lcls, links, cols, entry_count, lcount)
        monkeypatch.setattr(aggregate, "DENSE_HISTOGRAM_CELLS", 0)
        assert aggregate._links_equitable(lcls, links, cols, entry_count, lcount) == dense
        monkeypatch.setattr(aggregate, "DENSE_HISTOGRAM_CELLS", 40_000_000)


@pytest.mark.parametrize("topology,nodes", [(UNIFORM, 3), ("frontier", 2)])
def test_a_collective_on_the_same_pairs_reuses_the_prepared_one_with_a_factor_per_kind_of_pair(topology, nodes):
    """rccl's flows are flat's with its own intra-node and network efficiencies (0.5 and 0.8 here): the cache
    prepares flat once and runs rccl on it, each class's sizes times its phase's factor for its kind of pair;
    the time and every link's bytes equal a fresh preparation of rccl's phases, and the engine's."""
    from piper_sim.studies.prepcache import PreparedCache

    topo = load_topology(topology, 8 * nodes)
    topo.collectives = {
        "rccl": {
            "peers_in_flight": 4,
            "per_peer_us": 3.0,
            "per_chunk_us": 1.0,
            "intra_efficiency": 0.5,
            "net_efficiency": 0.8,
            "intra_per_chunk_us": 0.0,
        }
    }
    n = len(topo.gpus)
    matrix = np.full((n, n), 2.0**20)
    cache = PreparedCache(list(topo.gpus), topo)
    _, flat = split_phases(ALL_TO_ALL.get("flat")(matrix, topo.gpus, topo))
    _, rccl = split_phases(ALL_TO_ALL.get("rccl")(matrix, topo.gpus, topo))
    assert not np.allclose(rccl[0].sizes / rccl[0].sizes.max(), 1.0)  # not proportional to flat's
    first = cache.get(flat, True)
    reused = cache.get(rccl, True)
    assert first.prepare_s > 0 and reused.prepare_s == 0.0
    fresh = simulate(prepare(rccl, topo.gpus, topo, symmetric=True), topo)
    run = simulate(reused, topo)
    assert run.time_s == pytest.approx(fresh.time_s, rel=1e-12)
    np.testing.assert_allclose(run.link_bytes, fresh.link_bytes, rtol=1e-12)
    assert run.time_s == pytest.approx(engine_time(rccl, topo), rel=1e-9)


def test_a_class_holding_both_kinds_of_pair_is_not_rescaled_by_two_factors():
    from dataclasses import replace

    from piper_sim.studies.prepcache import rescaled

    topo = load_topology(UNIFORM, 16)
    _, flat = split_phases(ALL_TO_ALL.get("flat")(np.ones((16, 16)), topo.gpus, topo))
    prep = prepare(flat, topo.gpus, topo)
    assert set(prep.class_remote.tolist()) == {0, 1}
    mixed = replace(prep, class_remote=np.full_like(prep.class_remote, -1))
    assert rescaled(mixed, np.array([[2.0, 3.0]])) is None
    same = rescaled(mixed, np.array([[2.0, 2.0]]))
    np.testing.assert_allclose(same.lumped.sizes, 2.0 * prep.lumped.sizes)
