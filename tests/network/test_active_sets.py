"""The active flow sets (flow_set.ActiveSets) find exactly the sets a new set shares a link with, as a test
of every active set would, while sets start and end (and their ended entries are compacted away)."""

from __future__ import annotations

import numpy as np

from piper_sim.network.flow_set import ActiveSets, FlowSet

NUM_LINKS = 300


def _set(rng: np.random.Generator, seq: int) -> FlowSet:
    links = np.unique(rng.integers(0, NUM_LINKS, size=int(rng.integers(0, 40))))
    empty = np.zeros(0, dtype=np.int64)
    return FlowSet(empty, empty, np.zeros(0), np.zeros(0), None, 0.0, links, seq)  # type: ignore[arg-type]


def test_the_sets_sharing_a_link_are_those_a_scan_of_every_active_set_finds():
    rng = np.random.default_rng(7)
    index, active, seq = ActiveSets(), [], 0
    for _ in range(2000):
        if active and rng.random() < 0.45:
            index.remove(active.pop(int(rng.integers(len(active)))))
            continue
        fs = _set(rng, seq)
        seq += 1
        mask = np.zeros(NUM_LINKS, dtype=bool)
        mask[fs.links] = True
        assert index.sharing(mask) == {other for other in active if mask[other.links].any()}
        index.add(fs)
        active.append(fs)
    assert set(index.sets.values()) == set(active)
    assert index.size <= 2 * sum(fs.links.shape[0] for fs in active) + 1  # ended entries compacted away
