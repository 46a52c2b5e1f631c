"""ModelSpec: the shape of an MoE transformer, and its parameter counts.

Owns the model description only. Must not import simpy, torch or anything under sim/.
Parameter formulas: standard decoder-only transformer accounting (attention projections,
gated or plain FFN experts, embeddings), with multi-head latent attention (MLA) when its
ranks are given, as in the DeepSeek-V2/V3 configs.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from piper_sim.errors import ConfigError

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}
FP8_RECIPES = ("delayed", "current")  # TE's DelayedScaling and Float8CurrentScaling (workload/precision.py)


@dataclass(frozen=True, kw_only=True)
class MLASpec:
    """Multi-head latent attention ranks (DeepSeek-V2/V3). q_lora_rank 0 means a plain q projection."""

    q_lora_rank: int = 0
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """An MoE decoder-only transformer.

    The first `num_dense_layers` layers use a dense FFN of width `dense_ffn_dim`; of the rest, every
    `moe_layer_freq`-th layer (counting from the first non-dense layer, offset `moe_layer_offset`) is an
    MoE layer and the others are dense. `expert_matrices` is 3 for gated (SwiGLU) experts and 2 for
    plain two-matrix experts.
    """

    name: str = "custom"
    num_layers: int
    d_model: int
    num_heads: int
    num_kv_heads: int = 0  # 0 means equal to num_heads
    head_dim: int = 0  # 0 means d_model // num_heads
    vocab_size: int
    seq_len: int
    expert_ffn_dim: int
    num_experts: int
    top_k: int
    num_shared_experts: int = 0
    shared_expert_ffn_dim: int = 0  # 0 means expert_ffn_dim
    expert_matrices: int = 3
    num_dense_layers: int = 0
    dense_ffn_dim: int = 0
    moe_layer_freq: int = 1
    moe_layer_offset: int = 0
    dense_matrices: int = 0  # 0 means expert_matrices
    tie_embeddings: bool = False
    dropout: float = 0.0  # attention-probability and hidden-state dropout (Megatron-LM's defaults are 0.1)
    # rotary position embedding applied to q and k in every layer (Megatron's --position-embedding-type rope); false
    # for learned absolute positions (GPT-2/3, Megatron's default), relative biases (T5, GLaM) or none
    rotary: bool = True
    mla: MLASpec | None = None
    dtype: str = "bf16"
    # the fp8 recipe its linear layers' GEMMs run in (workload/precision.py: "delayed" or "current"); "": none, every
    # GEMM in dtype. Set from the config's cost.precision and cost.fp8_recipe (config.py), not a model key
    fp8_recipe: str = ""
    # the optimizer keeps an fp32 master copy of a 16-bit model's weights, its Adam moments in fp32 (true); false: the
    # weights, gradients and moments all in dtype, as torch.optim.Adam on a model cast to bf16 keeps them. Set from
    # the config's optimizer.master_weights (config.py), not a model key
    master_weights: bool = True
    published_params: float = 0.0  # total parameters as published, for reference checks
    published_active_params: float = 0.0
    source: str = ""

    def __post_init__(self) -> None:
        positive = (
            "num_layers",
            "d_model",
            "num_heads",
            "vocab_size",
            "seq_len",
            "expert_ffn_dim",
            "num_experts",
            "top_k",
            "moe_layer_freq",
        )
        for key in positive:
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"model.{key}", value, "a positive integer")
        if self.top_k > self.num_experts:
            raise ConfigError("model.top_k", self.top_k, f"at most num_experts ({self.num_experts})")
        if self.expert_matrices not in (2, 3):
            raise ConfigError("model.expert_matrices", self.expert_matrices, "2 or 3")
        if self.dense_matrices not in (0, 2, 3):
            raise ConfigError("model.dense_matrices", self.dense_matrices, "2 or 3")
        if self.dtype not in DTYPE_BYTES:
            raise ConfigError("model.dtype", self.dtype, f"one of {sorted(DTYPE_BYTES)}")
        if self.fp8_recipe not in ("", *FP8_RECIPES):
            raise ConfigError("cost.fp8_recipe", self.fp8_recipe, " or ".join(FP8_RECIPES))
        if not 0 <= self.num_dense_layers <= self.num_layers:
            raise ConfigError(
                "model.num_dense_layers", self.num_dense_layers, f"between 0 and num_layers ({self.num_layers})"
            )
        if self.num_dense_layers and self.dense_ffn_dim <= 0:
            raise ConfigError("model.dense_ffn_dim", self.dense_ffn_dim, "a positive integer when num_dense_layers > 0")
        if not self.head_dim and self.num_heads > self.d_model:
            raise ConfigError(
                "model.num_heads",
                self.num_heads,
                f"at most d_model ({self.d_model}) unless model.head_dim is set (head_dim would be 0)",
            )
        moe_layers = self.num_layers - self.num_dense_layers - self.moe_layer_offset
        if self.num_experts > 1 and moe_layers > 0 and self.moe_layer_freq > moe_layers:
            raise ConfigError(
                "model.moe_layer_freq",
                self.moe_layer_freq,
                f"at most the layers after the dense ones and the offset ({moe_layers}); "
                "beyond it only the first of them would be MoE",
            )
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, int | float) or not 0 <= self.dropout < 1:
            raise ConfigError("model.dropout", self.dropout, "a probability from 0 up to (not including) 1")
        if self.num_kv_heads and self.num_heads % self.num_kv_heads:
            raise ConfigError("model.num_kv_heads", self.num_kv_heads, f"a divisor of num_heads ({self.num_heads})")

    # ---- derived shape -------------------------------------------------------------------------
    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def attn_head_dim(self) -> int:
        return self.head_dim or self.d_model // self.num_heads

    @property
    def shared_ffn_dim(self) -> int:
        return self.shared_expert_ffn_dim or self.expert_ffn_dim

    @property
    def dense_matrix_count(self) -> int:
        return self.dense_matrices or self.expert_matrices

    def is_moe_layer(self, layer_index: int) -> bool:
        if layer_index < self.num_dense_layers:
            return False
        return (layer_index - self.num_dense_layers - self.moe_layer_offset) % self.moe_layer_freq == 0

    @property
    def moe_layer_indices(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.num_layers) if self.is_moe_layer(i))

    # ---- parameter counts ------------------------------------------------------------------------
    def attention_params(self) -> int:
        """Attention projections of one layer plus its two norms."""
        d, h = self.d_model, self.num_heads
        norms = 2 * d
        if self.mla is not None:
            m = self.mla
            qk_dim = m.qk_nope_head_dim + m.qk_rope_head_dim
            if m.q_lora_rank:
                q = d * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * h * qk_dim
            else:
                q = d * h * qk_dim
            kv = (
                d * (m.kv_lora_rank + m.qk_rope_head_dim)
                + m.kv_lora_rank
                + m.kv_lora_rank * h * (m.qk_nope_head_dim + m.v_head_dim)
            )
            return q + kv + h * m.v_head_dim * d + norms
        hd = self.attn_head_dim
        return d * h * hd + 2 * d * self.kv_heads * hd + h * hd * d + norms

    def attention_replicated_params(self) -> int:
        """The part of attention_params a tensor-parallel group holds whole on each rank (as Megatron-core does):
        the two norms and, for MLA, the down projections and their norms."""
        norms = 2 * self.d_model
        m = self.mla
        if m is None:
            return norms
        q = self.d_model * m.q_lora_rank + m.q_lora_rank if m.q_lora_rank else 0
        return norms + q + self.d_model * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank

    def expert_params(self) -> int:
        """One routed expert."""
        return self.expert_matrices * self.d_model * self.expert_ffn_dim

    def moe_layer_ffn_params(self) -> int:
        shared = self.num_shared_experts * self.expert_matrices * self.d_model * self.shared_ffn_dim
        router = self.d_model * self.num_experts
        return self.num_experts * self.expert_params() + shared + router

    def moe_layer_active_ffn_params(self) -> int:
        shared = self.num_shared_experts * self.expert_matrices * self.d_model * self.shared_ffn_dim
        return self.top_k * self.expert_params() + shared + self.d_model * self.num_experts

    def dense_ffn_params(self) -> int:
        width = self.dense_ffn_dim or self.expert_ffn_dim
        return self.dense_matrix_count * self.d_model * width

    def embedding_params(self) -> int:
        """Input embedding plus LM head (once if tied) plus the final norm."""
        emb = self.vocab_size * self.d_model
        return emb * (1 if self.tie_embeddings else 2) + self.d_model

    def layer_params(self, layer_index: int) -> int:
        ffn = self.moe_layer_ffn_params() if self.is_moe_layer(layer_index) else self.dense_ffn_params()
        return self.attention_params() + ffn

    def total_params(self) -> int:
        return self.embedding_params() + sum(self.layer_params(i) for i in range(self.num_layers))

    def active_params(self) -> int:
        """Parameters touched by one token (routed experts counted top_k times)."""
        total = self.embedding_params()
        for i in range(self.num_layers):
            ffn = self.moe_layer_active_ffn_params() if self.is_moe_layer(i) else self.dense_ffn_params()
            total += self.attention_params() + ffn
        return total


# ModelSpec fields a config sets from its cost and optimizer sections, not model keys
SET_BY_CONFIG = frozenset({"fp8_recipe", "master_weights"})


def model_field_names() -> set[str]:
    """The keys a model mapping may give."""
    return {f.name for f in fields(ModelSpec)} - SET_BY_CONFIG


def mla_field_names() -> set[str]:
    return {f.name for f in fields(MLASpec)}
