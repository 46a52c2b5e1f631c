"""Flow sets that start at one instant enter the network together (FlowNetwork(batch=True), network/batch.py): those
that share links as one set of parts. Every flow ends when the unbatched network and an event simulation solving
from zero say, and every set's event fires at its own last flow's end."""

from __future__ import annotations

import numpy as np
import pytest
import simpy
from test_network import _events_from_zero

from piper_sim.network import FlowNetwork, overlapping


def _random_sets(seed: int) -> tuple[np.ndarray, list]:
    """Flow sets on a few shared links, several of them starting at each of a few instants."""
    rng = np.random.default_rng(500 + seed)
    num_links = int(rng.integers(3, 9))
    capacity = rng.choice([1e6, 4e6], size=num_links).astype(float)
    sets = []
    for _ in range(int(rng.integers(3, 9))):
        n = int(rng.integers(1, 6))
        links_of = [
            rng.choice(num_links, size=int(rng.integers(1, min(3, num_links) + 1)), replace=False) for _ in range(n)
        ]
        sizes = rng.choice([2e4, 1e5, 3e5], size=n) if rng.random() < 0.5 else rng.uniform(1e4, 1e6, size=n)
        sets.append((float(rng.choice([0.0, 0.05, 0.3])), links_of, sizes))
    return capacity, sets


def _run(capacity: np.ndarray, sets: list, batch: bool, keyed: bool) -> tuple[np.ndarray, list[float]]:
    """Each flow's finish time, and the time each set's event fired at."""
    env = simpy.Environment()
    net = FlowNetwork(env, capacity, batch=batch)
    got: dict[int, np.ndarray] = {}
    fired: dict[int, float] = {}

    def one(index, t0, links_of, sizes):
        yield env.timeout(t0)
        entry_flow = np.concatenate([np.full(len(links), f) for f, links in enumerate(links_of)])
        key = ("set", index) if keyed else None
        got[index] = np.asarray((yield net.start(entry_flow, np.concatenate(links_of), sizes, key=key)))
        fired[index] = env.now

    for index, (t0, links_of, sizes) in enumerate(sets):
        env.process(one(index, t0, links_of, sizes))
    env.run()
    assert not net.active
    return np.concatenate([got[i] for i in range(len(sets))]), [fired[i] for i in range(len(sets))]


@pytest.mark.parametrize("keyed", [False, True])
@pytest.mark.parametrize("seed", range(8))
def test_sets_starting_together_end_as_unbatched_ones_and_fire_at_their_own_ends(seed, keyed):
    capacity, sets = _random_sets(seed)
    batched, fired = _run(capacity, sets, batch=True, keyed=keyed)
    unbatched, _ = _run(capacity, sets, batch=False, keyed=keyed)
    np.testing.assert_allclose(batched, unbatched, rtol=1e-12, atol=0)
    np.testing.assert_allclose(batched, _events_from_zero(capacity, sets), rtol=1e-9, atol=0)
    ends = np.cumsum([0] + [len(s[2]) for s in sets])
    np.testing.assert_allclose(
        fired, [batched[a:b].max() for a, b in zip(ends[:-1], ends[1:], strict=True)], rtol=1e-12
    )


def test_parts_of_a_memoized_run_alone_fire_at_their_own_ends():
    """Two sets on one idle link start together (one set of two parts, its run alone memoized): the small one's
    event fires at its own end, the large one's at the run's; the second time the run is found, not solved."""
    capacity = np.array([1e6])
    sets = [
        (0.0, [np.array([0])], np.array([1e5])),
        (0.0, [np.array([0])], np.array([3e5])),
        (1.0, [np.array([0])], np.array([1e5])),
        (1.0, [np.array([0])], np.array([3e5])),
    ]
    finish, fired = _run(capacity, sets, batch=True, keyed=True)
    np.testing.assert_allclose(finish, [0.2, 0.4, 1.2, 1.4], rtol=1e-12)
    np.testing.assert_allclose(fired, [0.2, 0.4, 1.2, 1.4], rtol=1e-12)


def test_overlapping_groups_link_sets_transitively():
    links = [np.array([0, 1]), np.array([5]), np.array([1, 2]), np.array([2, 3]), np.array([7])]
    assert overlapping(links) == [[0, 2, 3], [1], [4]]
