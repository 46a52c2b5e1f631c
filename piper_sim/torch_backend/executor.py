"""The torch executor: one rank walks its lowered Schedule program and runs every task for real.

Owns the execution of tasks under the execution contract (docs/execution-contract.md): compute
segments on StageModules, MoE dispatch/combine all-to-alls with the real router's uneven splits,
pipeline send/recv with isend/irecv, gradient all-reduces, the optimizer step, and the timing of
every task into RunTrace rows. The Schedule is the program: a task the executor cannot run is an
error, never skipped.

The compute tasks (forward, backward, the weight pass, recomputation; autograd across segments) are compute_tasks.py's
and the communication tasks comm_tasks.py's, mixins acting on the executor's state. The rank's parameters, Adam, ZeRO
(zero.py) and the gradient reductions are train_state.py's. Tensor parallelism: the stages hold the rank's slices
(tensor_parallel.py) and the schedule's role "tp" collectives run on h and its gradient (tp_tasks.py). The layout
(Schedule.stages) says which chunks hold the embedding and the head, and where a chunk hands its output to the next on
the same rank (DualPipeV's turn). ZeRO-3: the units' gathers and reduce-scatters are issued async and waited for by
the tasks that depend on them, and a unit is freed after its last compute task of a pass (sharded_params.py). Context
parallelism: the rank's chunks of each sequence, the attention running the ring tasks' K/V collectives, recorded as
those tasks' rows (context_parallel_attention.py).
Only piper_sim.torch_backend may import torch.
"""

from __future__ import annotations

import time

import torch
from torch import Tensor

from piper_sim.collectives.halo import HaloMachine
from piper_sim.errors import PiperError
from piper_sim.migration.controller import MigrationSpec
from piper_sim.schedule.ir import Schedule, Task
from piper_sim.workload.model import ModelSpec
from piper_sim.workload.parallel import TensorSplit
from piper_sim.workload.task_kinds import (
    BACKWARD_INPUT_KINDS,
    BACKWARD_KINDS,
    FORWARD_KINDS,
    P2P_KINDS,
    RECOMPUTE_KINDS,
    Role,
    TaskKind,
)

from .a2a_algorithms import prepare_groups
from .activations import ActivationMeter
from .comm_tasks import CommunicationTasks
from .compute_tasks import ComputeTasks
from .context_parallel_attention import ContextShard
from .groups import DEFAULT_GROUPS
from .layers import DeferredWeightGrads
from .migrate import ExpertMigration
from .p2p import Transfers
from .segments import MicroState, recomputed_ops
from .stage_modules import StageModule, State
from .tensor_parallel import TensorShard
from .tp_tasks import TP_KINDS, TensorParallelTasks
from .train_state import TrainState


class Executor(ComputeTasks, CommunicationTasks):
    """Runs the program of one rank. Built inside an initialized torch.distributed process."""

    def __init__(
        self,
        *,
        schedule: Schedule,
        model: ModelSpec,
        rank: int,
        node_of: dict[int, int],
        all_to_all_algorithm: str,
        batch_fn,
        micro_batch_size: int,
        seed: int = 0,
        lr: float = 1e-3,
        dtype: torch.dtype = torch.float32,
        migration: MigrationSpec | None = None,
        device: torch.device | str = "cpu",
        zero: int = 0,
        sp: bool = False,
        halo: HaloMachine | None = None,
        reshard_after_forward: bool = True,
    ) -> None:
        if schedule.vpp > 1 and schedule.pp == 1:
            raise PiperError("the torch backend runs vpp > 1 only with pp > 1 (chunks on one rank are not chained)")
        migrates = migration is not None and migration.active
        if zero and migrates:
            raise PiperError(
                "the torch backend does not run expert migration with optimizer.zero > 0 "
                "(migration moves whole Adam moments, ZeRO shards them)"
            )
        if migrates and schedule.mesh.tp > 1:
            raise PiperError("the torch backend does not run expert migration with parallel.tp > 1")
        self.schedule, self.model, self.rank = schedule, model, rank
        self.micro_batch_size = micro_batch_size
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"  # kernels are asynchronous: task ends wait for the device
        self.mesh = schedule.mesh
        self.coords = self.mesh.coords(rank)
        self.stage = self.mesh.stage_of(rank)
        self.node_of, self.algorithm, self.batch_fn = node_of, all_to_all_algorithm, batch_fn
        self.halo = halo  # the halo all-to-all's view of the machine (None: no NIC switch known, default slicing)
        self.program = schedule.program(rank)
        self.redo = recomputed_ops(self.program)  # chunk -> what its recompute tasks re-run
        # tensor parallelism (tensor_parallel.py, tp_tasks.py): the TP group first, the same order on its ranks
        tp_group = DEFAULT_GROUPS.get(self.mesh.group(rank, "tp")) if self.mesh.tp > 1 else None
        self.shard = TensorShard(tp=self.mesh.tp, index=self.coords["tp"], etp=self.mesh.etp, sp=sp, group=tp_group)
        self.tp = TensorParallelTasks(self.shard)
        self.split = TensorSplit(tp=self.mesh.tp, sp=sp, etp=self.mesh.etp, cp=self.mesh.cp)  # the rows' FLOPs
        # a split backward defers each linear's weight gradient to the W pass (layers.DeferredWeightGrads)
        DeferredWeightGrads.enabled = any(t.kind in BACKWARD_INPUT_KINDS for t in self.program)
        self.stages = schedule.stages  # the layout: which chunks start and end a pipeline (DualPipe: two of each)
        self.modules: list[StageModule] = []
        for c in range(schedule.vpp):
            v = schedule.virtual_stage(self.stage, c)
            self.modules.append(
                StageModule(
                    model,
                    schedule.stage_layers[v],
                    first=self.stages.is_first(v),
                    last=self.stages.is_last(v),
                    ep_rank=self.coords["ep"],
                    ep_size=self.mesh.ep,
                    seed=seed,
                    dtype=dtype,
                    device=self.device,
                    shard=self.shard,
                )
            )
        for c, ops in self.redo.items():  # selective recomputation: those layers keep only q, k, v of the core
            for op in ops:
                if op.startswith("attn_core:"):
                    self.modules[c].layers[op.partition(":")[2]].attn.selective = True
        self.context = None  # context parallelism (context_parallel_attention.py): the rank's chunks, CP group's K/V
        if self.mesh.cp > 1:
            self.context = ContextShard(
                self.mesh.cp, self.coords["cp"], DEFAULT_GROUPS.get(self.mesh.group(rank, "cp"))
            )
            for module in self.modules:
                for layer in module.layers.values():
                    layer.attn.context = self.context
        self.ring: list[Task] = []  # the ring tasks issued beside the attention task that runs their collectives
        self.dtype = dtype
        self.meter = ActivationMeter()
        self.train = TrainState(
            modules=self.modules,
            shard=self.shard,
            mesh=self.mesh,
            rank=rank,
            program=self.program,
            zero=zero,
            lr=lr,
            meter=self.meter,
            reshard_after_forward=reshard_after_forward,
        )
        self.fsdp = self.train.fsdp  # ZeRO-3 (sharded_params.py): units' gathers, frees, gradient reduce-scatters
        self.replicas = self.mesh.data_parallel  # micro-batch streams of a stage: one per TP group
        self.loss_scale = 1.0 / (schedule.num_microbatches * self.replicas)
        self._prepare_groups()
        self.routing_rows: list[tuple[int, int, int, int, list[int]]] = []  # (step, layer, mb, source, counts)
        self.records: list[dict] = []
        self.step_cpu_s: list[float] = []  # CPU of the main thread over each run_step (the tasks and between them)
        self.captured_grads: dict[str, Tensor] | None = None  # set to {} to keep step 0's reduced gradients
        self.captured_params: dict[str, Tensor] | None = None  # with captured_grads: parameters after step 0
        self.migration = ExpertMigration(self, migration) if migrates else None

    @property
    def peak_tensor_bytes(self) -> float:
        return self.meter.peak_bytes

    def skew_routers(self, expert_logit_bias) -> None:
        """Add a fixed bias to every router's logits (expert_logit_bias(layer) -> list of E floats)."""
        for module in self.modules:
            for index, layer in module.layers.items():
                if getattr(layer, "router", None) is not None:
                    layer.router.logit_bias = torch.tensor(
                        expert_logit_bias(int(index)), dtype=torch.float32, device=self.device
                    )

    def _prepare_groups(self) -> None:
        ep_group = self.mesh.group(self.rank, "ep")
        prepare_groups(ep_group, self.node_of)
        for axis in ("ep_dp", "dp", "stage"):
            group = self.mesh.group(self.rank, axis)
            if len(group) > 1:
                DEFAULT_GROUPS.get(group)

    # ---- one step ------------------------------------------------------------------------------
    def run_step(self, step: int, t0: float) -> float:
        """Execute the program once; returns the sum of this rank's scaled microbatch losses."""
        self.micro: dict[tuple[int, int], MicroState] = {}
        self.transfers = Transfers(self._finish_p2p)
        self.step, self.t0 = step, t0
        step_cpu = time.thread_time()
        loss_total = 0.0
        for task in self.program:
            for dep in task.deps:
                self.transfers.wait(dep)
            if self.fsdp:
                self.fsdp.before(task)
            start, cpu = time.perf_counter(), time.thread_time()
            flops, nbytes = self._run(task)
            # sends, receives and nonblocking collectives are recorded when they end; an all-to-all ends where it is
            # issued (an overlapped one too: the exchange runs to its end, which the contract allows an issued task)
            if not task.is_issued or task.kind == TaskKind.ALL_TO_ALL:
                if self.cuda:
                    torch.cuda.synchronize(self.device)
                self._record(task, start, time.perf_counter(), nbytes, flops, time.thread_time() - cpu)
            if self.fsdp:
                self.fsdp.after(task)
            if self.context is not None and not task.is_issued:
                self._ring_rows(task)
            self.transfers.poll()
        self.transfers.wait_all()
        self.step_cpu_s.append(time.thread_time() - step_cpu)
        if self.captured_grads is not None and step == 0:
            self.captured_params = self.train.named_parameters()
        for ms in self.micro.values():
            loss = ms.state.get("loss")
            if loss is not None:
                loss_total += float(loss.detach()) * self.loss_scale
        return loss_total / self.mesh.tp  # every rank of a TP group holds the loss of its micro-batches

    def _run(self, task: Task) -> tuple[float, float]:
        if task.kind in FORWARD_KINDS:
            return self._forward(task), 0.0
        if task.kind in BACKWARD_KINDS:
            return self._backward(task), 0.0
        if task.kind in RECOMPUTE_KINDS:
            return self._recompute(task), 0.0
        if task.kind == TaskKind.BACKWARD_WEIGHT:
            return self._weight_pass(task), 0.0
        if task.kind == TaskKind.ALL_TO_ALL and task.role == Role.MIGRATE and self.migration is not None:
            return 0.0, self.migration.run(self.step, self.routing_rows)
        if task.kind == TaskKind.ALL_TO_ALL and task.role in (Role.DISPATCH, Role.COMBINE):
            return 0.0, self._all_to_all(task)
        if task.kind in P2P_KINDS:
            self._post_p2p(task)
            return 0.0, 0.0
        if task.role == Role.CP:  # run by the attention task after it (context_parallel_attention.py), recorded then
            self.ring.append(task)
            return 0.0, 0.0
        if task.nonblocking and self.fsdp is not None:
            self._issue_fsdp(task)
            return 0.0, 0.0
        if task.role == Role.TP and task.kind in TP_KINDS:
            return 0.0, self._tp_task(task)
        if task.kind == TaskKind.ALL_REDUCE:
            return 0.0, self.train.all_reduce(task)
        if task.kind == TaskKind.OPTIMIZER:
            self._optimizer_step()
            return 0.0, 0.0
        if task.kind in (TaskKind.REDUCE_SCATTER, TaskKind.ALL_GATHER):
            return 0.0, self.train.sharded_collective(task)
        raise PiperError(f"the torch backend cannot run task {task.task_id} (kind {task.kind}, role {task.role})")

    def _optimizer_step(self) -> None:
        capture = self.captured_grads if self.captured_grads is not None and self.step == 0 else None
        self.train.step(capture)

    def _micro(self, task: Task) -> MicroState:
        key = (task.chunk, task.microbatch)
        ms = self.micro.get(key)
        if ms is None:
            v = self.schedule.virtual_stage(self.stage, task.chunk)
            # the micro-batch stream of the rank's TP and CP groups
            replica = self.rank % self.mesh.stage_size // (self.mesh.tp * self.mesh.cp)
            state: State = {}
            first, last = self.stages.is_first(v), self.stages.is_last(v)
            if first or last:
                tokens, targets = (t.to(self.device) for t in self.batch_fn(self.step, replica, task.microbatch))
                if self.context is not None:  # the rank's chunks of each sequence
                    tokens, targets = self.context.local(tokens), self.context.local(targets)
                if first:
                    state["tokens"] = tokens
                if last:
                    state["targets"] = targets
            before = self._local_neighbour(v, self.stages.previous(v))
            if before is not None:  # the previous virtual stage ran on this rank (the V layout's turn): its output
                state["h"] = self.micro[(before, task.microbatch)].state["h"]
            ms = self.micro[key] = MicroState(state=state)
        return ms

    def _local_neighbour(self, v: int, other: int | None) -> int | None:
        """The chunk of this rank that runs virtual stage `other` next to v, when it is on this rank."""
        if other is None:
            return None
        stage, chunk = self.stages.where(other)
        return chunk if stage == self.stage else None

    def _local_grad(self, task: Task, ms: MicroState) -> None:
        """A chunk's backward starts from the input gradient of the next virtual stage when that ran here."""
        if "h" not in ms.pending:
            v = self.schedule.virtual_stage(self.stage, task.chunk)
            after = self._local_neighbour(v, self.stages.next(v))
            if after is not None:
                ms.pending["h"] = self.micro[(after, task.microbatch)].pending.pop("h")

    # ---- records -------------------------------------------------------------------------------
    def _record(
        self, task: Task, start: float, end: float, nbytes: float, flops: float, cpu_s: float = float("nan")
    ) -> None:
        """One trace row; cpu_s is the CPU time of the rank's main thread during a blocking task (NaN for a
        send/recv, which runs in the background)."""
        peers = ""
        if task.kind in P2P_KINDS:
            peers = str(self.mesh.peer(self.rank, task.peer_stage))
        elif task.is_collective:
            group = self.mesh.group(self.rank, task.group_axis)
            peers = f"{task.group_axis}:{group[0]}+{len(group)}"
        self.records.append(
            {
                "step": self.step,
                "rank": self.rank,
                "task_id": task.task_id,
                "kind": task.kind,
                "stream": task.stream,
                "microbatch": task.microbatch,
                "chunk": task.chunk,
                "layer": task.layer,
                "role": task.role,
                "peers": peers,
                "start_s": start - self.t0,
                "end_s": end - self.t0,
                "bytes": nbytes,
                "flops": flops,
                "cpu_s": cpu_s,
            }
        )
