"""Run a PP x EP grid of StageModules in one process, emulating the all-to-alls by concatenation.

Owns the single-process reference of the distributed data flow: every EP rank has its own microbatch,
the dispatch and combine exchanges are done with differentiable torch.split / torch.cat, and pipeline
stages hand the state dict on. Used by tests and as a correctness oracle for the executor.
Only piper_sim.torch_backend may import torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from piper_sim.workload.model import ModelSpec

from .stage_modules import StageModule, State


def local_all_to_all(rows: Sequence[Tensor], splits: Sequence[Sequence[int]]) -> tuple[list[Tensor], list[list[int]]]:
    """rows[r] split by splits[r] (one count per destination); returns what each rank receives
    (chunks concatenated in source order) and its receive splits (one count per source)."""
    num_ranks = len(rows)
    chunks = [torch.split(rows[r], list(splits[r])) for r in range(num_ranks)]
    recv = [torch.cat([chunks[s][d] for s in range(num_ranks)]) for d in range(num_ranks)]
    recv_splits = [[int(splits[s][d]) for s in range(num_ranks)] for d in range(num_ranks)]
    return recv, recv_splits


def dispatch(states: Sequence[State]) -> None:
    """Emulated dispatch over the EP ranks' states: send_* -> recv_rows, recv_splits, recv_expert_ids."""
    splits = [s["send_splits"] for s in states]
    rows, recv_splits = local_all_to_all([s["send_rows"] for s in states], splits)
    ids, _ = local_all_to_all([s["send_expert_ids"] for s in states], splits)
    for state, r, n, i in zip(states, rows, recv_splits, ids, strict=True):
        state.update(recv_rows=r, recv_splits=n, recv_expert_ids=i)


def combine(states: Sequence[State]) -> None:
    """Emulated combine: return_rows (split by recv_splits) -> combined_rows, in send_rows order."""
    rows, _ = local_all_to_all([s["return_rows"] for s in states], [s["recv_splits"] for s in states])
    for state, r in zip(states, rows, strict=True):
        state["combined_rows"] = r


def run_ep_group(stages: Sequence[StageModule], states: Sequence[State]) -> None:
    """Run the forward ops of one virtual stage on all EP ranks of its group, in lockstep."""
    ops = stages[0].forward_ops()
    for op in ops:
        if op.startswith("experts:"):
            dispatch(states)
        for stage, state in zip(stages, states, strict=True):
            stage.run_op(op, state)
        if op.startswith("experts:"):
            combine(states)


def run_grid(grid: Sequence[Sequence[StageModule]], tokens: Sequence[Tensor], targets: Sequence[Tensor]) -> list[State]:
    """grid[pp_stage][ep_rank]; tokens/targets per EP rank. Returns the final state per EP rank."""
    states: list[State] = [{"tokens": t, "targets": y} for t, y in zip(tokens, targets, strict=True)]
    for stages in grid:
        if len(stages) != len(states):
            raise ValueError(f"each stage needs {len(states)} EP ranks, got {len(stages)}")
        run_ep_group(stages, states)
    return states


def build_grid(
    spec: ModelSpec,
    stage_layers: Sequence[Sequence[int]],
    ep_size: int,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> list[list[StageModule]]:
    """StageModules for consecutive virtual stages (one layer list each) times EP ranks."""
    last = len(stage_layers) - 1
    return [
        [
            StageModule(spec, layers, first=p == 0, last=p == last, ep_rank=e, ep_size=ep_size, seed=seed, dtype=dtype)
            for e in range(ep_size)
        ]
        for p, layers in enumerate(stage_layers)
    ]
