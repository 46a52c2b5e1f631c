"""A pipeline stage's memory terms: the one formula the simulator's stage plans (sim/stage_plans.py), the planner's
resource model and the estimator share (planning/resource.py).

Owns stage_activation_terms (activations per chunk and the recomputation's transient) and stage_memory_terms (those,
the training state of the parameters the stage holds, the transients of ZeRO-2's gradients, ZeRO-3's gathered
units and the context-parallel ring, the parameters its optimizer updates and those of its fp8 linears), built from
the per-rank byte formulas of workload/memory.py. A stage's virtual stages are told apart only by whether they start
or end a pipeline (PipelineEnds: the schedule's VirtualStages is one); workload must not import schedule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from piper_sim.workload.context_parallel import rank_view, ring_buffer_bytes
from piper_sim.workload.fsdp_state import gathered_window_bytes, unit_params
from piper_sim.workload.memory import (
    PARAM_CLASSES,
    activation_bytes,
    fp8_weight_copy_bytes,
    fp8_weight_params,
    param_shards,
    rank_params,
    recompute_transient_bytes,
    state_bytes,
)
from piper_sim.workload.model import ModelSpec
from piper_sim.workload.parallel import ParallelSpec
from piper_sim.workload.recompute import DEFAULT_SELECTIVE_MODULES


class PipelineEnds(Protocol):
    """Which virtual stages start a pipeline (hold the embedding) and which end one (the head and the loss)."""

    def is_first(self, virtual: int) -> bool: ...

    def is_last(self, virtual: int) -> bool: ...


@dataclass(frozen=True)
class OnePipeline:
    """num_virtual virtual stages in one pipeline (an interleaved layout of one chunk per stage)."""

    num_virtual: int

    def is_first(self, virtual: int) -> bool:
        return virtual % self.num_virtual == 0

    def is_last(self, virtual: int) -> bool:
        return virtual % self.num_virtual == self.num_virtual - 1


def stage_activation_terms(
    model: ModelSpec,
    stage_layers: tuple[tuple[int, ...], ...],
    chunks: list[int],
    parallel: ParallelSpec,
    *,
    flash_attention: bool,
    recompute: str,
    recompute_layers: int | None,
    stages: PipelineEnds,
    checkpoint_layers: int | None = None,
    recompute_modules: tuple[str, ...] = DEFAULT_SELECTIVE_MODULES,
) -> tuple[dict[int, float], float]:
    """(activations per chunk, the recomputation's transient) of a stage: the terms of stage_memory_terms that
    depend on the micro-batch size, the tensor / context split and the stage's chunks only (not on ZeRO, EP or
    DP)."""
    recomputed = {
        c: len(stage_layers[v]) if recompute_layers is None else recompute_layers for c, v in enumerate(chunks)
    }
    split = parallel.split
    seen = rank_view(model, parallel.cp)  # a CP rank's activations: its chunks of each sequence
    act = {
        c: activation_bytes(
            seen,
            stage_layers[v],
            parallel.micro_batch_size,
            last=stages.is_last(v),
            flash_attention=flash_attention,
            recompute=recompute,
            recomputed=recomputed[c],
            checkpoint_layers=checkpoint_layers,
            split=split,
            modules=recompute_modules,
        )
        for c, v in enumerate(chunks)
    }
    transient = max(
        recompute_transient_bytes(
            seen,
            stage_layers[v],
            parallel.micro_batch_size,
            recompute=recompute,
            recomputed=recomputed[c],
            checkpoint_layers=checkpoint_layers,
            flash_attention=flash_attention,
            split=split,
        )
        for c, v in enumerate(chunks)
    )
    return act, transient


def stage_memory_terms(
    model: ModelSpec,
    stage_layers: tuple[tuple[int, ...], ...],
    chunks: list[int],
    parallel: ParallelSpec,
    params: dict[str, float],
    *,
    flash_attention: bool,
    recompute: str,
    recompute_layers: int | None,
    zero: int,
    stages: PipelineEnds | None = None,
    checkpoint_layers: int | None = None,
    fp8_transposed_copies: bool = True,
    reshard_after_forward: bool = True,
    recompute_modules: tuple[str, ...] = DEFAULT_SELECTIVE_MODULES,
    activations: tuple[dict[int, float], float] | None = None,
) -> dict:
    """A stage's memory terms, shared with the planner's resource model: activations per chunk, training state
    (with the fp8 copies of its fp8 linears' weights under fp8), the recomputation transient, the parameters its
    optimizer updates and those of its fp8 linears. stages: the schedule's layout (which virtual stages end a
    pipeline; default interleaved). fp8_transposed_copies: the device's (DeviceProfile). recompute_modules: what
    selective recomputation re-runs (workload/recompute.py). reshard_after_forward: ZeRO-3's (workload/fsdp.py).
    activations: stage_activation_terms of the same arguments, where the caller has them."""
    if stages is None:  # interleaved: the last virtual stage ends the one pipeline
        stages = OnePipeline(len(stage_layers))
    act, recompute_transient = activations or stage_activation_terms(
        model,
        stage_layers,
        chunks,
        parallel,
        flash_attention=flash_attention,
        recompute=recompute,
        recompute_layers=recompute_layers,
        stages=stages,
        checkpoint_layers=checkpoint_layers,
        recompute_modules=recompute_modules,
    )
    split = parallel.split
    transient = ring_buffer_bytes(model, parallel) + recompute_transient
    shards = param_shards(
        zero=zero,
        data_parallel=parallel.data_parallel,
        dp=parallel.dp,
        stage_size=parallel.num_gpus // parallel.pp,
        replicate=parallel.dp_replicate,
    )
    if zero == 3:  # the gathered units: two units' parameters and two units' gradients at most (workload/fsdp.py)
        transient += gathered_window_bytes(
            [
                held
                for v in chunks
                for held in unit_params(
                    model,
                    stage_layers[v],
                    first=stages.is_first(v),
                    last=stages.is_last(v),
                    ep=parallel.ep,
                    split=split,
                ).values()
            ],
            shards,
            model.dtype_bytes,
            reshard_after_forward=reshard_after_forward,
        )
    if zero == 2:  # a chunk's full gradients live while its backward runs, until they are reduce-scattered
        transient += max(
            model.dtype_bytes
            * sum(
                rank_params(
                    model,
                    stage_layers[v],
                    first=stages.is_first(v),
                    last=stages.is_last(v),
                    ep=parallel.ep,
                    split=split,
                ).values()
            )
            for v in chunks
        )
    held = tuple(layer for v in chunks for layer in stage_layers[v])
    fp8_params = fp8_weight_params(
        model, params, held, first=any(map(stages.is_first, chunks)), last=any(map(stages.is_last, chunks)), tp=split.tp
    )
    state = state_bytes(
        params, zero=zero, shards=shards, dtype_bytes=model.dtype_bytes, master_weights=model.master_weights
    )
    state += fp8_weight_copy_bytes(fp8_params, fp8_transposed_copies)
    return {
        "act": act,
        "transient": transient,
        "state": state,
        "optimizer_params": sum(params[kind] / shards[kind] for kind in PARAM_CLASSES),
        "fp8_params": fp8_params,
    }
