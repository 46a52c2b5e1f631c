"""Routing traces: round trip, replay, scaling, capture API, clear errors for bad files; imbalance metrics."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from piper_sim.errors import ConfigError, PiperError
from piper_sim.paths import project_root
from piper_sim.routing.metrics import ImbalanceTracker, imbalance_factor, imbalance_factors
from piper_sim.routing.models import routing_from_config
from piper_sim.routing.synth import synthesize_trace
from piper_sim.routing.trace import RoutingTrace, TraceError, TraceRecorder, read_trace, write_trace

SHIPPED = project_root() / "traces" / "routing" / "x-moe-small-drift-synthetic.npz"
LAYERS = [1, 2, 4]


@pytest.fixture
def trace() -> RoutingTrace:
    zipf = routing_from_config({"kind": "zipf", "exponent": 1.1}, 8, 2, 5)
    return synthesize_trace(
        zipf, model_name="toy", layers=LAYERS, steps=3, num_microbatches=2, num_sources=4, tokens_per_source=100
    )


def replay_model(path, **extra):
    return routing_from_config({"kind": "trace", "path": str(path), **extra}, 8, 2, 0)


def test_write_read_round_trip_is_identical(tmp_path, trace):
    path = write_trace(trace, tmp_path / "t.npz")
    back = read_trace(path)
    assert back.equals(trace)
    assert back.counts.dtype == np.int64 and back.source_counts.shape == (3, 3, 2, 4, 8)
    aggregate = dataclasses.replace(trace, source_counts=None, steps=None)
    assert read_trace(write_trace(aggregate, tmp_path / "a.npz")).equals(aggregate)


def test_replay_reproduces_the_traced_counts(tmp_path, trace):
    zipf = routing_from_config({"kind": "zipf", "exponent": 1.1}, 8, 2, 5)
    m = replay_model(write_trace(trace, tmp_path / "t.npz"))
    for step in range(3):
        for layer in LAYERS:
            for mb in range(2):
                expected = zipf.route(step, layer, mb, 0, 4, 100).routed
                np.testing.assert_array_equal(m.counts(step, layer, mb, 0, 4, 100), expected)
    # written and read again: identical replays
    again = replay_model(write_trace(read_trace(tmp_path / "t.npz"), tmp_path / "u.npz"))
    np.testing.assert_array_equal(again.counts(1, 2, 1, 0, 4, 100), m.counts(1, 2, 1, 0, 4, 100))
    # steps wrap; step_offset shifts
    np.testing.assert_array_equal(m.counts(4, 1, 0, 0, 4, 100), m.counts(1, 1, 0, 0, 4, 100))
    shifted = replay_model(tmp_path / "t.npz", step_offset=2)
    np.testing.assert_array_equal(shifted.counts(0, 1, 0, 0, 4, 100), m.counts(2, 1, 0, 0, 4, 100))


def test_replay_scales_to_the_simulated_tokens(tmp_path, trace):
    m = replay_model(write_trace(trace, tmp_path / "t.npz"))
    full = m.counts(0, 1, 0, 0, 4, 100)
    half = m.counts(0, 1, 0, 0, 4, 50)
    np.testing.assert_array_equal(half.sum(axis=1), 100)
    assert np.abs(half * 2 - full).max() <= 2
    # other source count: every source replays the layer's aggregate shares
    two = m.counts(0, 1, 0, 0, 2, 1000)
    np.testing.assert_array_equal(two[0], two[1])
    np.testing.assert_allclose(two[0] / 2000, trace.counts[0, 0] / trace.counts[0, 0].sum(), atol=1e-3)
    assert not m.is_uniform


def test_capacity_applies_to_replayed_counts(tmp_path, trace):
    m = replay_model(write_trace(trace, tmp_path / "t.npz"), capacity_factor=1.0)
    r = m.route(0, 1, 0, 0, 4, 100)
    assert r.capacity == 25 and r.kept.max() <= 25
    np.testing.assert_array_equal(r.routed.sum(axis=1), 200)


def test_missing_layer_and_wrap(tmp_path, trace):
    m = replay_model(write_trace(trace, tmp_path / "t.npz"))
    with pytest.raises(ConfigError, match=r"routing\.path.*layer 3.*\[1, 2, 4\].*wrap"):
        m.counts(0, 3, 0, 0, 4, 100)
    wrapped = replay_model(tmp_path / "t.npz", layers="wrap")
    np.testing.assert_array_equal(wrapped.counts(0, 3, 0, 0, 4, 100), wrapped.counts(0, 1, 0, 0, 4, 100))
    np.testing.assert_array_equal(wrapped.counts(0, 4, 0, 0, 4, 100), m.counts(0, 4, 0, 0, 4, 100))


def test_config_errors_for_trace_kind(tmp_path, trace):
    with pytest.raises(ConfigError, match=r"routing\.path.*existing"):
        replay_model(tmp_path / "absent.npz")
    path = write_trace(trace, tmp_path / "t.npz")
    with pytest.raises(ConfigError, match="experts mismatch"):
        routing_from_config({"kind": "trace", "path": str(path)}, 16, 2, 0)
    with pytest.raises(ConfigError, match=r"routing\.layers"):
        replay_model(path, layers="nearest")
    with pytest.raises(ConfigError, match=r"routing\.exponent.*path"):
        replay_model(path, exponent=1.0)


def test_recorder_builds_the_same_trace(trace):
    rec = TraceRecorder(
        model="toy", num_experts=8, top_k=2, layers=LAYERS, source=trace.source, num_microbatches=2, num_sources=4
    )
    flat = TraceRecorder(model="toy", num_experts=8, top_k=2, layers=LAYERS, source=trace.source)
    for s in range(3):
        for li, layer in enumerate(LAYERS):
            for mb in range(2):
                for src in range(4):
                    rec.record(s, layer, trace.source_counts[s, li, mb, src], microbatch=mb, source=src)
                    flat.record(s, layer, trace.source_counts[s, li, mb, src])
    assert rec.to_trace().equals(trace)
    assert flat.to_trace().equals(dataclasses.replace(trace, source_counts=None))
    with pytest.raises(TraceError, match="layer 3"):
        rec.record(0, 3, np.zeros(8))
    with pytest.raises(TraceError, match="expected 8 expert counts"):
        rec.record(0, 1, np.zeros(7))


def test_recorder_rejects_uneven_token_counts():
    rec = TraceRecorder(model="toy", num_experts=4, top_k=1, layers=[0, 1])
    rec.record(0, 0, [1, 1, 1, 1])
    rec.record(0, 1, [1, 1, 1, 2])
    with pytest.raises(TraceError, match="different token counts"):
        rec.to_trace()


def _save(path, **arrays):
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)
    return path


def _meta(**over) -> np.ndarray:
    meta = {
        "format": "piper-sim-routing-trace",
        "version": 1,
        "model": "toy",
        "num_experts": 4,
        "top_k": 1,
        "tokens_per_step": 4,
    }
    meta.update(over)
    return np.array(json.dumps(meta))


GOOD = np.ones((2, 2, 4), dtype=np.int64)
BAD_FILES = {
    "wrong_shape": ({"counts": np.ones((2, 4), dtype=np.int64)}, r"counts must have shape \[steps, layers, experts\]"),
    "negative": ({"counts": np.array([[[2, 2, 1, -1]] * 2] * 2)}, "negative counts"),
    "missing_layer": (
        {"counts": np.concatenate([GOOD[:, :1], np.zeros((2, 1, 4), int)], axis=1)},
        "missing layer: step 0 has no counts for layer 3",
    ),
    "experts_mismatch": ({"meta": _meta(num_experts=8)}, "experts mismatch: counts has 4 experts"),
    "layers_mismatch": ({"layers": np.array([0, 1, 2])}, "layers lists 3 layers but counts has 2"),
    "layers_order": ({"layers": np.array([3, 1])}, "strictly increasing"),
    "wrong_sum": ({"meta": _meta(tokens_per_step=5)}, "sum to 4; expected tokens_per_step x top_k = 5"),
    "over_tokens": (
        {"counts": np.array([[[4, 0, 0, 0]] * 2] * 2), "meta": _meta(top_k=2, tokens_per_step=2)},
        "more than the 2 tokens",
    ),
    "float_counts": ({"counts": GOOD * 0.5}, "must hold integers"),
    "missing_counts": ({"counts": None}, "missing array 'counts'"),
    "bad_format": ({"meta": _meta(format="something-else")}, "meta.format"),
    "bad_version": ({"meta": _meta(version=2)}, "version 2"),
    "meta_lacks": ({"meta": np.array(json.dumps({"format": "piper-sim-routing-trace", "version": 1}))}, "meta lacks"),
    "source_mismatch": ({"source_counts": np.ones((2, 2, 1, 1, 4), dtype=np.int64) * 2}, "differ from counts"),
    "source_shape": ({"source_counts": np.ones((2, 2, 4), dtype=np.int64)}, "source_counts must have shape"),
    "extra_array": ({"weights": np.ones(3)}, "unknown arrays"),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_bad_trace_files_give_clear_errors(tmp_path, name):
    change, message = BAD_FILES[name]
    arrays = {"meta": _meta(), "layers": np.array([1, 3]), "counts": GOOD}
    arrays.update(change)
    path = _save(tmp_path / f"{name}.npz", **{k: v for k, v in arrays.items() if v is not None})
    with pytest.raises(TraceError, match=message) as info:
        read_trace(path)
    assert str(path) in str(info.value) and isinstance(info.value, PiperError)


def test_unreadable_files(tmp_path):
    with pytest.raises(TraceError, match="no such file"):
        read_trace(tmp_path / "none.npz")
    junk = tmp_path / "junk.npz"
    junk.write_text("not a zip")
    with pytest.raises(TraceError, match="not a readable .npz"):
        read_trace(junk)


def test_write_refuses_an_invalid_trace(tmp_path, trace):
    bad = dataclasses.replace(trace, counts=-trace.counts)
    with pytest.raises(TraceError, match="negative"):
        write_trace(bad, tmp_path / "bad.npz")
    assert not (tmp_path / "bad.npz").exists()


def test_shipped_trace_validates_and_replays():
    t = read_trace(SHIPPED)
    assert (t.model, t.num_experts, t.top_k) == ("x-moe-small", 64, 6)
    assert t.counts.shape == (32, 28, 64) and "synthetic" in t.source
    m = routing_from_config({"kind": "trace", "path": "traces/routing/x-moe-small-drift-synthetic.npz"}, 64, 6, 0)
    counts = m.counts(3, 27, 0, 0, 8, 2048)
    np.testing.assert_array_equal(counts.sum(axis=1), 2048 * 6)
    assert imbalance_factor(counts.sum(axis=0)) > 1.5  # skewed
    drift = [np.argmax(t.counts[s, 0]) for s in range(0, 32, 8)]
    assert len(set(drift)) > 1  # the hot expert moves


def test_imbalance_metrics():
    assert imbalance_factor(np.array([1, 1, 1, 1])) == 1.0
    assert imbalance_factor(np.array([4, 0, 0, 0])) == 4.0
    assert imbalance_factor(np.zeros(3)) == 1.0
    np.testing.assert_allclose(imbalance_factors(np.array([[3, 1], [0, 0]])), [1.5, 1.0])
    tracker = ImbalanceTracker()
    tracker.add(0, 5, 0, 0, np.array([3, 1]))
    tracker.add(0, 5, 0, 1, np.array([1, 3]))  # step sums balance, microbatches do not
    tracker.add(0, 6, 0, 0, np.array([2, 2]))
    tracker.add(1, 5, 0, 0, np.array([4, 0]))
    out = tracker.summary()
    assert out["per_layer"][5]["lif"] == pytest.approx((1.0 + 2.0) / 2)
    assert out["per_layer"][5]["lif_max"] == 2.0
    assert out["per_layer"][5]["microbatch_lif"] == pytest.approx((1.5 + 1.5 + 2.0) / 3)
    assert out["per_step"] == [{"step": 0, "lif": 1.0, "lif_max": 1.0}, {"step": 1, "lif": 2.0, "lif_max": 2.0}]
    np.testing.assert_array_equal(tracker.step_loads(0, 5)[0], [4, 4])
