"""The executor's tensor-parallel tasks (role "tp"): the schedule's all-reduce, reduce-scatter and all-gather of
the residual stream h in the forward and of its gradient in the backward (docs/tensor-parallel.md).

Owns the collectives on (batch, seq, d) activations over a TP group, by sequence: all-reduce sums; reduce-scatter
sums and keeps the rank's 1/tp of the sequence; all-gather makes the sequence whole again. A forward task and
its backward run the same kind on different tensors (h, or its gradient), so one function serves both. Also the
one place where h changes shape without a task: with whole experts (etp 1) and no sp, a rank routes its
sequence slice of a whole h (sliced before the router's segment starts), and the gradient of the MoE block's
output, whole and equal on every rank, is sliced the same way before the block's backward (the backward of the
all-gather after the block, whose consumers are replicated).
Only piper_sim.torch_backend may import torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch.distributed as dist
from torch import Tensor

from piper_sim.workload.task_kinds import TaskKind

from .tensor_parallel import TensorShard

TP_KINDS = (TaskKind.ALL_REDUCE, TaskKind.REDUCE_SCATTER, TaskKind.ALL_GATHER)


def sequence_collective(kind: str, x: Tensor, tp: int, group: dist.ProcessGroup) -> Tensor:
    """kind over the group on x (batch, seq, d), split or gathered along the sequence."""
    if kind == TaskKind.ALL_REDUCE:
        out = x.detach().contiguous().clone()
        dist.all_reduce(out, group=group)
        return out
    b, s, d = x.shape
    if kind == TaskKind.REDUCE_SCATTER:
        pieces = x.detach().reshape(b, tp, s // tp, d).transpose(0, 1).reshape(tp * b, s // tp, d)  # by rank
        out = x.new_empty((b, s // tp, d))
        dist.reduce_scatter_tensor(out, pieces, group=group)
        return out
    if kind == TaskKind.ALL_GATHER:
        gathered = x.new_empty((tp * b, s, d))  # by rank
        dist.all_gather_into_tensor(gathered, x.detach().contiguous(), group=group)
        return gathered.view(tp, b, s, d).transpose(0, 1).reshape(b, tp * s, d)
    raise ValueError(f"no tensor-parallel collective {kind!r}; allowed: {tuple(map(str, TP_KINDS))}")


class TensorParallelTasks:
    """One rank's TP tasks and the shape rules around them (module docstring)."""

    def __init__(self, shard: TensorShard) -> None:
        self.shard = shard

    def run(self, kind: str, x: Tensor) -> Tensor:
        return sequence_collective(kind, x, self.shard.tp, self.shard.group)

    def enter_forward(self, ops: Sequence[str], state: dict) -> None:
        """Before a forward (or recomputed) segment: the rank's token slice for the router, when it routes one."""
        if self.shard.routes_slice and ops and ops[0].startswith("router:"):
            state["h"] = self.shard.local_tokens(state["h"])

    def enter_backward(self, ops: Sequence[str], pending: dict) -> None:
        """Before a backward segment: the slice of the MoE block's output gradient, when the block ran on one."""
        if self.shard.routes_slice and ops and ops[-1].startswith("moe_out:") and "h" in pending:
            pending["h"] = self.shard.local_tokens(pending["h"])

    def activation_shape(self, batch: int, seq: int, d: int) -> tuple[int, int, int]:
        """What a pipeline transfer of h carries: the whole sequence, or the rank's 1/tp under sp."""
        return batch, seq // self.shard.tp if self.shard.sp else seq, d
