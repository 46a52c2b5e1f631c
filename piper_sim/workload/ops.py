"""The op vocabulary of compute tasks: the model pieces a compute task runs, in order.

Pure data: names and parsing only. Both backends interpret the same ops:
- "embed": token ids -> hidden states (first virtual stage only).
- "attn:L": h = h + attention(norm1(h)) of layer L.
- "attn_core:L": the attention core of layer L alone (QK^T, softmax, times V) from kept q, k, v: what
  selective recomputation re-runs before the layer's backward (Korthikanti et al. 2022).
- "dense:L": h = h + ffn(norm2(h)) of a dense (non-MoE) layer L.
- "router:L": x = norm2(h); top-k gate over the routed experts; rows of x permuted and grouped by
  destination EP rank, ready for the dispatch all-to-all.
- "shared:L": shared experts of MoE layer L applied to x (local, no communication).
- "experts:L": the local routed experts of layer L on the rows received by dispatch (kind
  forward_expert / backward_expert), grouped by expert.
- "moe_out:L": rows returned by combine are un-permuted, weighted by the gate and summed, plus the
  shared-expert output; h = h + that.
- "head": final norm, LM head and the cross-entropy loss (last virtual stage only).
- "attn_norm:L", "moe_norm:L": the attention's input norm, the pre-MoE norm of layer L alone; "moe_act:L": the
  routed experts' activation function of layer L alone over the rank's routed rows: what selective recomputation's
  "layernorm" and "moe_act" modules re-run before the backward (workload/recompute.py).
A backward task runs the same ops in reverse order.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

OP_NAMES = (
    "embed",
    "attn",
    "attn_core",
    "dense",
    "router",
    "shared",
    "experts",
    "moe_out",
    "head",
    "attn_norm",
    "moe_norm",
    "moe_act",
)


class Op(NamedTuple):
    """One parsed op: its name (OP_NAMES) and its layer (-1 for embed and head)."""

    name: str
    layer: int

    @property
    def is_experts(self) -> bool:
        return self.name == "experts"


@functools.lru_cache(maxsize=1 << 14)
def parse_op(op: str) -> Op:
    """'attn:3' -> Op('attn', 3); 'embed' -> Op('embed', -1)."""
    name, _, layer = op.partition(":")
    if name not in OP_NAMES:
        raise ValueError(f"unknown op {op!r}; allowed: {OP_NAMES}")
    return Op(name, int(layer) if layer else -1)
