"""Migration cost: the bytes moved when an expert changes rank (docs/routing.md, "Migration bytes").

Convention (Piper's resource model, Dash and Wang 2026, arXiv 2605.05049): an expert's training state is 16 bytes per
parameter, the same figure the memory model uses (workload/memory.py): fp16/bf16 weight (2) and
gradient (2), fp32 master weight (4), Adam m (4) and v (4). An expert has expert_matrices x d x d_ffn
parameters, so moving one moves 16 x 3 d d_ffn = 48 d d_ffn bytes for 3-matrix (SwiGLU) experts and
32 d d_ffn for 2-matrix experts: the paper's "48 d d_ffn" is this formula, not a fp16-weight-only count.
state_bytes_per_param = 14 leaves the gradient out (it is zero right after the optimizer step).
A swap moves two experts, one each way. Pure numpy: no simpy, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from piper_sim.migration.expert_placement import ExpertPlacement
from piper_sim.workload.memory import STATE_BYTES_PER_PARAM
from piper_sim.workload.model import ModelSpec


def expert_state_bytes(model: ModelSpec, state_bytes_per_param: int = STATE_BYTES_PER_PARAM) -> int:
    """Bytes moved per migrated expert: state_bytes_per_param x expert_matrices x d_model x expert_ffn_dim."""
    return state_bytes_per_param * model.expert_params()


@dataclass(frozen=True, kw_only=True)
class Move:
    """One expert's state moving between EP ranks (member indices within each EP group holding the layer)."""

    layer: int
    expert: int
    src: int
    dst: int
    bytes: int


def placement_moves(old: ExpertPlacement, new: ExpertPlacement, bytes_per_expert: int) -> tuple[Move, ...]:
    """The experts whose owner differs between two placements (net change), ordered by layer and expert."""
    if old.layers != new.layers or old.ep != new.ep or old.owner.shape != new.owner.shape:
        raise ValueError("placements differ in layers, ep or experts")
    moves = []
    for i, layer in enumerate(old.layers):
        for e in np.flatnonzero(old.owner[i] != new.owner[i]):
            moves.append(
                Move(
                    layer=layer,
                    expert=int(e),
                    src=int(old.owner[i, e]),
                    dst=int(new.owner[i, e]),
                    bytes=bytes_per_expert,
                )
            )
    return tuple(moves)


def move_matrix(moves: tuple[Move, ...] | list[Move], ep: int, layer: int | None = None) -> np.ndarray:
    """[src, dst] bytes of these moves (one layer's, or all), for the simulator's point-to-point traffic."""
    out = np.zeros((ep, ep), dtype=np.int64)
    for m in moves:
        if layer is None or m.layer == layer:
            out[m.src, m.dst] += m.bytes
    return out


def total_bytes(moves: tuple[Move, ...] | list[Move]) -> int:
    return int(sum(m.bytes for m in moves))
