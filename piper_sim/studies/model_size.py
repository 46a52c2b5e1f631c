"""The all-to-all buffer of one MoE layer of a model, as the size of `study all-to-all --model NAME`.

Owns moe_buffer (the formula and its inputs) and size_label (a byte count as a --sizes label that parses back to
the same bytes). One micro-batch's dispatch on one GPU sends every token's hidden state to each of its top-k
experts: buffer = tokens per micro-batch (micro_batch_size x seq_len) x top_k x d_model x bytes per element
(the model's dtype). That is the GPU's whole send buffer, the study's per-GPU size. Must not import torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from piper_sim.bounds import COUNT_LIMITS
from piper_sim.errors import ConfigError
from piper_sim.workload.presets import FIELD_LIMITS, load_model

BINARY_UNITS = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


@dataclass(frozen=True, kw_only=True)
class MoeBuffer:
    model: str
    micro_batch_size: int
    seq_len: int
    tokens_per_microbatch: int
    top_k: int
    num_experts: int  # with top_k, how a token's copies spread (deepep's deduplication)
    d_model: int
    bytes_per_element: int
    buffer_bytes: int  # per GPU: tokens_per_microbatch x top_k x d_model x bytes_per_element

    def as_dict(self) -> dict:
        return asdict(self)

    def formula(self) -> str:
        return (
            f"{self.tokens_per_microbatch:,} tokens ({self.micro_batch_size} x {self.seq_len:,}) x top-k "
            f"{self.top_k} x hidden {self.d_model:,} x {self.bytes_per_element} B = {self.buffer_bytes:,} B"
        )


def _positive(flag: str, value: int | None, limit: int) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= limit):
        raise ConfigError(flag, value, f"a positive integer up to {limit:,}")


def moe_buffer(model: str, micro_batch_size: int | None = None, seq_len: int | None = None) -> MoeBuffer:
    """One MoE layer's dispatch buffer per GPU for a model preset (or model file); micro_batch_size defaults to 1
    (a config's default), seq_len to the model's own."""
    _positive("--micro-batch-size", micro_batch_size, COUNT_LIMITS["parallel.micro_batch_size"])
    _positive("--seq-len", seq_len, FIELD_LIMITS["seq_len"])
    spec = load_model(model, key="--model")
    mbs = micro_batch_size or 1
    seq = seq_len or spec.seq_len
    tokens = mbs * seq
    return MoeBuffer(
        model=spec.name,
        micro_batch_size=mbs,
        seq_len=seq,
        tokens_per_microbatch=tokens,
        top_k=spec.top_k,
        num_experts=spec.num_experts,
        d_model=spec.d_model,
        bytes_per_element=spec.dtype_bytes,
        buffer_bytes=tokens * spec.top_k * spec.d_model * spec.dtype_bytes,
    )


def size_label(size_bytes: int) -> str:
    """The largest binary unit that divides the bytes exactly (48MiB, 96KiB, 1000B): parse_size gives them back."""
    for unit, scale in BINARY_UNITS:
        if size_bytes % scale == 0:
            return f"{size_bytes // scale}{unit}"
    return f"{size_bytes}B"
