"""Model presets, the `model:` loader and the HF config.json importer, checked against published counts.

Conventions (also stated in each preset's `source`):
- Totals count attention, norms, routers, experts (routed and shared), dense FFNs, embedding and LM head
  (once if tied); biases, q/k norms and vision encoders are not modelled.
- DeepSeek-V3: 671B is the main model without the multi-token-prediction (MTP) module; the 685B on the
  Hugging Face card adds the MTP layer with its own stored copy of embedding and head (~14B).
- X-MoE's table (10.1B, 55.2B, 201.4B, 545.4B) is L x (4 d^2 + 2 E d d_ffn + d E) in units of 2^30,
  without embeddings or norms; our totals are decimal and include them (about 7.5% larger).
- Published figures with two or three significant digits carry their rounding: GLaM's 1.2T is our 1.162T.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from piper_sim.errors import ConfigError
from piper_sim.workload.hf_import import model_from_hf_config
from piper_sim.workload.model import ModelSpec
from piper_sim.workload.presets import PRESET_DIR, list_presets, load_model, model_from_mapping

HF_DIR = Path(__file__).resolve().parents[1] / "data" / "hf"

REQUIRED_PRESETS = [
    "x-moe-small",
    "x-moe-medium",
    "x-moe-large",
    "x-moe-super",
    "weak-110b",
    "weak-862b",
    "weak-1.7t",
    "mixtral-8x7b",
    "mixtral-8x22b",
    "deepseek-v2",
    "deepseek-v3",
    "llama4-scout",
    "llama4-maverick",
    "qwen3-moe",
    "qwen3-235b-a22b",
    "qwen3-30b-a3b",
    "kimi-k2",
    "arctic",
    "grok-1",
    "glam",
    "switch-base",
    "tiny-moe",
    "small-moe",
]

# preset -> relative tolerance of total_params() against published_params
TOTAL_TOLERANCE = {
    "mixtral-8x7b": 0.002,
    "mixtral-8x22b": 0.005,
    "deepseek-v2": 0.005,
    "deepseek-v3": 0.002,
    "qwen3-235b-a22b": 0.002,
    "qwen3-30b-a3b": 0.005,
    "qwen1.5-moe-a2.7b": 0.005,
    "grok-1": 0.01,
    "kimi-k2": 0.015,
    "llama4-maverick": 0.005,
    "llama4-scout": 0.015,  # published 109B includes the ~0.9B vision encoder
    "arctic": 0.005,
    "switch-base": 0.005,
    "weak-110b": 0.01,
    "weak-862b": 0.002,
    "weak-1.7t": 0.015,
    "glam": 0.04,  # 1.2T is 1.162T rounded to two significant digits
}

ACTIVE_TOLERANCE = {
    "mixtral-8x7b": 0.005,
    "mixtral-8x22b": 0.005,
    "deepseek-v2": 0.02,
    "deepseek-v3": 0.02,
    "qwen3-235b-a22b": 0.01,
    "qwen3-30b-a3b": 0.02,
    "qwen1.5-moe-a2.7b": 0.01,
    "kimi-k2": 0.03,
    "llama4-scout": 0.015,
    "llama4-maverick": 0.015,
    "arctic": 0.02,
    "glam": 0.001,
}


def test_required_presets_exist() -> None:
    assert set(REQUIRED_PRESETS) <= set(list_presets())


@pytest.mark.parametrize("name", list_presets())
def test_every_preset_loads(name: str) -> None:
    spec = load_model(name)
    assert isinstance(spec, ModelSpec)
    assert spec.name == name
    assert 0 < spec.active_params() <= spec.total_params()
    assert spec.moe_layer_indices, "every preset has at least one MoE layer"
    assert spec.source


@pytest.mark.parametrize("name", list_presets())
def test_preset_files_use_only_modelspec_keys(name: str) -> None:
    data = yaml.safe_load((PRESET_DIR / f"{name}.yaml").read_text())
    assert model_from_mapping(data, default_name=name) == load_model(name)
    for key in ("published_params", "published_active_params"):
        if key in data:
            assert isinstance(data[key], float), f"{name}.{key} must parse as a YAML number"


@pytest.mark.parametrize("name", sorted(TOTAL_TOLERANCE))
def test_total_params_match_published(name: str) -> None:
    spec = load_model(name)
    assert spec.published_params > 0
    assert spec.total_params() == pytest.approx(spec.published_params, rel=TOTAL_TOLERANCE[name])


@pytest.mark.parametrize("name", sorted(ACTIVE_TOLERANCE))
def test_active_params_match_published(name: str) -> None:
    spec = load_model(name)
    assert spec.published_active_params > 0
    assert spec.active_params() == pytest.approx(spec.published_active_params, rel=ACTIVE_TOLERANCE[name])


def test_mixtral_8x7b_exact_counts() -> None:
    """The checkpoint's exact sizes: 46,702,792,704 parameters, 12,879,925,248 active per token."""
    d, L, V, f, E, k, kv = 4096, 32, 32000, 14336, 8, 2, 8 * 128
    attn = d * d * 2 + 2 * d * kv + 2 * d
    total = L * (attn + E * 3 * d * f + d * E) + 2 * V * d + d
    active = L * (attn + k * 3 * d * f + d * E) + 2 * V * d + d
    spec = load_model("mixtral-8x7b")
    assert spec.total_params() == total == 46_702_792_704
    assert spec.active_params() == active == 12_879_925_248


def _mla_attention(d: int, h: int, q_lora: int, kv_lora: int, nope: int, rope: int, v: int) -> int:
    q = d * q_lora + q_lora + q_lora * h * (nope + rope)
    kv = d * (kv_lora + rope) + kv_lora + kv_lora * h * (nope + v)
    return q + kv + h * v * d + 2 * d


def test_deepseek_v3_closed_form_and_mtp_convention() -> None:
    d, V, h, E, f, dense_f = 7168, 129280, 128, 256, 2048, 18432
    attn = _mla_attention(d, h, 1536, 512, 128, 64, 128)
    moe_layer = attn + (E + 1) * 3 * d * f + d * E
    # 61 layers: 3 dense, 58 MoE (1 shared + 256 routed experts, router); untied embedding and head
    total = 3 * (attn + 3 * d * dense_f) + 58 * moe_layer + 2 * V * d + d
    spec = load_model("deepseek-v3")
    assert spec.total_params() == total
    # HF checkpoint 685B = main model + MTP module (one more MoE layer, a 2d -> d projection, two norms,
    # and its own stored copy of embedding and head).
    mtp = moe_layer + 2 * d * d + 2 * d + 2 * V * d
    assert total + mtp == pytest.approx(685e9, rel=0.01)


XMOE = {  # name: (L, d, d_ffn, E, X-MoE table value)
    "x-moe-small": (28, 2048, 1408, 64, 10.1),
    "x-moe-medium": (28, 5120, 1536, 128, 55.2),
    "x-moe-large": (28, 7168, 2048, 256, 201.4),
    "x-moe-super": (61, 7168, 2560, 256, 545.4),
}


@pytest.mark.parametrize("name", sorted(XMOE))
def test_x_moe_counts_and_convention(name: str) -> None:
    L, d, f, E, table = XMOE[name]
    spec = load_model(name)
    V = spec.vocab_size
    ours = L * (4 * d * d + 2 * d + 2 * E * d * f + d * E) + V * d + d  # tied embedding, decimal
    assert spec.total_params() == ours
    assert spec.published_params == table * 1e9
    xmoe_convention = L * (4 * d * d + 2 * E * d * f + d * E) / 2**30
    assert xmoe_convention == pytest.approx(table, rel=0.005)
    assert ours / 1e9 == pytest.approx(table * 1.074, rel=0.01)  # 2^30 / 1e9 = 1.074


@pytest.mark.parametrize(("name", "experts"), [("weak-110b", 16), ("weak-862b", 128), ("weak-1.7t", 256)])
def test_weak_scaling_closed_form(name: str, experts: int) -> None:
    d, f, L, V = 5120, 20480, 32, 50304
    total = L * (4 * d * d + 2 * d + experts * 2 * d * f + d * experts) + V * d + d
    assert load_model(name).total_params() == total


def test_glam_closed_form() -> None:
    d, L, V, f, E, inner = 8192, 64, 256000, 32768, 64, 128 * 128
    attn = 4 * d * inner + 2 * d
    total = L * attn + 32 * (E * 2 * d * f + d * E) + 32 * 3 * d * f + V * d + d
    active = L * attn + 32 * (2 * 2 * d * f + d * E) + 32 * 3 * d * f + V * d + d
    spec = load_model("glam")
    assert (spec.total_params(), spec.active_params()) == (total, active)
    assert spec.moe_layer_indices == tuple(range(1, 64, 2))


def test_layer_patterns() -> None:
    assert load_model("llama4-maverick").moe_layer_indices == tuple(range(1, 48, 2))
    assert load_model("deepseek-v3").moe_layer_indices == tuple(range(3, 61))
    assert load_model("switch-base").moe_layer_indices == tuple(range(1, 24, 2))
    assert len(load_model("llama4-scout").moe_layer_indices) == 48


# ---- HF config.json import ----------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(p.name for p in HF_DIR.iterdir() if p.is_dir()))
def test_hf_import_matches_preset(name: str) -> None:
    imported = load_model(HF_DIR / name / "config.json")
    preset = load_model(name)
    assert imported.name == name
    assert imported.total_params() == preset.total_params()
    assert imported.active_params() == preset.active_params()
    assert imported.moe_layer_indices == preset.moe_layer_indices
    assert imported.mla == preset.mla


def _qwen2_config(**changes: object) -> dict[str, object]:
    import json

    config = json.loads((HF_DIR / "qwen1.5-moe-a2.7b" / "config.json").read_text())
    config.update(changes)
    return config


def test_hf_qwen_sparse_step_and_mlp_only_layers() -> None:
    every_other = model_from_hf_config(_qwen2_config(decoder_sparse_step=2), "q")
    assert every_other.moe_layer_indices == tuple(range(1, 24, 2))
    assert every_other.dense_ffn_dim == 5632
    first_two_dense = model_from_hf_config(_qwen2_config(mlp_only_layers=[0, 1]), "q")
    assert first_two_dense.moe_layer_indices == tuple(range(2, 24))
    with pytest.raises(ConfigError, match="mlp_only_layers"):
        model_from_hf_config(_qwen2_config(mlp_only_layers=[5]), "q")


def test_hf_deepseek_moe_layer_freq_counts_absolute_index() -> None:
    config = {**_load_json("deepseek-v2"), "first_k_dense_replace": 1, "moe_layer_freq": 2}
    assert model_from_hf_config(config, "x").moe_layer_indices == tuple(range(2, 60, 2))


def _load_json(name: str) -> dict[str, object]:
    import json

    return json.loads((HF_DIR / name / "config.json").read_text())


def test_hf_unsupported_model_type_lists_supported() -> None:
    with pytest.raises(ConfigError, match="model.model_type") as err:
        model_from_hf_config({"model_type": "llama"}, "x")
    for supported in ("mixtral", "deepseek_v2", "deepseek_v3", "qwen2_moe", "qwen3_moe"):
        assert supported in str(err.value)


def test_hf_missing_key_names_it() -> None:
    config = _load_json("mixtral-8x7b")
    del config["num_local_experts"]
    with pytest.raises(ConfigError, match="num_local_experts"):
        model_from_hf_config(config, "x")


# ---- the model: loader ----------------------------------------------------------------------------
def test_preset_with_overrides() -> None:
    longer = load_model({"preset": "mixtral-8x7b", "seq_len": 4096})
    assert longer.seq_len == 4096 and longer.published_params == 46.7e9
    fewer = load_model({"preset": "mixtral-8x7b", "num_experts": 4})
    assert fewer.num_experts == 4 and fewer.published_params == 0.0 and fewer.name == "mixtral-8x7b"
    narrower = load_model({"preset": "deepseek-v3", "mla": {"kv_lora_rank": 256}})
    assert narrower.mla is not None and narrower.mla.kv_lora_rank == 256 and narrower.mla.q_lora_rank == 1536


def test_inline_hf_mapping() -> None:
    assert load_model(_load_json("mixtral-8x7b")).total_params() == load_model("mixtral-8x7b").total_params()


def test_yaml_file_and_numeric_strings(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("preset: tiny-moe\nnum_layers: 2\npublished_params: 1.5e6\n")  # PyYAML: "1.5e6" is a str
    spec = load_model(path)
    assert spec.num_layers == 2 and spec.published_params == 1.5e6
    inline = {k: v for k, v in yaml.safe_load((PRESET_DIR / "tiny-moe.yaml").read_text()).items()}
    assert load_model(inline) == load_model("tiny-moe")


@pytest.mark.parametrize(
    ("spec", "key"),
    [
        ({"preset": "tiny-moe", "foo": 1}, "model.foo"),
        ({"preset": "tiny-moe", "num_layers": 0}, "model.num_layers"),
        ({"preset": "tiny-moe", "num_layers": -2}, "model.num_layers"),
        ({"preset": "tiny-moe", "num_kv_heads": -2}, "model.num_kv_heads"),
        ({"preset": "tiny-moe", "num_layers": "4"}, "model.num_layers"),
        ({"preset": "tiny-moe", "top_k": 9}, "model.top_k"),
        ({"preset": "tiny-moe", "tie_embeddings": "yes"}, "model.tie_embeddings"),
        ({"preset": "deepseek-v3", "mla": {"rank": 3}}, "model.mla.rank"),
        ({"preset": "no-such-model"}, "model.preset"),
        ({"num_layers": 2, "d_model": 8}, "model.num_heads"),
        ("no-such-model", "model"),
        ("missing/file.yaml", "model"),
    ],
)
def test_bad_input_names_the_key(spec: object, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_model(spec)  # type: ignore[arg-type]
    assert err.value.key == key
    assert str(err.value).startswith(key + ":")


def test_unknown_key_lists_allowed_keys() -> None:
    with pytest.raises(ConfigError) as err:
        load_model({"preset": "tiny-moe", "layers": 4})
    assert "num_layers" in err.value.allowed and "expert_ffn_dim" in err.value.allowed


def test_unknown_preset_lists_presets() -> None:
    with pytest.raises(ConfigError) as err:
        load_model("mixtral-8x8b")
    assert "mixtral-8x7b" in err.value.allowed and "deepseek-v3" in err.value.allowed
