"""Expert placement, dispatch conservation, migration policies, migration bytes, the step-to-step driver."""

from __future__ import annotations

import numpy as np
import pytest

from piper_sim.errors import ConfigError
from piper_sim.migration import (
    ExpertPlacement,
    Migrator,
    dispatch,
    expert_state_bytes,
    greedy_swap,
    lpt_rebalance,
    migration_from_config,
    migration_step,
    move_matrix,
    placement_moves,
    rank_loads,
    rebalance,
)
from piper_sim.migration.expert_placement import contiguous_owners
from piper_sim.migration.policies import lpt_assign, relabel_to_keep
from piper_sim.routing.metrics import ImbalanceTracker, imbalance_factor
from piper_sim.routing.models import routing_from_config
from piper_sim.workload.presets import load_model


def test_contiguous_dispatch_matches_the_simulators_old_formula():
    ep, experts = 4, 16
    counts = routing_from_config({"kind": "zipf", "exponent": 1.3}, experts, 2, 1).counts(0, 0, 0, 0, ep, 300)
    d = dispatch(counts, contiguous_owners(experts, ep), ep)
    epr = experts // ep
    np.testing.assert_array_equal(d.rows, counts.reshape(ep, ep, epr).sum(axis=2))
    assert d.rows.dtype == d.local_rows.dtype == np.int64
    for r in range(ep):
        assert d.expert_rows[r] == tuple(counts[:, r * epr : (r + 1) * epr].sum(axis=0).tolist())
    np.testing.assert_array_equal(d.bytes_matrix(10, "combine"), (d.rows * 10).T)


@pytest.mark.parametrize("capacity_factor", [None, 1.0])
def test_every_token_is_dispatched_and_combined_once_or_dropped(capacity_factor):
    ep, experts, tokens, k = 4, 16, 512, 2
    m = routing_from_config(
        {"kind": "hot", "fraction": 0.125, "share": 0.6, "capacity_factor": capacity_factor}, experts, k, 3
    )
    owners = np.random.default_rng(0).permutation(contiguous_owners(experts, ep))
    r = m.route(1, 2, 0, 0, ep, tokens)
    d = dispatch(r.kept, owners, ep)
    sent = d.bytes_matrix(1, "dispatch")
    back = d.bytes_matrix(1, "combine")
    np.testing.assert_array_equal(sent.sum(axis=1) + r.dropped.sum(axis=1), tokens * k)  # per source
    np.testing.assert_array_equal(back.sum(axis=0), sent.sum(axis=1))  # each source gets its rows back once
    np.testing.assert_array_equal(back.sum(axis=1), d.tokens_per_rank)  # each owner returns what it computed
    assert d.tokens_per_rank.sum() == r.kept.sum() and sum(map(sum, d.expert_rows)) == r.kept.sum()
    for rank in range(ep):  # a rank computes exactly its own experts' rows
        assert d.expert_rows[rank] == tuple(r.kept[:, owners == rank].sum(axis=0).tolist())
    if capacity_factor is not None:
        assert r.num_dropped > 0


def test_placement_checks():
    p = ExpertPlacement.contiguous([3, 5], 8, 4)
    assert p.experts_on(5, 1).tolist() == [2, 3] and p.experts_per_rank == 2
    with pytest.raises(ValueError, match="every rank must hold 2 experts"):
        ExpertPlacement((3,), np.array([[0, 0, 0, 1, 1, 2, 3, 3]]), 4)
    with pytest.raises(ConfigError, match=r"parallel\.ep"):
        ExpertPlacement.contiguous([0], 8, 3)
    with pytest.raises(KeyError, match="layer 4"):
        p.owners(4)
    with pytest.raises(ValueError):
        p.owner[0, 0] = 3  # read-only
    moved = p.with_owners(5, np.array([1, 0, 0, 1, 2, 2, 3, 3]))
    assert moved.owners(3).tolist() == p.owners(3).tolist() and not moved.same_as(p)


def test_greedy_swaps_the_pair_that_narrows_the_gap_most():
    result = greedy_swap(np.array([8.0, 6.0, 1.0, 1.0]), np.array([0, 0, 1, 1]), 2, 16)
    assert result.swaps == 1 and result.owners.tolist() == [1, 0, 0, 1]
    assert (result.max_before, result.max_after) == (14.0, 9.0)
    limited = greedy_swap(np.array([9.0, 8, 7, 6, 1, 1, 1, 1]), np.array([0, 0, 0, 0, 1, 1, 1, 1]), 2, 1)
    assert limited.swaps == 1


def test_greedy_never_increases_the_max_load():
    rng = np.random.default_rng(42)
    for _ in range(300):
        ep = int(rng.choice([2, 4, 8]))
        experts = ep * int(rng.integers(1, 5))
        loads = rng.pareto(1.0, experts) * 100
        owners = rng.permutation(contiguous_owners(experts, ep))
        result = greedy_swap(loads, owners, ep, int(rng.integers(0, 20)))
        assert result.max_after <= result.max_before + 1e-9
        assert result.max_before == pytest.approx(rank_loads(loads, owners, ep).max())
        np.testing.assert_array_equal(np.bincount(result.owners, minlength=ep), experts // ep)


def test_greedy_reduces_a_skewed_group():
    loads = np.array([900.0, 800, 700, 600, 50, 40, 30, 20, 10, 10, 5, 5, 5, 5, 5, 5])
    owners = contiguous_owners(16, 4)
    result = greedy_swap(loads, owners, 4, 16)
    assert result.max_after < 0.5 * result.max_before
    assert imbalance_factor(rank_loads(loads, result.owners, 4)) < imbalance_factor(rank_loads(loads, owners, 4))


def test_lpt_is_at_least_as_good_as_greedy_and_sometimes_better():
    rng = np.random.default_rng(7)
    for _ in range(300):
        ep = int(rng.choice([2, 4]))
        experts = ep * int(rng.integers(1, 5))
        loads = rng.integers(1, 100, experts).astype(float)
        owners = rng.permutation(contiguous_owners(experts, ep))
        g, lpt = greedy_swap(loads, owners, ep, 16), lpt_rebalance(loads, owners, ep, 16)
        assert lpt.max_after <= g.max_after + 1e-9
        np.testing.assert_array_equal(np.bincount(lpt.owners, minlength=ep), experts // ep)
    loads = np.array([18.0, 81, 65, 91, 50, 61, 97, 73])
    owners = contiguous_owners(8, 4)
    assert greedy_swap(loads, owners, 4, 16).max_after == 154.0  # stuck: no max/min swap helps
    assert lpt_rebalance(loads, owners, 4, 16).max_after == 142.0


def test_lpt_assignment_and_relabelling():
    assert lpt_assign(np.array([5.0, 4, 3, 2]), 2).tolist() == [0, 1, 1, 0]
    new = np.array([1, 1, 0, 0])  # same grouping as old, labels swapped
    assert relabel_to_keep(new, np.array([0, 0, 1, 1]), 2).tolist() == [0, 0, 1, 1]
    balanced = lpt_rebalance(np.ones(8), contiguous_owners(8, 4), 4)
    assert balanced.owners.tolist() == contiguous_owners(8, 4).tolist()  # already optimal: nothing moves
    unchanged = rebalance("none", np.array([9.0, 1, 1, 1]), contiguous_owners(4, 2), 2)
    assert unchanged.owners.tolist() == [0, 0, 1, 1] and unchanged.max_after == 10.0


def test_migration_bytes_formula():
    small = load_model("x-moe-small")  # 2-matrix experts
    assert expert_state_bytes(small) == 16 * 2 * 2048 * 1408
    tiny = load_model("tiny-moe")  # 3-matrix experts: DESIGN's 48 d d_ffn
    assert expert_state_bytes(tiny) == 48 * tiny.d_model * tiny.expert_ffn_dim
    assert expert_state_bytes(tiny, 14) == 14 * 3 * tiny.d_model * tiny.expert_ffn_dim


def test_migration_bytes_equal_the_formula_for_moved_experts():
    tiny = load_model("tiny-moe")
    per_expert = expert_state_bytes(tiny)
    placement = ExpertPlacement.contiguous([0, 1], 8, 4)
    loads = {0: np.array([90.0, 80, 1, 1, 1, 1, 1, 1]), 1: np.ones(8)}
    spec = migration_from_config({"enabled": True, "policy": "greedy", "threshold": 1.1})
    event = migration_step(spec, placement, loads, step=0, bytes_per_expert=per_expert)
    moved = [(m.layer, m.expert) for m in event.moves]
    assert moved and all(layer == 0 for layer, _ in moved)
    changed = np.flatnonzero(placement.owners(0) != event.placement.owners(0))
    assert sorted(e for _, e in moved) == changed.tolist()
    assert event.bytes_per_group == len(changed) * 48 * tiny.d_model * tiny.expert_ffn_dim
    matrix = move_matrix(event.moves, 4)
    assert matrix.sum() == event.bytes_per_group and np.trace(matrix) == 0
    assert placement_moves(placement, placement, per_expert) == ()
    assert [d.triggered for d in event.decisions] == [True, False]
    assert event.decisions[0].lif_after < event.decisions[0].lif_before


def test_migrator_interval_threshold_and_baselines():
    placement = ExpertPlacement.contiguous([0], 8, 2)
    skew = np.array([50.0, 40, 30, 20, 1, 1, 1, 1])

    def run(raw: dict) -> Migrator:
        m = Migrator(migration_from_config(raw), placement, 100)
        for step in range(4):
            m.observe(0, skew / 2)
            m.observe(0, skew / 2)  # two microbatches
            m.end_of_step(step)
        return m

    every2 = run({"enabled": True, "interval": 2, "threshold": 1.2})
    assert [e.checked for e in every2.events] == [False, True, False, True]
    assert every2.events[1].migrated and not every2.events[3].migrated  # balanced after the first move
    assert every2.summary()["bytes_moved_per_group"] == 100 * len(every2.events[1].moves)
    assert not any(e.migrated for e in run({"enabled": True, "threshold": 10.0}).events)
    assert not any(e.migrated for e in run({"enabled": True, "policy": "none"}).events)
    assert not any(e.migrated for e in run({"enabled": False}).events)
    assert run({"enabled": False}).summary()["policy"] == "none"
    # the first check lowers the max rank load 140 -> 72 (a 49% gain)
    assert any(e.migrated for e in run({"enabled": True, "min_gain": 0.45}).events)
    assert not any(e.migrated for e in run({"enabled": True, "min_gain": 0.5}).events)


def test_migration_config_errors():
    with pytest.raises(ConfigError, match=r"migration\.trigger.*interval, max_swaps, min_gain, policy"):
        migration_from_config({"trigger": 1.2})
    with pytest.raises(ConfigError, match=r"migration\.policy.*greedy, lpt, none"):
        migration_from_config({"policy": "random"})
    with pytest.raises(ConfigError, match=r"migration\.threshold"):
        migration_from_config({"threshold": 0.5})
    with pytest.raises(ConfigError, match=r"migration\.min_gain"):
        migration_from_config({"min_gain": 1.0})
    with pytest.raises(ConfigError, match=r"migration\.interval"):
        migration_from_config({"interval": 0})
    assert migration_from_config(None) == migration_from_config({"enabled": False})


def simulate_steps(policy: str, steps: int = 12) -> tuple[float, int]:
    """Drifting skew over steps; per step mean imbalance of the placed loads and bytes moved."""
    experts, ep, k, tokens = 32, 8, 2, 1024
    routing = routing_from_config({"kind": "drift", "fraction": 0.125, "share": 0.5, "rate": 0.25}, experts, k, 0)
    layers = [0, 1]
    migrator = Migrator(
        migration_from_config({"enabled": True, "policy": policy, "threshold": 1.1}),
        ExpertPlacement.contiguous(layers, experts, ep),
        1000,
    )
    tracker = ImbalanceTracker()
    for step in range(steps):
        for layer in layers:
            for mb in range(2):
                routed = routing.route(step, layer, mb, 0, ep, tokens)
                d = dispatch(routed.kept, migrator.placement.owners(layer), ep)
                tracker.add(step, layer, 0, mb, d.tokens_per_rank)
                migrator.observe(layer, routed.routed.sum(axis=0))
        migrator.end_of_step(step)
    return tracker.summary()["overall"]["lif"], migrator.summary()["bytes_moved_per_group"]


def test_migration_lowers_imbalance_under_drift():
    none_lif, none_bytes = simulate_steps("none")
    greedy_lif, greedy_bytes = simulate_steps("greedy")
    lpt_lif, _ = simulate_steps("lpt")
    assert none_bytes == 0 < greedy_bytes
    assert greedy_lif < none_lif and lpt_lif < none_lif
