"""Per-stage facts the simulator needs for every task, computed once before the run.

Owns StagePlan: stream codes, which deps must be waited for (async p2p tasks), fixed compute
costs of tasks whose work does not depend on routing, memory deltas and parameters held (the stage's memory
terms from workload/stage_memory.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from piper_sim.schedule.ir import Schedule, Task
from piper_sim.schedule.liveness import activation_deltas
from piper_sim.workload.fsdp_state import unit_params
from piper_sim.workload.memory import rank_param_tensors, rank_params
from piper_sim.workload.model import ModelSpec
from piper_sim.workload.parallel import ParallelSpec
from piper_sim.workload.recompute import DEFAULT_SELECTIVE_MODULES
from piper_sim.workload.stage_memory import stage_memory_terms
from piper_sim.workload.task_kinds import Stream, TaskKind

COMPUTE_CODE, P2P_CODE, COLLECTIVE_CODE = 0, 1, 2  # StagePlan.streams: a task's stream as a small integer
NONBLOCKING_CODE = 3  # a collective issued without blocking the program counter (ZeRO-3's unit gathers)
STREAM_CODE = {Stream.COMPUTE: COMPUTE_CODE, Stream.P2P: P2P_CODE, Stream.COLLECTIVE: COLLECTIVE_CODE}
ROWS_OPS = ("experts:", "moe_act:")  # ops priced over the rows each member's experts got (lane_compute.py)
EXPERT_KINDS = frozenset(
    {
        TaskKind.FORWARD_EXPERT,
        TaskKind.BACKWARD_EXPERT,
        TaskKind.BACKWARD_EXPERT_INPUT,
        TaskKind.BACKWARD_WEIGHT,
        TaskKind.RECOMPUTE_EXPERT,
    }
)


class _StageEnds(TypedDict):
    """Where a stage's chunks sit, as memory.rank_params and rank_param_tensors take it."""

    first: bool  # it holds the first virtual stage (the embedding)
    last: bool  # it holds the last (the head)
    ep: int


@dataclass(kw_only=True)
class StagePlan:
    program: tuple[Task, ...]
    streams: list[int]
    async_deps: list[tuple[int, ...]]
    expert_layers: list[bool]
    fixed_cost: list[tuple[float, float]]
    mem_at_start: list[float]
    mem_at_end: list[float]
    params_dense: float
    params_expert: float
    params_replicated: float  # tp > 1: parameters every rank of the stage holds whole (memory.rank_params)
    chunk_params: dict[int, dict[str, float]]  # per chunk, its parameters by class (ZeRO-2's per-chunk buckets)
    unit_params: dict[tuple[int, int], dict[str, float]]  # ZeRO-3: per (chunk, unit), its parameters by class
    param_tensors: int
    state_bytes: float  # training state of the parameters held (sharded as the optimizer's ZeRO stage says)
    transient_bytes: float  # full recomputation: one recomputed layer's activations during its backward
    optimizer_params: float  # parameters this rank's optimizer step updates (its shard under ZeRO)
    fp8_params: float = 0.0  # parameters of its fp8 linears, whose weights its step quantizes (workload/precision.py)

    @property
    def static_bytes(self) -> float:
        return self.state_bytes + self.transient_bytes


def build_stage_plans(
    schedule: Schedule,
    model: ModelSpec,
    parallel: ParallelSpec,
    flash_attention: bool,
    *,
    recompute: str = "none",
    recompute_layers: int | None = None,
    zero: int = 0,
    checkpoint_layers: int | None = None,
    fp8_transposed_copies: bool = True,
    recompute_modules: tuple[str, ...] = DEFAULT_SELECTIVE_MODULES,
    reshard_after_forward: bool = True,
) -> list[StagePlan]:
    plans = []
    stages = schedule.stages
    for p, program in enumerate(schedule.stage_programs):
        index = {t.task_id: i for i, t in enumerate(program)}
        chunks = [schedule.virtual_stage(p, c) for c in range(schedule.vpp)]
        layers = tuple(layer for v in chunks for layer in schedule.stage_layers[v])
        ends: _StageEnds = {
            "first": any(map(stages.is_first, chunks)),
            "last": any(map(stages.is_last, chunks)),
            "ep": parallel.ep,
        }
        params = rank_params(model, layers, **ends, split=parallel.split)
        chunk_params = {
            c: rank_params(
                model,
                schedule.stage_layers[v],
                first=stages.is_first(v),
                last=stages.is_last(v),
                ep=parallel.ep,
                split=parallel.split,
            )
            for c, v in enumerate(chunks)
        }
        memory = stage_memory_terms(
            model,
            schedule.stage_layers,
            chunks,
            parallel,
            params,
            flash_attention=flash_attention,
            recompute=recompute,
            recompute_layers=recompute_layers,
            zero=zero,
            stages=stages,
            checkpoint_layers=checkpoint_layers,
            fp8_transposed_copies=fp8_transposed_copies,
            recompute_modules=recompute_modules,
            reshard_after_forward=reshard_after_forward,
        )
        act = memory["act"]
        mem_start, mem_end = activation_deltas(program, act)
        plans.append(
            StagePlan(
                program=program,
                streams=[NONBLOCKING_CODE if t.nonblocking else STREAM_CODE[t.stream] for t in program],
                async_deps=[tuple(index[d] for d in t.deps if program[index[d]].is_issued) for t in program],
                expert_layers=[
                    t.kind in EXPERT_KINDS and any(op.startswith(ROWS_OPS) for op in t.ops) for t in program
                ],
                fixed_cost=[(0.0, 0.0)] * len(program),
                mem_at_start=mem_start,
                mem_at_end=mem_end,
                params_dense=params["dense"],
                params_expert=params["expert"],
                params_replicated=params["replicated"],
                chunk_params=chunk_params,
                unit_params={
                    (c, u): held
                    for c, v in enumerate(chunks)
                    for u, held in unit_params(
                        model,
                        schedule.stage_layers[v],
                        first=stages.is_first(v),
                        last=stages.is_last(v),
                        ep=parallel.ep,
                        split=parallel.split,
                    ).items()
                }
                if zero == 3
                else {},
                param_tensors=rank_param_tensors(model, layers, **ends),
                state_bytes=memory["state"],
                transient_bytes=memory["transient"],
                optimizer_params=memory["optimizer_params"],
                fp8_params=memory["fp8_params"],
            )
        )
    return plans
