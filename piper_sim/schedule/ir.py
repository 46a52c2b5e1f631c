"""Schedule IR: tasks, per-stage programs and the mesh they run on. Pure data.

Owns Task and Schedule; the rank <-> mesh-coordinate map they run on is piper_sim.workload.mesh.Mesh and a
task's vocabulary (TaskKind, Stream, Role) is piper_sim.workload.task_kinds (the schedule layer imports the
workload side, never the reverse). Must not import simpy, torch, numpy
or anything that runs.

A schedule is a function of the pipeline position only: every rank of one pipeline stage (all its
ep, dp and tp coordinates) runs the same program. So a Schedule stores one program per pipeline
stage, with task ids local to the program; `Schedule.rank_tasks(rank)` instantiates the concrete
tasks of one rank (global ids "r<rank>:<local id>", concrete peers). Cross-rank links are only
send/recv pairs (matched by tag) and collectives (members given by the task's group axis).

Execution contract (both backends honour it; see docs/execution-contract.md):
- a rank walks its program in order with one program counter;
- a task may start when every dep (same rank) is done and the program counter has reached it;
- compute and collective tasks block the program counter until they end;
- send and recv tasks are issued asynchronously: the program counter moves on at once, the
  transfer starts when both sides are issued, and the task ends when the transfer ends; a task that
  depends on a recv waits for it;
- a nonblocking collective (ZeRO-3's unit gathers and gradient reduce-scatters) is issued like a send: the
  program counter moves on once its deps are done, and a task that depends on it waits for it;
- a collective starts when every member of its group has reached it.

Layouts (which virtual stage chunk c of pipeline stage p runs; Schedule.layout, docs/schedules.md):
- "interleaved" (Megatron, Narayanan et al. 2021): virtual stage c * pp + p; one pipeline of pp * vpp.
- "v" (vpp 2; DualPipeV, Zero Bubble's V schedules): chunk 0 is virtual stage p, chunk 1 is 2pp - 1 - p;
  one pipeline of 2pp virtual stages that goes down the ranks and back up.
- "bidirectional" (vpp 2; DualPipe, DeepSeek-V3 technical report section 3.2.1): two pipelines over
  the same layers, each of pp virtual stages. Chunk 0 of stage p is stage p of the "down" pipeline
  (virtual stage p, fed at rank 0), chunk 1 is stage pp - 1 - p of the "up" pipeline (virtual stage
  2pp - 1 - p, fed at rank pp - 1); virtual stage pp + s holds the same layers as s (a second copy of
  the parameters, as the report says DualPipe keeps). The first half of the microbatches runs down,
  the second half up; a microbatch's tasks use the chunk of its pipeline on every rank.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from enum import StrEnum

from piper_sim.workload.mesh import GROUP_AXES, Mesh
from piper_sim.workload.task_kinds import (
    COLLECTIVE_KINDS,
    COMPUTE_KINDS,
    P2P_KINDS,
    STREAM_OF_KIND,
    Role,
    Stream,
    TaskKind,
)


class Layout(StrEnum):
    """Chunk -> virtual stage mapping of a schedule (module docstring)."""

    INTERLEAVED = "interleaved"
    V = "v"
    BIDIRECTIONAL = "bidirectional"


@dataclass(frozen=True, kw_only=True, slots=True)
class Task:
    """One unit of work in a stage program.

    task_id: unique within the program (local id). kind: see *_KINDS. microbatch/chunk: -1 when not
    tied to one. ops: for compute tasks, the model pieces it runs, in order (see workload/ops.py):
    "embed", "attn:L", "router:L", "experts:L", "moe_out:L", "dense:L", "head". For backward kinds
    the same ops are run backward. role: for comm tasks, what moves ("act", "grad", "dispatch",
    "combine", "grad_dense", "grad_expert"); layer: the MoE layer of an all-to-all.
    peer_stage: for send/recv, the pipeline stage of the other side; tag: matches a send with its recv.
    group_axis: for collectives, the mesh axis whose ranks form the group ("ep", "dp", "ep_dp").
    nonblocking: a collective issued without blocking the program counter (ZeRO-3 / FSDP: a unit's parameter
    all-gather, prefetched while the unit before it computes, and its gradients' reduce-scatter); layer: the
    unit (workload/fsdp.py); of a gradient all-reduce under DeepSpeed's ZeRO-1/2, which of its class's calls it
    is, one per reduce bucket the class is in (workload/deepspeed_zero.py: reduce_buckets).
    """

    task_id: str
    kind: TaskKind
    microbatch: int = -1
    chunk: int = -1
    ops: tuple[str, ...] = ()
    deps: tuple[str, ...] = ()
    role: Role = Role.NONE
    layer: int = -1
    peer_stage: int = -1
    tag: str = ""
    group_axis: str = ""
    nonblocking: bool = False

    def __post_init__(self) -> None:
        """Kinds and roles given as strings (generators, JSON) become their enums; an unknown one is an error."""
        if type(self.kind) is not TaskKind:
            object.__setattr__(self, "kind", TaskKind(self.kind))
        if type(self.role) is not Role:
            object.__setattr__(self, "role", Role(self.role))
        if self.nonblocking and self.kind not in COLLECTIVE_KINDS:
            raise ValueError(f"task {self.task_id}: only a collective can be nonblocking, not a {self.kind.value}")
        if self.group_axis and self.group_axis not in GROUP_AXES:
            raise ValueError(f"task {self.task_id}: unknown group axis {self.group_axis!r}; allowed: {GROUP_AXES}")

    @property
    def stream(self) -> Stream:
        return STREAM_OF_KIND[self.kind]

    @property
    def in_forward(self) -> bool:
        """Part of a forward pass or its recomputation (lowering names those tasks "F:..." and "R:...")."""
        return self.task_id.startswith(("F:", "R:"))

    @property
    def is_compute(self) -> bool:
        return self.kind in COMPUTE_KINDS

    @property
    def is_collective(self) -> bool:
        return self.kind in COLLECTIVE_KINDS

    @property
    def is_issued(self) -> bool:
        """Issued without blocking the program counter: send, recv and nonblocking collectives."""
        return self.kind in P2P_KINDS or self.nonblocking


@dataclass(frozen=True)
class VirtualStages:
    """The virtual stages of a layout over pp pipeline stages with vpp chunks each, and their pipelines."""

    layout: Layout
    pp: int
    vpp: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "layout", Layout(self.layout))
        if self.layout != Layout.INTERLEAVED and self.vpp != 2:
            raise ValueError(f"layout {self.layout.value!r} needs 2 chunks per stage, got vpp {self.vpp}")

    @property
    def num_virtual(self) -> int:
        return self.pp * self.vpp

    @functools.cached_property
    def num_pipelines(self) -> int:
        return 2 if self.layout == Layout.BIDIRECTIONAL else 1

    @functools.cached_property
    def pipeline_length(self) -> int:  # kept: every is_first / is_last asks (the planner's screens, millions of times)
        return self.num_virtual // self.num_pipelines

    def of(self, pp_index: int, chunk: int) -> int:
        """The virtual stage chunk `chunk` of pipeline stage `pp_index` runs."""
        if self.layout == Layout.INTERLEAVED:
            return chunk * self.pp + pp_index
        return pp_index if chunk == 0 else 2 * self.pp - 1 - pp_index

    def where(self, virtual: int) -> tuple[int, int]:
        """(pipeline stage, chunk) of a virtual stage."""
        if self.layout == Layout.INTERLEAVED:
            return virtual % self.pp, virtual // self.pp
        return (virtual, 0) if virtual < self.pp else (2 * self.pp - 1 - virtual, 1)

    def is_first(self, virtual: int) -> bool:
        """Holds the embedding: the start of a pipeline."""
        return virtual % self.pipeline_length == 0

    def is_last(self, virtual: int) -> bool:
        """Holds the head and the loss: the end of a pipeline."""
        return virtual % self.pipeline_length == self.pipeline_length - 1

    def previous(self, virtual: int) -> int | None:
        return None if self.is_first(virtual) else virtual - 1

    def next(self, virtual: int) -> int | None:
        return None if self.is_last(virtual) else virtual + 1

    def position(self, virtual: int) -> int:
        """Which slice of the model a virtual stage holds (virtual stages of one position share layers)."""
        return virtual % self.pipeline_length

    def runs(self, pp_index: int, chunk: int, microbatch: int, num_microbatches: int) -> bool:
        """Whether that chunk of that stage runs the microbatch: the first num_microbatches / pipelines
        microbatches enter pipeline 0, the next ones pipeline 1."""
        pipeline = self.of(pp_index, chunk) // self.pipeline_length
        return microbatch * self.num_pipelines // num_microbatches == pipeline


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """Per-stage programs of one training step over a mesh.

    stage_programs[pp_index] is the ordered program every rank of that pipeline stage runs.
    layout: which virtual stage chunk c on pipeline stage p runs (VirtualStages; default interleaved,
    c * pp + p).
    lowered: False for a generator's coarse output (forward/backward per chunk and microbatch),
    True after the lowering passes (p2p, all-to-all, gradient reduction, optimizer).
    """

    name: str
    mesh: Mesh
    vpp: int
    num_microbatches: int
    stage_programs: tuple[tuple[Task, ...], ...]
    lowered: bool = False
    stage_layers: tuple[tuple[int, ...], ...] = field(default=())  # layers per virtual stage
    layout: Layout = Layout.INTERLEAVED

    @property
    def pp(self) -> int:
        return self.mesh.pp

    @property
    def num_virtual_stages(self) -> int:
        return self.pp * self.vpp

    @property
    def stages(self) -> VirtualStages:
        return VirtualStages(self.layout, self.pp, self.vpp)

    def virtual_stage(self, pp_index: int, chunk: int) -> int:
        return self.stages.of(pp_index, chunk)

    def program(self, rank: int) -> tuple[Task, ...]:
        return self.stage_programs[self.mesh.stage_of(rank)]

    def num_tasks(self) -> int:
        """Tasks over all ranks."""
        ranks_per_stage = self.mesh.num_ranks // self.pp
        return sum(len(p) for p in self.stage_programs) * ranks_per_stage

    def rank_tasks(self, rank: int) -> list[dict]:
        """Concrete tasks of one rank: global ids, concrete peers and group members."""
        out = []
        for task in self.program(rank):
            peers: tuple[int, ...] = ()
            if task.kind in P2P_KINDS:
                peers = (self.mesh.peer(rank, task.peer_stage),)
            elif task.is_collective:
                peers = self.mesh.group(rank, task.group_axis)
            out.append(
                {
                    "task_id": global_task_id(rank, task.task_id),
                    "rank": rank,
                    "kind": task.kind,
                    "stream": task.stream,
                    "microbatch": task.microbatch,
                    "chunk": task.chunk,
                    "ops": task.ops,
                    "deps": tuple(global_task_id(rank, d) for d in task.deps),
                    "role": task.role,
                    "layer": task.layer,
                    "peers": peers,
                    "tag": task.tag,
                }
            )
        return out


def global_task_id(rank: int, local_id: str) -> str:
    return f"r{rank}:{local_id}"


_COARSE_PREFIX = {
    TaskKind.FORWARD: "F",
    TaskKind.BACKWARD: "B",
    TaskKind.BACKWARD_INPUT: "B",
    TaskKind.BACKWARD_WEIGHT: "W",
}


def coarse_task_id(kind: TaskKind, chunk: int, microbatch: int) -> str:
    return f"{_COARSE_PREFIX[kind]}:c{chunk}:m{microbatch}"
