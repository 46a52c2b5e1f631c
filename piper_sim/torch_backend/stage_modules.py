"""MoE transformer stages whose pieces map 1:1 to the op vocabulary of piper_sim.workload.ops.

Owns StageModule (one virtual pipeline stage on one EP rank), the per-op code that runs on a mutable
per-microbatch state dict, and ReferenceModel (the whole model in one process, from the same code).
Communication is not done here: between "router:L" and "experts:L" the caller moves
send_rows/send_splits/send_expert_ids to recv_rows/recv_splits/recv_expert_ids (dispatch), and between
"experts:L" and "moe_out:L" it moves return_rows (split by recv_splits) to combined_rows (combine).

State keys read (r) and written (w) by each op:
- "embed": r tokens (b, s) int64; w h (b, s, d).
- "attn:L", "dense:L": r h; w h. With selective recomputation (the layer's attn.selective) "attn:L" also
  writes attn_cores[L], the core's CoreRecompute, which the "attn_core:L" recompute task runs.
- "router:L": r h; w x (tokens, d) = norm2(h) flattened, send_rows (tokens*k, d) grouped by destination
  EP rank then by expert, send_splits list[int] (rows per destination EP rank), send_expert_ids (int64,
  global expert id per row), gate_weights (tokens, k), gate_order (int64: pair index n*k+j of each
  send row), expert_counts[L] (int64 (num_experts,): this microbatch's tokens per expert); drops any
  stale shared_out.
- "shared:L": r x; w shared_out (tokens, d), only when the layer has shared experts.
- "experts:L": r recv_rows, recv_expert_ids; w return_rows (same order as recv_rows).
- "moe_out:L": r h, combined_rows (same order as send_rows), gate_weights, gate_order, shared_out
  (optional, consumed); w h.
- "head": r h, targets (b, s) int64; w loss (scalar, mean cross-entropy over the microbatch's tokens).
Only piper_sim.torch_backend may import torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from piper_sim.errors import ConfigError
from piper_sim.workload.model import ModelSpec
from piper_sim.workload.ops import parse_op

from .layers import FFN, CoreRecompute, Layer, RMSNorm, init_parameters, linear
from .tensor_parallel import NO_SHARD, TensorShard, VocabParallelCrossEntropy, vocab_parallel_embedding

State = dict[str, Any]

# Tensor keys that carry gradients into (inputs) and out of (outputs) each op, for per-op backward.
DIFFERENTIABLE_IO: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "embed": ((), ("h",)),
    "attn": (("h",), ("h",)),
    "dense": (("h",), ("h",)),
    "router": (("h",), ("x", "send_rows", "gate_weights")),
    "shared": (("x",), ("shared_out",)),
    "experts": (("recv_rows",), ("return_rows",)),
    "moe_out": (("h", "combined_rows", "gate_weights", "shared_out"), ("h",)),
    "head": (("h",), ("loss",)),
}


def layer_ops(spec: ModelSpec, layer_index: int) -> list[str]:
    """Forward ops of one layer, in order."""
    if not spec.is_moe_layer(layer_index):
        return [f"attn:{layer_index}", f"dense:{layer_index}"]
    names = ["attn", "router", "shared", "experts", "moe_out"]
    if not spec.num_shared_experts:
        names.remove("shared")
    return [f"{name}:{layer_index}" for name in names]


def stage_ops(spec: ModelSpec, layer_indices: Iterable[int], *, first: bool, last: bool) -> list[str]:
    """Forward ops of a virtual stage, in order."""
    ops = ["embed"] if first else []
    for layer_index in layer_indices:
        ops += layer_ops(spec, layer_index)
    return ops + (["head"] if last else [])


def expert_range(spec: ModelSpec, ep_rank: int, ep_size: int) -> range:
    """Global ids of the routed experts held by one EP rank: [ep_rank*E/ep, (ep_rank+1)*E/ep)."""
    if ep_size <= 0 or spec.num_experts % ep_size:
        raise ConfigError("parallel.ep", ep_size, f"a divisor of num_experts ({spec.num_experts})")
    if not 0 <= ep_rank < ep_size:
        raise ConfigError("ep_rank", ep_rank, f"in [0, {ep_size})")
    per_rank = spec.num_experts // ep_size
    return range(ep_rank * per_rank, (ep_rank + 1) * per_rank)


class StageModule(nn.Module):
    """One virtual pipeline stage on one EP rank: embedding if first, the given layers with only the
    local routed experts, final norm and LM head if last. Parameter names are global names.

    With a tensor-parallel shard (tp > 1; tensor_parallel.py) it holds the rank's slices: its heads, its part
    of the dense FFNs and experts, its vocabulary rows of the embedding (partial lookups) and of the head
    (vocabulary-parallel cross-entropy); "attn", "dense" and (experts split, etp == tp) "moe_out" write
    h / tp + their partial output, which the schedule's TP collective after them sums."""

    def __init__(
        self,
        spec: ModelSpec,
        layer_indices: Sequence[int],
        *,
        first: bool,
        last: bool,
        ep_rank: int = 0,
        ep_size: int = 1,
        seed: int = 0,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
        shard: TensorShard = NO_SHARD,
    ) -> None:
        super().__init__()
        self.spec, self.first, self.last, self.shard = spec, first, last, shard
        self.layer_indices = tuple(layer_indices)
        self.ep_rank, self.ep_size = ep_rank, ep_size
        self.experts_per_rank = spec.num_experts // ep_size
        self.expert_range = expert_range(spec, ep_rank, ep_size)
        for index in self.layer_indices:
            if not 0 <= index < spec.num_layers:
                raise ConfigError("layer_indices", index, f"in [0, {spec.num_layers})")
        kw = {"device": device, "dtype": dtype}
        if (first or last) and spec.vocab_size % shard.tp:
            raise ConfigError(
                "parallel.tp",
                shard.tp,
                f"a divisor of model.vocab_size ({spec.vocab_size}) to run the vocabulary-parallel embedding and head",
            )
        self.vocab_shard = spec.vocab_size // shard.tp
        if first:
            self.embed = nn.Embedding(self.vocab_shard, spec.d_model, **kw)
        self.layers = nn.ModuleDict(
            {str(i): Layer(spec, i, self.expert_range, shard=shard, **kw) for i in self.layer_indices}
        )
        # expert -> EP rank, per MoE layer; contiguous at start, changed by expert migration
        self.owners = {
            i: torch.arange(spec.num_experts) // self.experts_per_rank
            for i in self.layer_indices
            if spec.is_moe_layer(i)
        }
        if last:
            self.norm = RMSNorm(spec.d_model, **kw)
            self.head = nn.Linear(spec.d_model, self.vocab_shard, bias=False, **kw)
        init_parameters(self, seed, spec.num_layers, shard)

    def forward_ops(self) -> list[str]:
        return stage_ops(self.spec, self.layer_indices, first=self.first, last=self.last)

    def run_op(self, op: str, state: State) -> None:
        """Execute one forward op on the microbatch state (see the module docstring for the keys)."""
        name, layer_index = parse_op(op)
        if name == "embed":
            self._check(self.first, op)
            if self.shard.tp > 1:
                start = self.shard.vocab_start(self.vocab_shard)
                state["h"] = vocab_parallel_embedding(state["tokens"], self.embed.weight, start)
            else:
                state["h"] = self.embed(state["tokens"])
            return
        if name == "head":
            self._check(self.last, op)
            state["loss"] = self._head(state["h"], state["targets"])
            return
        self._check(str(layer_index) in self.layers, op)
        layer = self.layers[str(layer_index)]
        needs_moe = name in ("router", "shared", "experts", "moe_out")
        self._check(name == "attn" or needs_moe == layer.is_moe, op)
        _LAYER_OPS[name](self, layer, layer_index, state)

    def _check(self, ok: bool, op: str) -> None:
        if not ok:
            raise ValueError(
                f"op {op!r} does not run on this stage (layers {self.layer_indices}, "
                f"first={self.first}, last={self.last})"
            )

    def _head(self, h: Tensor, targets: Tensor) -> Tensor:
        logits = linear(self.norm(h), self.head.weight)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # at least fp32
        if self.shard.tp > 1:
            return VocabParallelCrossEntropy.apply(
                logits.flatten(0, -2), targets.flatten(), self.shard.vocab_start(self.vocab_shard), self.shard.group
            )
        return F.cross_entropy(logits.flatten(0, -2), targets.flatten())

    def destination_rank(self, expert_ids: Tensor, layer_index: int) -> Tensor:
        return self.owners[layer_index].to(expert_ids.device)[expert_ids]


def _attn(stage: StageModule, layer: Layer, layer_index: int, state: State) -> None:
    h = state["h"]
    core = None
    if layer.attn.selective:  # the core's recompute task finds it under "attn_cores"
        core = state.setdefault("attn_cores", {})[layer_index] = CoreRecompute()
    state["h"] = stage.shard.residual(h) + layer.attn(layer.norm1(h), core)


def _dense(stage: StageModule, layer: Layer, layer_index: int, state: State) -> None:
    h = state["h"]
    state["h"] = stage.shard.residual(h) + layer.dense(layer.norm2(h))


def _router(stage: StageModule, layer: Layer, layer_index: int, state: State) -> None:
    x = layer.norm2(state["h"]).flatten(0, -2)
    weights, ids = layer.router(x)
    flat_ids = ids.flatten()
    num_experts = stage.spec.num_experts
    owner = stage.destination_rank(flat_ids, layer_index)
    order = torch.argsort(owner * num_experts + flat_ids, stable=True)  # by destination EP rank, then expert
    send_ids = flat_ids[order]
    state.pop("shared_out", None)
    state.update(
        x=x,
        send_rows=x[torch.div(order, stage.spec.top_k, rounding_mode="floor")],
        send_splits=torch.bincount(owner[order], minlength=stage.ep_size).tolist(),
        send_expert_ids=send_ids,
        gate_weights=weights,
        gate_order=order,
    )
    counts = state.setdefault("expert_counts", {})
    counts[layer_index] = torch.bincount(flat_ids, minlength=num_experts).cpu()


def _shared(stage: StageModule, layer: Layer, layer_index: int, state: State) -> None:
    if len(layer.shared) == 0:
        return
    x = state["x"]
    out = layer.shared[0](x)
    for expert in list(layer.shared)[1:]:
        out = out + expert(x)
    state["shared_out"] = out


def run_local_experts(experts: nn.ModuleDict, rows: Tensor, expert_ids: Tensor, num_experts: int) -> Tensor:
    """Apply each local expert (keyed by global id) to its rows and return outputs in the input order."""
    held = sorted(int(k) for k in experts)
    local_of = torch.full((num_experts,), -1, dtype=torch.int64, device=expert_ids.device)
    local_of[held] = torch.arange(len(held), device=expert_ids.device)
    local_ids = local_of[expert_ids]
    if (local_ids < 0).any():
        raise ValueError(f"rows for experts this rank does not hold (holds {held})")
    order = torch.argsort(local_ids, stable=True)
    counts = torch.bincount(local_ids, minlength=len(held)).tolist()
    pieces = torch.split(rows[order], counts)
    outs = [experts[str(held[i])](piece) for i, piece in enumerate(pieces)]
    return torch.cat(outs)[torch.argsort(order)]


def _experts(stage: StageModule, layer: Layer, layer_index: int, state: State) -> None:
    state["return_rows"] = run_local_experts(
        layer.experts, state["recv_rows"], state["recv_expert_ids"], stage.spec.num_experts
    )


def _moe_out(stage: StageModule, layer: Layer, layer_index: int, state: State) -> None:
    h, weights = state["h"], state["gate_weights"]
    tokens, k = weights.shape
    pair_rows = state["combined_rows"][torch.argsort(state["gate_order"])]
    out = (pair_rows.view(tokens, k, -1) * weights.unsqueeze(-1)).sum(dim=1)
    shared = state.pop("shared_out", None)
    if shared is not None:
        out = out + shared
    state["h"] = stage.shard.residual(h, split=stage.shard.experts_split) + out.view_as(h)


_LAYER_OPS = {
    "attn": _attn,
    "dense": _dense,
    "router": _router,
    "shared": _shared,
    "experts": _experts,
    "moe_out": _moe_out,
}


def run_without_exchange(stage: StageModule, ops: Iterable[str], state: State) -> None:
    """Run ops on one EP rank that holds every expert: dispatch and combine are the identity."""
    for op in ops:
        if op.startswith("experts:"):
            state.update(
                recv_rows=state["send_rows"],
                recv_splits=list(state["send_splits"]),
                recv_expert_ids=state["send_expert_ids"],
            )
        stage.run_op(op, state)
        if op.startswith("experts:"):
            state["combined_rows"] = state["return_rows"]


class ReferenceModel(nn.Module):
    """The full model in one process (ep=1, all layers, all experts), built from StageModule."""

    def __init__(
        self,
        spec: ModelSpec,
        *,
        seed: int = 0,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.spec = spec
        self.stage = StageModule(
            spec, range(spec.num_layers), first=True, last=True, seed=seed, device=device, dtype=dtype
        )

    def run(self, tokens: Tensor, targets: Tensor) -> State:
        """All ops in order; dispatch and combine are the identity (one EP rank)."""
        state: State = {"tokens": tokens, "targets": targets}
        run_without_exchange(self.stage, self.stage.forward_ops(), state)
        return state

    def loss(self, tokens: Tensor, targets: Tensor) -> Tensor:
        return self.run(tokens, targets)["loss"]

    def forward(self, tokens: Tensor, targets: Tensor) -> Tensor:
        return self.loss(tokens, targets)


__all__ = [
    "DIFFERENTIABLE_IO",
    "FFN",
    "ReferenceModel",
    "StageModule",
    "State",
    "expert_range",
    "layer_ops",
    "run_local_experts",
    "run_without_exchange",
    "stage_ops",
]
