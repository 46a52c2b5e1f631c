"""Routing models: conservation, capacity and dropping, determinism, seed dependence, intended skew, config errors."""

from __future__ import annotations

import numpy as np
import pytest

from piper_sim.errors import ConfigError
from piper_sim.routing.capacity import apportion, cap_probabilities, expert_capacity
from piper_sim.routing.models import ROUTING, RoutingModel, routing_from_config
from piper_sim.routing.samplers import hot_count, popularity, zipf_weights

SYNTHETIC = [
    {"kind": "uniform"},
    {"kind": "round_robin"},
    {"kind": "zipf", "exponent": 1.2},
    {"kind": "dirichlet", "concentration": 0.5},
    {"kind": "hot", "fraction": 0.25, "share": 0.6},
    {"kind": "drift", "fraction": 0.25, "share": 0.6, "rate": 0.5},
    {"kind": "drift", "shape": "zipf", "exponent": 1.0, "rate": 1.5},
]
IDS = [f"{c['kind']}-{i}" for i, c in enumerate(SYNTHETIC)]


def model(raw: dict, experts: int = 16, top_k: int = 2, seed: int = 0) -> RoutingModel:
    return routing_from_config(dict(raw), experts, top_k, seed)


def test_registry_names():
    assert {"uniform", "round_robin", "zipf", "dirichlet", "hot", "drift", "trace"} <= set(ROUTING.names())


@pytest.mark.parametrize("raw", SYNTHETIC, ids=IDS)
@pytest.mark.parametrize("capacity_factor", [None, 1.0, 1.25])
def test_conservation_and_top_k_feasibility(raw, capacity_factor):
    m = model({**raw, "capacity_factor": capacity_factor})
    tokens, sources = 777, 4
    for key in [(0, 0, 0, 0), (3, 5, 2, 1), (9, 1, 7, 4)]:
        r = m.route(*key, sources, tokens)
        assert r.kept.shape == r.dropped.shape == (sources, 16)
        assert (r.kept >= 0).all() and (r.dropped >= 0).all()
        np.testing.assert_array_equal(r.routed.sum(axis=1), tokens * 2)  # every routed row kept or dropped
        assert r.routed.max() <= tokens  # an expert gets at most one copy of a token
        np.testing.assert_array_equal(m.counts(*key, sources, tokens), r.kept)
        cap = m.capacity(tokens)
        if cap is None:
            assert r.num_dropped == 0
        else:
            assert r.kept.max() <= cap
            np.testing.assert_array_equal(r.dropped, np.maximum(r.routed - cap, 0))


def test_capacity_formula():
    assert expert_capacity(None, 4096, 2, 8) is None
    assert expert_capacity(1.25, 4096, 2, 8) == 1280  # exactly 1.25 x 4096 x 2 / 8
    assert expert_capacity(1.0, 100, 3, 7) == 43  # ceil(42.86)
    assert expert_capacity(0.1, 10, 1, 64) == 1


def test_uniform_never_drops_at_capacity_one_and_drops_below():
    r = model({"kind": "uniform", "capacity_factor": 1.0}).route(0, 0, 0, 0, 2, 1001)
    assert r.num_dropped == 0
    r = model({"kind": "uniform", "capacity_factor": 0.5}).route(0, 0, 0, 0, 2, 1024)
    assert r.capacity == 64 and r.num_dropped == 2 * 1024 * 2 // 2
    assert r.drop_fraction == pytest.approx(0.5)


def test_skew_drops_more_than_uniform():
    cf = {"capacity_factor": 1.25}
    uniform = model({"kind": "uniform", **cf}).route(0, 0, 0, 0, 8, 2048).num_dropped
    skewed = model({"kind": "zipf", "exponent": 1.5, **cf}).route(0, 0, 0, 0, 8, 2048).num_dropped
    assert uniform == 0 < skewed


@pytest.mark.parametrize("raw", SYNTHETIC[2:], ids=IDS[2:])
def test_deterministic_and_seed_dependent(raw):
    a, b, c = model(raw, seed=3), model(raw, seed=3), model(raw, seed=4)
    key = (2, 3, 1, 0, 4, 500)
    np.testing.assert_array_equal(a.counts(*key), b.counts(*key))
    assert not np.array_equal(a.counts(*key), c.counts(*key))
    # each of step, layer, microbatch and group changes the sample
    for changed in [(3, 3, 1, 0), (2, 4, 1, 0), (2, 3, 2, 0), (2, 3, 1, 1)]:
        assert not np.array_equal(a.counts(*key), a.counts(*changed, 4, 500))


def test_uniform_is_exact_and_static():
    m = model({"kind": "uniform"})
    assert m.is_uniform and not model({"kind": "zipf"}).is_uniform
    np.testing.assert_array_equal(m.counts(0, 0, 0, 0, 3, 10), np.tile([2] * 4 + [1] * 12, (3, 1)))
    np.testing.assert_array_equal(m.counts(5, 7, 3, 2, 3, 10), m.counts(0, 0, 0, 0, 3, 10))


@pytest.mark.parametrize("tokens", [10, 37, 4096])
def test_round_robin_counts_are_the_gates_assignment_token_by_token(tokens):
    """Token t takes experts (t top_k + j) mod E (NeMo AutoModel's FakeBalancedGate): the counts are those of the
    assignment made token by token, static, and the kind says its experts are adjacent (uniform's are not)."""
    m = model({"kind": "round_robin"}, experts=16, top_k=3)
    assigned = np.bincount((np.arange(tokens)[:, None] * 3 + np.arange(3)).ravel() % 16, minlength=16)
    np.testing.assert_array_equal(m.counts(2, 5, 1, 0, 4, tokens), np.tile(assigned, (4, 1)))
    assert m.is_uniform and m.adjacent_experts and not model({"kind": "uniform"}).adjacent_experts


def shares(m: RoutingModel, tokens: int = 200_000, layer: int = 0) -> np.ndarray:
    counts = m.counts(0, layer, 0, 0, 1, tokens)[0]
    return counts / counts.sum()


def test_zipf_shares_follow_the_power_law():
    m = model({"kind": "zipf", "exponent": 1.0}, experts=16, top_k=1)
    measured = np.sort(shares(m))[::-1]
    np.testing.assert_allclose(measured, zipf_weights(16, 1.0), atol=0.004)
    assert measured[0] / measured[1] == pytest.approx(2.0, rel=0.05)
    flat = np.sort(shares(model({"kind": "zipf", "exponent": 0.0}, experts=16, top_k=1)))
    np.testing.assert_allclose(flat, 1 / 16, atol=0.004)


def test_zipf_hot_experts_depend_on_layer_and_seed():
    m = model({"kind": "zipf", "exponent": 2.0}, experts=64, top_k=1)
    ctx = [m.context(0, layer, 0, 0, 1, 1) for layer in range(6)]
    tops = {int(np.argmax(popularity("zipf", c))) for c in ctx}
    assert len(tops) > 1


def test_dirichlet_variance_matches_closed_form():
    experts, alpha = 32, 0.5
    m = model({"kind": "dirichlet", "concentration": alpha}, experts=experts, top_k=1)
    probs = np.stack([popularity("dirichlet", m.context(0, layer, 0, 0, 1, 1)) for layer in range(400)])
    expected_var = (1 / experts) * (1 - 1 / experts) / (experts * alpha + 1)
    assert probs.var() == pytest.approx(expected_var, rel=0.1)
    sampled = shares(m, layer=0)
    np.testing.assert_allclose(sampled, probs[0], atol=0.005)


def test_dirichlet_smaller_concentration_is_more_skewed():
    def mean_max(alpha: float) -> float:
        m = model({"kind": "dirichlet", "concentration": alpha}, experts=32, top_k=1)
        return float(np.mean([popularity("dirichlet", m.context(0, la, 0, 0, 1, 1)).max() for la in range(50)]))

    assert mean_max(0.1) > mean_max(1.0) > mean_max(100.0) > 1 / 32


def test_hot_experts_get_their_share():
    m = model({"kind": "hot", "fraction": 0.25, "share": 0.7}, experts=16, top_k=1)
    p = popularity("hot", m.context(0, 0, 0, 0, 1, 1))
    hot = np.argsort(-p)[: hot_count(16, 0.25)]
    assert len(hot) == 4
    s = shares(m)
    assert s[hot].sum() == pytest.approx(0.7, abs=0.005)
    assert s[hot].min() > s[np.setdiff1d(np.arange(16), hot)].max()


def test_share_is_capped_at_one_over_top_k():
    m = model({"kind": "hot", "fraction": 0.01, "share": 0.95}, experts=8, top_k=4)
    r = m.route(0, 0, 0, 0, 4, 1000)
    assert r.routed.max() <= 1000
    assert r.routed.max() >= 990  # the hot expert takes nearly every token
    np.testing.assert_allclose(cap_probabilities(np.array([0.9, 0.05, 0.05]), 0.5), [0.5, 0.25, 0.25])


def test_drift_moves_hot_experts_at_the_rate():
    raw = {"kind": "drift", "fraction": 0.25, "share": 0.8, "rate": 1.0}
    m = model(raw, experts=16, top_k=1)

    def hot_set(step: int) -> set[int]:
        return set(np.argsort(-popularity("drift", m.context(step, 0, 0, 0, 1, 1)))[:4].tolist())

    assert len(hot_set(0) & hot_set(1)) == 3  # one position per step
    assert not hot_set(0) & hot_set(4)  # fully replaced after n_hot / rate steps
    # fractional rate: step 1 at rate 0.5 is halfway between the rate-1 popularities of steps 0 and 1
    half = model({**raw, "rate": 0.5}, experts=16, top_k=1)
    mid = popularity("drift", half.context(1, 0, 0, 0, 1, 1))
    ends = [popularity("drift", m.context(s, 0, 0, 0, 1, 1)) for s in (0, 1)]
    np.testing.assert_allclose(mid, (ends[0] + ends[1]) / 2)
    still = model({**raw, "rate": 0.0}, experts=16, top_k=1)
    np.testing.assert_allclose(
        popularity("drift", still.context(0, 0, 0, 0, 1, 1)), popularity("drift", still.context(50, 0, 0, 0, 1, 1))
    )


def test_apportion_sums_and_proportions():
    out = apportion(10, np.array([1.0, 1.0, 1.0]))
    assert out.sum() == 10 and out.tolist() == [4, 3, 3]
    assert apportion(7, np.array([0.0, 2.0, 5.0])).tolist() == [0, 2, 5]


def test_config_errors_name_the_key_and_list_allowed():
    with pytest.raises(ConfigError, match=r"routing\.alpha.*capacity_factor, exponent"):
        model({"kind": "zipf", "alpha": 1.0})
    with pytest.raises(ConfigError, match=r"routing\.share.*\[0, 1\]"):
        model({"kind": "hot", "share": 1.5})
    with pytest.raises(ConfigError, match=r"routing\.capacity_factor"):
        model({"kind": "uniform", "capacity_factor": -1})
    with pytest.raises(ConfigError, match=r"routing\.kind.*dirichlet"):
        model({"kind": "pareto"})
    with pytest.raises(ConfigError, match=r"routing\.path.*required"):
        model({"kind": "trace"})
    with pytest.raises(ConfigError, match=r"routing\.shape"):
        model({"kind": "drift", "shape": "square"})
    with pytest.raises(ConfigError, match="routing"):
        routing_from_config({"exponent": 1.0}, 8, 2, 0)


def test_defaults_are_filled_in():
    m = model({"kind": "zipf"})
    assert m.params == {"capacity_factor": None, "exponent": 1.0}
    assert m.capacity_factor is None and m.capacity(100) is None


def test_kept_popularities_give_the_counts_drawn_afresh():
    """A kind keeps its capped popularity per (seed, layer), and per step for drift: the counts equal those from the
    popularity drawn again, for each step, parameter and layer."""
    from piper_sim.routing import samplers

    for raw, drawn in (
        ({"kind": "drift", "rate": 1.0}, samplers.drift_popularity),
        ({"kind": "zipf", "exponent": 1.0}, samplers.zipf_popularity),
        ({"kind": "zipf", "exponent": 2.0}, samplers.zipf_popularity),
    ):
        m = routing_from_config(raw, 16, 2, 7)
        for step, layer in ((0, 1), (1, 1), (2, 1), (2, 3), (0, 1)):
            ctx = m.context(step, layer, 0, 0, 4, 64)
            expected = samplers.sample_counts(ctx, drawn(ctx))
            assert np.array_equal(m.counts(step, layer, 0, 0, 4, 64), expected), (raw, step, layer)
