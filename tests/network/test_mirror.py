"""A flow set's timeline alone is found again for the same flows in another order and for its mirror image (every
path reversed) where the links back have the same capacities: the same max-min problem, so the same finish times
as solving it (piper_sim.network.mirror)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from piper_sim.config import load_config
from piper_sim.network import mirror
from piper_sim.network.fairshare import isolated_timeline
from piper_sim.network.mirror import TimelineMemo
from piper_sim.simulator import simulate
from piper_sim.topology.load import load_topology

CLUSTER = {
    "builder": "uniform",
    "params": {"gpus_per_node": 4, "intra_bandwidth_GBps": 100, "nic_bandwidth_GBps": 12.5},
}


def _flows(topo, matrix: np.ndarray, transposed: bool = False):
    """The all-to-all of `matrix` (its transpose: each pair's bytes sent back) as a flow set on topo's routes."""
    entry_flow, entry_link, sizes = [], [], []
    for i, j in zip(*np.nonzero(matrix), strict=True):
        src, dst = (topo.gpus[j], topo.gpus[i]) if transposed else (topo.gpus[i], topo.gpus[j])
        for fraction, links in topo.paths(src, dst):
            entry_flow += [len(sizes)] * len(links)
            entry_link += list(links)
            sizes.append(fraction * matrix[i, j])
    return np.array(entry_flow), np.array(entry_link), np.ones(len(sizes)), np.array(sizes)


def _skewed(n: int, seed: int = 3) -> np.ndarray:
    matrix = np.random.default_rng(seed).pareto(1.2, size=(n, n)) * 1e6 + 1e4
    np.fill_diagonal(matrix, 0.0)
    return matrix


def _assert_solved_alike(timeline, flows, capacity):
    solved = isolated_timeline(*flows, capacity, keep_rates=False)
    np.testing.assert_allclose(timeline.end_s, solved.end_s, rtol=1e-12)
    np.testing.assert_allclose(timeline.finish_offset_s, solved.finish_offset_s, rtol=1e-12)


def test_a_transposed_all_to_all_takes_the_timeline_of_its_matrix():
    topo = load_topology(CLUSTER, 16)
    capacity = topo.capacity_bytes_per_s
    memo = TimelineMemo(capacity, topo.reverse_link)
    matrix = _skewed(16)
    memo.timeline(*_flows(topo, matrix))
    back = _flows(topo, matrix, transposed=True)
    timeline = memo.timeline(*back)
    assert (memo.num_solved, memo.num_mirrored) == (1, 1)
    assert timeline.num_waves > 10  # an uneven matrix: many waves, not one
    _assert_solved_alike(timeline, back, capacity)


def test_the_same_flows_in_another_order_take_its_timeline():
    topo = load_topology(CLUSTER, 16)
    capacity = topo.capacity_bytes_per_s
    memo = TimelineMemo(capacity)  # no links back given: no mirror images looked for
    entry_flow, entry_link, weight, sizes = _flows(topo, _skewed(16))
    memo.timeline(entry_flow, entry_link, weight, sizes)
    order = np.random.default_rng(0).permutation(sizes.shape[0])  # new flow k is old flow order[k]
    position = np.argsort(order)
    shuffled = (position[entry_flow], entry_link, weight[order], sizes[order])
    timeline = memo.timeline(*shuffled)
    assert (memo.num_solved, memo.num_reordered, memo.num_mirrored) == (1, 1, 0)
    _assert_solved_alike(timeline, shuffled, capacity)
    assert memo.timeline(*_flows(topo, _skewed(16), transposed=True)) is not None and memo.num_solved == 2


def test_no_mirror_image_is_taken_where_a_link_back_is_slower():
    topo = load_topology(CLUSTER, 16)
    capacity = topo.capacity_bytes_per_s.copy()
    up = topo.link_kinds.index(next(k for k in topo.link_kinds if k != topo.link_kinds[0]))
    capacity[up] /= 2  # one link now differs from its link back
    reverse = topo.reverse_link.copy()
    reverse[up] = reverse[reverse[up]] = -1
    memo = TimelineMemo(capacity, reverse)
    matrix = _skewed(16)
    memo.timeline(*_flows(topo, matrix))
    back = _flows(topo, matrix, transposed=True)
    _assert_solved_alike(memo.timeline(*back), back, capacity)
    assert (memo.num_solved, memo.num_mirrored) == (2, 0)


def test_a_key_collision_is_caught_by_the_exact_check(monkeypatch):
    topo = load_topology(CLUSTER, 16)
    capacity = topo.capacity_bytes_per_s
    memo = TimelineMemo(capacity, topo.reverse_link)
    memo._code[:] = 1  # every link hashes alike: flow sets of equal sizes and path lengths collide
    sizes = np.full(40, 1e6)
    first = (np.repeat(np.arange(40), 1), np.repeat(np.arange(2), 20), np.ones(40), sizes)
    second = (np.repeat(np.arange(40), 1), np.arange(40) % 8, np.ones(40), sizes)
    memo.timeline(*first)
    _assert_solved_alike(memo.timeline(*second), second, capacity)
    assert memo.num_solved == 2 and memo.num_reordered == memo.num_mirrored == 0


def test_flows_of_other_sizes_or_weights_under_a_colliding_key_are_solved(monkeypatch):
    topo = load_topology(CLUSTER, 16)
    capacity = topo.capacity_bytes_per_s
    memo = TimelineMemo(capacity, topo.reverse_link)
    monkeypatch.setattr(TimelineMemo, "_key", staticmethod(lambda flow, code, weight, sizes: (b"k", np.argsort(flow))))
    links = (np.arange(40), np.arange(40) % 8)
    memo.timeline(*links, np.ones(40), np.full(40, 1e6))
    for weight, sizes in ((np.ones(40), np.linspace(1e6, 2e6, 40)), (np.full(40, 2.0), np.full(40, 1e6))):
        _assert_solved_alike(memo.timeline(*links, weight, sizes), (*links, weight, sizes), capacity)
    assert memo.num_solved == 3 and memo.num_reordered == memo.num_mirrored == 0


def test_link_set_hashes_are_wrapping_sums_in_any_order():
    rng = np.random.default_rng(3)
    group = rng.integers(0, 40, 500)
    codes = rng.integers(0, 2**63, 500, dtype=np.uint64) * np.uint64(2) + np.uint64(1)  # sums wrap past 2^64
    expected = np.zeros(40, dtype=np.uint64)
    np.add.at(expected, group, codes)
    assert np.array_equal(mirror._wrapped_sums(group, codes, 40), expected)
    shuffled = rng.permutation(500)
    assert np.array_equal(mirror._wrapped_sums(group[shuffled], codes[shuffled], 40), expected)


def test_links_back_are_the_reversed_links_of_equal_capacity():
    topo = load_topology("frontier", 64)
    reverse = topo.reverse_link
    has_back = np.flatnonzero(reverse >= 0)
    assert has_back.size > 0.9 * reverse.size
    for i in has_back:
        u, v = topo.links[i]
        assert topo.links[reverse[i]] == (v, u)
        assert topo.capacity_bytes_per_s[reverse[i]] == topo.capacity_bytes_per_s[i]


@pytest.mark.parametrize("topology", [CLUSTER, "frontier"])
def test_a_skewed_run_is_the_same_with_and_without_mirror_images(topology, monkeypatch):
    raw = {
        "model": {"preset": "small-moe", "num_experts": 16},
        "topology": topology,
        "routing": {"kind": "zipf", "exponent": 1.2},
        "parallel": {"pp": 2, "ep": 16, "num_microbatches": 4, "micro_batch_size": 2},
    }
    with_mirrors = simulate(load_config(raw))
    monkeypatch.setattr(mirror, "MIN_FLOWS", 1 << 30)  # every timeline solved
    solved = simulate(load_config(raw))
    assert with_mirrors.stats["num_mirrored"] > 0 and solved.stats["num_mirrored"] == 0
    pd.testing.assert_frame_equal(with_mirrors.trace, solved.trace, rtol=1e-12)
