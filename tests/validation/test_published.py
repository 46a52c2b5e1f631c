"""`piper-sim validate --published`: the published training runs and how they are scored."""

from __future__ import annotations

import pytest

from piper_sim.config import load_config
from piper_sim.errors import ConfigError
from piper_sim.paths import data_dir
from piper_sim.validation.published import (
    FLOP_FORMULAS,
    find_published,
    measured_step_s,
    score_published,
    summarize_published,
)

ROOT = data_dir("validation") / "published"


def test_every_published_run_loads_with_its_published_gpu_count_and_a_measured_step():
    runs = find_published([], ROOT)
    assert len(runs) >= 16
    for run in runs:
        cfg = load_config(run.config)
        assert cfg.parallel.num_gpus == run.measured["num_gpus"], run.name
        assert cfg.parallel.sequences_per_step == run.measured["global_batch"], run.name
        assert cfg.model.seq_len == run.measured["seq_len"], run.name
        assert measured_step_s(run) > 0, run.name
        assert run.source


def test_the_published_aggregate_throughput_matches_the_per_gpu_one():
    """Narayanan et al. 2021 Table 1 gives both per-GPU and aggregate PFLOP/s: the data set keeps them consistent."""
    for run in find_published([], ROOT):
        m = run.measured
        if "aggregate_PFLOPS" in m:
            assert m["throughput_TFLOPS_per_gpu"] * m["num_gpus"] / 1e3 == pytest.approx(
                m["aggregate_PFLOPS"], rel=0.01
            ), run.name


def test_narayanans_equation_3_is_four_passes_of_the_layers_and_three_of_the_logits():
    """Equation 3 counts the transformer layers' forward 4 times (forward, recomputation, backward = 2 forwards)
    and the logit layer's 3 times (it is not recomputed): 4 x 24 B s l h^2 (1 + s/6h) + 3 x 2 B s h V."""
    run = find_published(["megatron2021-t1-1p7b"], ROOT)[0]
    model = load_config(run.config).model
    b, s, layers, h, v = run.measured["global_batch"], model.seq_len, model.num_layers, model.d_model, model.vocab_size
    layers_forward = 24 * b * s * layers * h * h * (1 + s / (6 * h))
    assert FLOP_FORMULAS["narayanan2021-eq3"](run) == pytest.approx(
        4 * layers_forward + 3 * 2 * b * s * h * v, rel=1e-12
    )


def test_order_is_counted_over_pairs_of_runs():
    def score(name, measured, predicted):
        return {
            "name": name,
            "error": predicted / measured - 1,
            "measured_tokens_per_s_per_gpu": 1 / measured,
            "predicted_tokens_per_s_per_gpu": 1 / predicted,
        }

    summary = summarize_published([score("a", 1.0, 1.1), score("b", 2.0, 1.5), score("c", 3.0, 1.4)])
    assert summary["pairs"] == 3 and summary["order_kept"] == pytest.approx(2 / 3)  # b and c swap
    assert summary["worst"] == "c" and summary["beyond_30pct"] == 1


def test_a_published_run_is_simulated_and_scored():
    run = find_published(["korthikanti2022-22b-selective-sp"], ROOT)[0]
    score = score_published(run)
    assert score["measured_step_s"] == 1.10 and score["predicted_step_s"] > 0
    assert score["error"] == pytest.approx(score["predicted_step_s"] / 1.10 - 1)


def test_an_unknown_run_is_refused_by_name():
    with pytest.raises(ConfigError) as err:
        find_published(["no-such-run"], ROOT)
    assert err.value.value == "no-such-run"


def test_megatron_deepspeeds_count_is_three_forwards_of_the_routed_experts_attention_and_logits():
    """Megatron-DeepSpeed's throughput_calculator (X-MoE's runs): per token of a layer 4 h^2 (Q, K, V, O without
    grouped queries) + 2 s h (scores and values) + 2 d_ffn h top_k multiply-accumulates, plus V h for the logits;
    forward and backward = 3 forwards, 2 FLOPs each, no recomputation."""
    run = find_published(["xmoe2025-small-frontier-256gcd"], ROOT)[0]
    model = load_config(run.config).model
    b, s, h, layers = run.measured["global_batch"], model.seq_len, model.d_model, model.num_layers
    assert (model.num_heads, model.kv_heads, model.expert_ffn_dim, model.top_k) == (16, 16, 1408, 6)
    per_token = layers * (4 * h * h + 2 * s * h + 2 * 1408 * h * 6) + model.vocab_size * h
    assert FLOP_FORMULAS["megatron-deepspeed"](run) == pytest.approx(6 * b * s * per_token, rel=1e-12)


def test_megatron_cores_2025_count_takes_the_causal_half_of_the_attention_scores():
    """From Megatron-LM commit 8873b55 (March 2025) num_floating_point_operations counts the attention scores and
    their product with V for the causal half (s / 2h): the two counts differ by exactly half the score term,
    12 B s l h^2 x (s / 2h) x q/h."""
    run = find_published(["mcore-mixtral-8x22b-h100-128gpu"], ROOT)[0]
    model = load_config(run.config).model
    b, s, h, layers = run.measured["global_batch"], model.seq_len, model.d_model, model.num_layers
    assert (s, h, layers, model.num_heads, model.kv_heads) == (4096, 6144, 56, 48, 8)
    per_layer = 1 + 8 / 48 + s / (2 * h) + 16384 / h * 2 * 1.5 + model.vocab_size / (2 * layers * h)
    assert FLOP_FORMULAS["megatron-core-2025"](run) == pytest.approx(12 * b * s * layers * h * h * per_layer, rel=1e-12)
    score_half = 12 * b * s * layers * h * h * s / (2 * h)
    assert FLOP_FORMULAS["megatron-core"](run) - FLOP_FORMULAS["megatron-core-2025"](run) == pytest.approx(
        score_half, rel=1e-12
    )


def test_palms_count_is_six_n_plus_the_whole_score_matrix():
    """PaLM's Appendix B count (the one the Llama 3 paper cites for its MFU): 6 N + 12 L H Q T per token, N without
    the untied input embedding (torchtitan's rule), the whole score matrix. Llama 3 405B at 131,072 tokens:
    N = 405.85B - 2.10B, and 12 L H Q T is 1.34 x 6 N, so the count is 1.40 x Megatron-core's causal one."""
    run = find_published(["llama3-405b-128k-h100-16384gpu"], ROOT)[0]
    layers, h, heads, head_dim, s, vocab = 126, 16384, 128, 128, 131072, 128256
    attention = h * heads * head_dim + 2 * h * 8 * head_dim + heads * head_dim * h + 2 * h
    n = layers * (attention + 3 * h * 53248) + vocab * h + h  # blocks, output head, final norm
    per_token = 6 * n + 12 * layers * heads * head_dim * s
    assert run.measured["flops_formula"] == "palm"
    assert FLOP_FORMULAS["palm"](run) == pytest.approx(per_token * 128 * s, rel=1e-12)
    assert FLOP_FORMULAS["palm"](run) / FLOP_FORMULAS["megatron-core-2025"](run) == pytest.approx(1.40, abs=0.01)
