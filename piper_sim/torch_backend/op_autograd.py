"""Per-op forward and backward, so a backward task can run the ops of a forward task in reverse order.

Owns the op-boundary autograd contract. forward_op runs one op with its differentiable inputs cut off
the graph (fresh leaf tensors) and records inputs and outputs; backward_op takes the gradients of the
op's outputs from a per-microbatch `grads` dict (keyed like the state), back-propagates through the op
(accumulating parameter .grad) and adds the gradients of its inputs back into `grads`. Keys keep their
forward meaning, so walking the records in reverse keeps `grads[key]` = d loss / d (current value).

Between ops the caller moves gradients across the exchanges, mirroring the forward:
- before backward of "experts:L": grads["return_rows"] = all-to-all of grads.pop("combined_rows") with
  send splits = record.splits["send_splits"] (it comes back split by recv_splits): the combine, reversed;
- after it: grads["send_rows"] = all-to-all of grads.pop("recv_rows") with send splits =
  record.splits["recv_splits"]: the dispatch, reversed.
(The record keeps the layer's splits: the state's keys already hold the last layer's.)
The loss seed is grads["loss"] = a scalar (e.g. 1 / number of microbatches).
Only piper_sim.torch_backend may import torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from piper_sim.workload.ops import parse_op

from .stage_modules import DIFFERENTIABLE_IO, StageModule, State


@dataclass
class OpRecord:
    """One executed op: its leaf inputs and its outputs, by state key."""

    op: str
    inputs: dict[str, Tensor]
    outputs: dict[str, Tensor]
    splits: dict[str, list[int]] = field(default_factory=dict)  # "experts:L": send_splits, recv_splits


def forward_op(stage: StageModule, op: str, state: State) -> OpRecord:
    """Run op on state with its differentiable inputs detached into leaves that require grad."""
    name = parse_op(op)[0]
    in_keys, out_keys = DIFFERENTIABLE_IO[name]
    splits = {k: list(state[k]) for k in ("send_splits", "recv_splits")} if name == "experts" else {}
    inputs = {
        k: state[k].detach().requires_grad_(True)
        for k in in_keys
        if isinstance(state.get(k), Tensor) and state[k].is_floating_point()
    }
    state.update(inputs)
    stage.run_op(op, state)
    outputs = {k: state[k] for k in out_keys if isinstance(state.get(k), Tensor) and state[k].requires_grad}
    return OpRecord(op, inputs, outputs, splits)


def backward_op(record: OpRecord, grads: dict[str, Tensor]) -> None:
    """Back-propagate the op: pop its outputs' gradients from grads, add its inputs' gradients."""
    pairs = [(out, grads.pop(k)) for k, out in record.outputs.items() if k in grads]
    if pairs:
        torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs])
    for key, leaf in record.inputs.items():
        if leaf.grad is not None:
            grads[key] = grads[key] + leaf.grad if key in grads else leaf.grad
            leaf.grad = None
