"""What a microbatch carries through a rank's program in the torch executor: its forward segments (the pieces
autograd runs on, one per compute task or all-to-all), the gradients flowing back, and, with full
recomputation, the checkpoint the recompute tasks rebuild from. Only piper_sim.torch_backend may import torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from torch import Tensor

from piper_sim.schedule.ir import Task
from piper_sim.workload.task_kinds import RECOMPUTE_KINDS, TaskKind

from .stage_modules import StageModule, State


@dataclass
class Segment:
    """A forward piece of one (chunk, microbatch): input leaves and output tensors, or an all-to-all."""

    inputs: dict[str, Tensor] = field(default_factory=dict)
    outputs: dict[str, Tensor] = field(default_factory=dict)
    weight_grads: list = field(default_factory=list)  # deferred by the input pass (zero bubble), for the W pass
    chunk_module: StageModule | None = None
    a2a: dict | None = None  # for all-to-all pieces: role, splits, layer
    flops: float = 0.0  # forward FLOPs of the segment (with the real expert rows)
    saved_bytes: float = 0.0  # activations autograd keeps for the segment's backward (unique storages)
    ops: tuple[str, ...] = ()
    redo: bool = False  # its recomputed part (ops run without autograd) is rebuilt on MicroState.recomputed


@dataclass
class MicroState:
    state: State
    segments: list[Segment] = field(default_factory=list)
    pending: dict[str, Tensor] = field(default_factory=dict)  # gradients flowing backward, by state key
    done_backward: list[Segment] = field(default_factory=list)
    checkpoint: State | None = None  # full recomputation: the state the recomputed ops start from
    checkpoint_bytes: float = 0.0
    redo_state: State | None = None  # the recompute tasks' own state, from the checkpoint
    recomputed: list[Segment] = field(default_factory=list)  # what the recompute tasks rebuilt, in forward order


def leafify(state: State, *, floats: bool = False) -> dict[str, Tensor]:
    """Replace every differentiable tensor in state by a detached leaf; return the leaves by key.

    floats: every floating-point tensor (after ops that ran without autograd)."""
    leaves = {}
    for key, value in list(state.items()):
        if isinstance(value, Tensor) and (value.requires_grad or (floats and value.is_floating_point())):
            leaf = value.detach().requires_grad_(True)
            state[key] = leaf
            leaves[key] = leaf
    return leaves


def differentiable(state: State) -> dict[str, Tensor]:
    return {k: v for k, v in state.items() if isinstance(v, Tensor) and v.requires_grad}


def recomputed_ops(program: Sequence[Task]) -> dict[int, set[str]]:
    """Per chunk, what its recompute tasks re-run: ops, and all-to-alls as "dispatch:L" / "combine:L"."""
    redo: dict[int, set[str]] = {}
    for task in program:
        if task.kind in RECOMPUTE_KINDS:
            redo.setdefault(task.chunk, set()).update(task.ops)
        elif task.kind == TaskKind.ALL_TO_ALL and task.task_id.startswith("R:"):
            redo.setdefault(task.chunk, set()).add(f"{task.role}:{task.layer}")
    return redo
