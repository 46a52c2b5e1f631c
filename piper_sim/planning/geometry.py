"""A plan's pipeline geometry, computed once per shape for the screen's thousands of plans.

Owns geometry(num_layers, schedule, pp, vpp): the layers of every virtual stage (schedule.build.split_layers) and,
per pipeline stage, its chunks with their virtual stage, whether each starts or ends a pipeline, and the layers the
stage holds; the same values the resource model and the estimator read off schedule.ir.VirtualStages, without
rebuilding them per plan. Pure: no simpy, torch.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from piper_sim.schedule.build import split_layers
from piper_sim.schedule.generator_registry import schedule_layout
from piper_sim.schedule.ir import VirtualStages


@dataclass(frozen=True)
class Chunk:
    index: int  # the chunk's index on its stage (c)
    virtual: int  # its virtual stage
    first: bool  # starts a pipeline (holds the embedding)
    last: bool  # ends a pipeline (holds the head)
    layers: tuple[int, ...]


@dataclass(frozen=True)
class Geometry:
    stages: VirtualStages
    layers: tuple[tuple[int, ...], ...]  # per virtual stage
    chunks: tuple[tuple[Chunk, ...], ...]  # per pipeline stage, its chunks in chunk order
    held: tuple[tuple[int, ...], ...]  # per pipeline stage, the layers of its chunks
    first: tuple[bool, ...]  # per pipeline stage: one of its chunks starts a pipeline
    last: tuple[bool, ...]  # per pipeline stage: one of its chunks ends a pipeline


@functools.lru_cache(maxsize=4096)
def geometry(num_layers: int, schedule: str, pp: int, vpp: int) -> Geometry:
    stages = VirtualStages(schedule_layout(schedule), pp, vpp)
    layers = split_layers(num_layers, stages)
    chunks = tuple(
        tuple(
            Chunk(c, v, stages.is_first(v), stages.is_last(v), layers[v])
            for c, v in ((c, stages.of(p, c)) for c in range(vpp))
        )
        for p in range(pp)
    )
    return Geometry(
        stages=stages,
        layers=layers,
        chunks=chunks,
        held=tuple(tuple(layer for chunk in row for layer in chunk.layers) for row in chunks),
        first=tuple(any(chunk.first for chunk in row) for row in chunks),
        last=tuple(any(chunk.last for chunk in row) for row in chunks),
    )
