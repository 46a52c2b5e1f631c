"""Hugging Face config.json -> ModelSpec for the MoE families whose configs we know.

Owns the translation of HF config keys (per model_type) into ModelSpec fields; nothing else. Must not
import simpy, torch, transformers or anything under sim/. Field meanings follow the transformers
implementations: MixtralConfig, DeepseekV2/V3Config (also Kimi K2, which ships model_type kimi_k2 with the
DeepSeek-V3 architecture), Qwen2MoeConfig and Qwen3MoeConfig. Small terms the ModelSpec does not model
(Qwen2 qkv biases, q/k norms, the Qwen2-MoE shared-expert gate, DeepSeek-V3 MTP layers) are ignored.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from piper_sim.bounds import model_limit, read_int
from piper_sim.errors import ConfigError
from piper_sim.registry import Registry
from piper_sim.workload.model import MLASpec, ModelSpec

HFImporter = Callable[[Mapping[str, Any], str], ModelSpec]
HF_IMPORTERS: Registry[HFImporter] = Registry("model.model_type")
_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float8_e4m3fn": "fp8"}


def supported_model_types() -> list[str]:
    return HF_IMPORTERS.names()


def model_from_hf_config(config: Mapping[str, Any], name: str) -> ModelSpec:
    """Translate an HF config.json mapping; an unsupported model_type lists the supported ones."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in HF_IMPORTERS:
        raise ConfigError("model.model_type", model_type, f"one of {', '.join(supported_model_types())}")
    return HF_IMPORTERS.get(model_type)(config, name)


# ---- helpers --------------------------------------------------------------------------------------
# the ModelSpec field each HF key sizes: its bound (bounds.MODEL_LIMITS) applies to the HF value as to the YAML one
HF_FIELDS = {
    "num_hidden_layers": "num_layers",
    "hidden_size": "d_model",
    "num_attention_heads": "num_heads",
    "num_key_value_heads": "num_kv_heads",
    "max_position_embeddings": "seq_len",
    "original_max_position_embeddings": "seq_len",
    "num_local_experts": "num_experts",
    "n_routed_experts": "num_experts",
    "num_experts": "num_experts",
    "num_experts_per_tok": "top_k",
    "n_shared_experts": "num_shared_experts",
    "first_k_dense_replace": "num_dense_layers",
    "moe_layer_freq": "moe_layer_freq",
    "decoder_sparse_step": "moe_layer_freq",
}


def _int(config: Mapping[str, Any], key: str, default: int | None = None, allow_zero: bool = False) -> int:
    value = config.get(key, default)
    if value is None and default is not None:
        value = default
    return read_int(f"hf_config.{key}", value, low=0 if allow_zero else 1, limit=model_limit(HF_FIELDS.get(key, key)))


def _seq_len(config: Mapping[str, Any]) -> int:
    """The pre-training length when rope scaling records it (DeepSeek, Kimi), else max_position_embeddings."""
    scaling = config.get("rope_scaling")
    if isinstance(scaling, Mapping) and isinstance(scaling.get("original_max_position_embeddings"), int):
        return _int(scaling, "original_max_position_embeddings")
    return _int(config, "max_position_embeddings", default=4096)


def _common(config: Mapping[str, Any], name: str) -> dict[str, Any]:
    heads = _int(config, "num_attention_heads")
    dtype = config.get("torch_dtype") or config.get("dtype") or "bfloat16"
    return {
        "name": name,
        "num_layers": _int(config, "num_hidden_layers"),
        "d_model": _int(config, "hidden_size"),
        "num_heads": heads,
        "num_kv_heads": _int(config, "num_key_value_heads", default=heads),
        "head_dim": _int(config, "head_dim", default=0, allow_zero=True),
        "vocab_size": _int(config, "vocab_size"),
        "seq_len": _seq_len(config),
        "tie_embeddings": bool(config.get("tie_word_embeddings", False)),
        "dtype": _DTYPES.get(str(dtype), "bf16"),
        "source": f"HF config.json (model_type {config.get('model_type')})",
    }


def layer_pattern(moe_layers: list[int], num_layers: int, key: str) -> dict[str, int]:
    """(num_dense_layers, moe_layer_freq, moe_layer_offset) reproducing a set of MoE layer indices.

    ModelSpec can express MoE layers forming one arithmetic progression that runs to the last layer."""
    if not moe_layers:
        raise ConfigError(key, moe_layers, "a config with at least one MoE layer")
    freq = moe_layers[1] - moe_layers[0] if len(moe_layers) > 1 else num_layers
    first = moe_layers[0]
    dense, offset = (0, first) if first < freq else (first, 0)
    expected = [i for i in range(dense, num_layers) if (i - dense - offset) % freq == 0]
    if expected != moe_layers:
        raise ConfigError(key, moe_layers, "MoE layers in one arithmetic progression up to the last layer")
    return {"num_dense_layers": dense, "moe_layer_freq": freq, "moe_layer_offset": offset}


def _with_dense(spec: dict[str, Any], pattern: dict[str, int], dense_ffn_dim: int) -> dict[str, Any]:
    spec.update(pattern)
    if pattern["num_dense_layers"] or pattern["moe_layer_freq"] > 1:
        spec["dense_ffn_dim"] = dense_ffn_dim
    return spec


# ---- families -------------------------------------------------------------------------------------
@HF_IMPORTERS.register("mixtral")
def _mixtral(config: Mapping[str, Any], name: str) -> ModelSpec:
    spec = _common(config, name)
    spec.update(
        expert_ffn_dim=_int(config, "intermediate_size"),
        num_experts=_int(config, "num_local_experts"),
        top_k=_int(config, "num_experts_per_tok"),
        expert_matrices=3,
    )
    return ModelSpec(**spec)


def _deepseek(config: Mapping[str, Any], name: str) -> ModelSpec:
    """DeepSeek-V2/V3: layer i is MoE when i >= first_k_dense_replace and i % moe_layer_freq == 0."""
    spec = _common(config, name)
    spec["num_kv_heads"] = 0  # MLA: every head has its own up-projected K/V
    num_layers = spec["num_layers"]
    first_dense = _int(config, "first_k_dense_replace", default=0, allow_zero=True)
    freq = _int(config, "moe_layer_freq", default=1)
    moe = [i for i in range(num_layers) if i >= first_dense and i % freq == 0]
    spec = _with_dense(
        spec, layer_pattern(moe, num_layers, "hf_config.first_k_dense_replace"), _int(config, "intermediate_size")
    )
    q_lora = config.get("q_lora_rank")
    spec.update(
        expert_ffn_dim=_int(config, "moe_intermediate_size"),
        num_experts=_int(config, "n_routed_experts"),
        top_k=_int(config, "num_experts_per_tok"),
        num_shared_experts=_int(config, "n_shared_experts", default=0, allow_zero=True),
        expert_matrices=3,
        mla=MLASpec(
            q_lora_rank=0 if q_lora is None else _int(config, "q_lora_rank", allow_zero=True),
            kv_lora_rank=_int(config, "kv_lora_rank"),
            qk_nope_head_dim=_int(config, "qk_nope_head_dim"),
            qk_rope_head_dim=_int(config, "qk_rope_head_dim"),
            v_head_dim=_int(config, "v_head_dim"),
        ),
    )
    return ModelSpec(**spec)


for _model_type in ("deepseek_v2", "deepseek_v3", "kimi_k2"):
    HF_IMPORTERS.register(_model_type)(_deepseek)


def _qwen_moe(config: Mapping[str, Any], name: str) -> ModelSpec:
    """Qwen2-MoE/Qwen3-MoE: layer i is MoE when not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0;
    Qwen2-MoE adds one shared expert of width shared_expert_intermediate_size."""
    spec = _common(config, name)
    num_layers = spec["num_layers"]
    step = _int(config, "decoder_sparse_step", default=1)
    mlp_only = config.get("mlp_only_layers") or []
    if not isinstance(mlp_only, list) or not all(isinstance(i, int) for i in mlp_only):
        raise ConfigError("hf_config.mlp_only_layers", mlp_only, "a list of layer indices")
    moe = [i for i in range(num_layers) if i not in mlp_only and (i + 1) % step == 0]
    pattern = layer_pattern(moe, num_layers, "hf_config.mlp_only_layers")
    dense_width = _int(config, "intermediate_size") if len(moe) < num_layers else 0
    spec = _with_dense(spec, pattern, dense_width)
    shared = _int(config, "shared_expert_intermediate_size", default=0, allow_zero=True)
    spec.update(
        expert_ffn_dim=_int(config, "moe_intermediate_size"),
        num_experts=_int(config, "num_experts"),
        top_k=_int(config, "num_experts_per_tok"),
        num_shared_experts=1 if shared else 0,
        shared_expert_ffn_dim=shared,
        expert_matrices=3,
    )
    return ModelSpec(**spec)


for _model_type in ("qwen2_moe", "qwen3_moe"):
    HF_IMPORTERS.register(_model_type)(_qwen_moe)
