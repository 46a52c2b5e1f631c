"""Megatron-LM's network-size flags -> piper-sim's model section (ModelSpec fields).

Owns the translation of the model's flags as Megatron-LM reads them (megatron/training/arguments.py and
TransformerConfig): the defaults it takes (ffn-hidden-size 4h, or 8h/3 rounded down to 64 with --swiglu;
kv-channels h/heads; moe-router-topk 2; dropouts 0.1; tied embeddings; learned absolute positions, no rotary
embedding; fp32 without --bf16 or --fp16), the MoE layer pattern of --moe-layer-freq, and the vocabulary padded as
Megatron pads it (to a multiple of --make-vocab-size-divisible-by x TP). No I/O.
"""

from __future__ import annotations

import ast
import math

from piper_sim.bounds import model_limit
from piper_sim.errors import ConfigError
from piper_sim.importers.imported import Translation
from piper_sim.importers.source import Source
from piper_sim.workload.hf_import import layer_pattern

# tokenizers whose vocabulary Megatron-LM knows without reading a file: GPT-2's BPE (50,257 tokens) and Llama 2's
# SentencePiece model (32,000)
TOKENIZER_SIZES = {"GPT2BPETokenizer": 50257, "Llama2Tokenizer": 32000}
# --position-embedding-type's choices (learned_absolute the default), and those that rotate q and k (rotary: true)
POSITION_TYPES = ("learned_absolute", "rope", "yarn", "mrope", "relative", "none")
ROTARY_TYPES = ("rope", "yarn", "mrope")
PATTERN_CHARS = 10_000


def model_section(flags: Source, t: Translation, tp: int, name: str) -> dict:
    """The model section of a Megatron-LM run: dense (no --num-experts) or MoE, MHA/GQA or MLA."""
    layers = flags.integer("num-layers", limit=model_limit("num_layers"))
    hidden = flags.integer("hidden-size", limit=model_limit("d_model"))
    heads = flags.integer("num-attention-heads", limit=model_limit("num_heads"))
    swiglu = flags.switch("swiglu")
    ffn = flags.integer("ffn-hidden-size", int(4 * hidden * 2 / 3 / 64) * 64 if swiglu else 4 * hidden)
    section = {
        "name": name,
        "num_layers": layers,
        "d_model": hidden,
        "num_heads": heads,
        **_attention(flags, hidden, heads),
        "vocab_size": vocab_size(flags, tp),
        "seq_len": flags.integer("seq-length", limit=model_limit("seq_len")),
        "tie_embeddings": not flags.switch("untie-embeddings-and-output-weights"),
        "rotary": _rotary(flags),
        "dropout": _dropout(flags, t),
        "dtype": _dtype(flags),
    }
    section.update(_ffn(flags, layers, ffn, 3 if swiglu else 2))
    section["source"] = "Megatron-LM arguments (piper-sim import megatron)"
    return section


def _attention(flags: Source, hidden: int, heads: int) -> dict:
    """Heads and head width (--kv-channels, GQA's --num-query-groups), or MLA's ranks (--multi-latent-attention)."""
    if flags.switch("multi-latent-attention"):
        q_lora = flags.get("q-lora-rank")
        return {
            "num_kv_heads": 0,
            "mla": {
                "q_lora_rank": 0 if q_lora is None else flags.integer("q-lora-rank"),
                "kv_lora_rank": flags.integer("kv-lora-rank", 32),
                "qk_nope_head_dim": flags.integer("qk-head-dim", 128),
                "qk_rope_head_dim": flags.integer("qk-pos-emb-head-dim", 64),
                "v_head_dim": flags.integer("v-head-dim", 128),
            },
        }
    kv_channels = flags.integer("kv-channels", 0, low=0)
    if not kv_channels and hidden % heads:
        raise ConfigError(
            flags.key("num-attention-heads"), heads, f"a divisor of --hidden-size ({hidden}), or give --kv-channels"
        )
    out = {
        "num_kv_heads": flags.integer("num-query-groups", heads, limit=model_limit("num_kv_heads"))
        if flags.switch("group-query-attention")
        else heads
    }
    if kv_channels and kv_channels != hidden // heads:
        out["head_dim"] = kv_channels
    return out


def _ffn(flags: Source, layers: int, ffn: int, matrices: int) -> dict:
    """The FFNs: a dense model (every layer dense, written as one expert), or experts on the layers
    --moe-layer-freq names, the others dense of --ffn-hidden-size."""
    experts = flags.integer("num-experts", None, limit=model_limit("num_experts"))
    if experts is None:
        return {
            "expert_ffn_dim": ffn,
            "num_experts": 1,
            "top_k": 1,
            "expert_matrices": matrices,
            "num_dense_layers": layers,
            "dense_ffn_dim": ffn,
            "dense_matrices": matrices,
        }
    out = {
        "expert_ffn_dim": flags.integer("moe-ffn-hidden-size", ffn),
        "num_experts": experts,
        "top_k": flags.integer("moe-router-topk", 2, limit=model_limit("top_k")),
        "expert_matrices": matrices,
    }
    shared = flags.integer("moe-shared-expert-intermediate-size", None)
    if shared:
        out.update(num_shared_experts=1, shared_expert_ffn_dim=shared)
    moe_layers = moe_layer_indices(flags, layers)
    pattern = layer_pattern(moe_layers, layers, flags.key("moe-layer-freq"))
    out.update(pattern)
    if pattern["num_dense_layers"] or pattern["moe_layer_freq"] > 1:
        out["dense_ffn_dim"] = ffn
    return out


def moe_layer_indices(flags: Source, layers: int) -> list[int]:
    """The MoE layers of --moe-layer-freq: an integer N (every N-th layer from the first, as Megatron-core) or a
    pattern of 0s and 1s as Megatron evaluates it (`([0]*3+[1]*58)`), one per layer."""
    value = flags.get("moe-layer-freq", 1)
    key = flags.key("moe-layer-freq")
    if isinstance(value, str) and "[" not in value:
        value = flags.integer("moe-layer-freq", limit=layers)
    if isinstance(value, int):
        return [i for i in range(layers) if i % value == 0]
    pattern = layer_flags(key, value, layers)
    return [i for i, moe in enumerate(pattern) if moe]


def layer_flags(key: str, text: object, layers: int) -> list[int]:
    """A Megatron layer pattern (lists of 0/1, `+` and `* N`) evaluated without eval, bounded by the layer count."""
    allowed = f"a list of {layers} zeros and ones (1: an MoE layer), e.g. ([0]*3+[1]*{max(layers - 3, 1)})"
    if not isinstance(text, str) or len(text) > PATTERN_CHARS:
        raise ConfigError(key, text, allowed)
    try:
        pattern = _evaluate(ast.parse(text.strip(), mode="eval").body, layers)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise ConfigError(key, text, allowed) from None
    if len(pattern) != layers or any(v not in (0, 1) for v in pattern):
        raise ConfigError(key, text, allowed)
    return pattern


def _evaluate(node: ast.AST, limit: int) -> list[int]:
    if isinstance(node, ast.List):
        if not all(isinstance(e, ast.Constant) and type(e.value) is int for e in node.elts):
            raise ValueError("a list of integers")
        out = [e.value for e in node.elts]
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        out = _evaluate(node.left, limit) + _evaluate(node.right, limit)
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        items, count = (node.left, node.right) if isinstance(node.right, ast.Constant) else (node.right, node.left)
        if not (isinstance(count, ast.Constant) and type(count.value) is int and 0 <= count.value <= limit):
            raise ValueError("a list times a count")
        part = _evaluate(items, limit)
        if len(part) * count.value > limit:
            raise ValueError("longer than the model")
        out = part * count.value
    else:
        raise ValueError("lists, + and *")
    if len(out) > limit:
        raise ValueError("longer than the model")
    return out


def vocab_size(flags: Source, tp: int) -> int:
    """The vocabulary as Megatron-LM pads it: the tokenizer's size (GPT-2's and Llama 2's known, else --vocab-size)
    rounded up to a multiple of --make-vocab-size-divisible-by (default 128) x TP."""
    tokenizer = flags.peek("tokenizer-type")
    if tokenizer in TOKENIZER_SIZES:
        size = TOKENIZER_SIZES[flags.text("tokenizer-type")]
    elif flags.given("vocab-size"):
        size = flags.integer("vocab-size", limit=model_limit("vocab_size"))
    else:
        raise ConfigError(
            "--vocab-size",
            None,
            "the tokenizer's vocabulary size: Megatron-LM reads it from the "
            "tokenizer (--tokenizer-model), which piper-sim does not load; add --vocab-size N (before "
            "Megatron's padding)",
        )
    multiple = flags.integer("make-vocab-size-divisible-by", 128, limit=model_limit("vocab_size")) * tp
    return math.ceil(size / multiple) * multiple


def _rotary(flags: Source) -> bool:
    """Whether q and k are rotated: --position-embedding-type rope, yarn or mrope, or the older
    --use-rotary-position-embeddings (which Megatron turns into rope)."""
    kind = flags.text("position-embedding-type", "learned_absolute", POSITION_TYPES)
    return flags.switch("use-rotary-position-embeddings") or kind in ROTARY_TYPES


def _dropout(flags: Source, t: Translation) -> float:
    """ModelSpec's one dropout: --attention-dropout and --hidden-dropout (Megatron's defaults 0.1 each)."""
    attention, hidden = flags.number("attention-dropout", 0.1), flags.number("hidden-dropout", 0.1)
    if attention != hidden:
        t.refuse(
            flags.key("hidden-dropout"),
            hidden,
            f"equal to --attention-dropout ({attention}): piper-sim has one dropout probability (model.dropout)",
            f"takes the larger, {max(attention, hidden)}",
        )
    return max(attention, hidden)


def _dtype(flags: Source) -> str:
    if flags.switch("bf16"):
        return "bf16"
    return "fp16" if flags.switch("fp16") else "fp32"
