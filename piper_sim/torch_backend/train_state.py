"""A rank's training state in the torch executor: its parameters by gradient class, Adam, ZeRO's sharded groups,
and the tasks that act on them (the gradient all-reduces, ZeRO's reduce-scatter and all-gather, the optimizer step).

Owns TrainState. Parameters are taken in name order, so the gradient buffers line up across ranks even after
experts move (migrate.py rebuilds the state then, carrying every parameter's Adam moments over).
Only piper_sim.torch_backend may import torch.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn

from piper_sim.schedule.ir import Task
from piper_sim.workload.mesh import Mesh
from piper_sim.workload.task_kinds import TaskKind

from .activations import ActivationMeter
from .groups import DEFAULT_GROUPS
from .sharded_params import Fsdp
from .stage_modules import StageModule
from .tensor_parallel import PARAM_CLASSES, TensorShard
from .zero import ShardedGroup


class TrainState:
    def __init__(
        self,
        *,
        modules: list[StageModule],
        shard: TensorShard,
        mesh: Mesh,
        rank: int,
        program: tuple[Task, ...],
        zero: int,
        lr: float,
        meter: ActivationMeter,
        reshard_after_forward: bool = True,
    ) -> None:
        self.modules, self.shard, self.mesh, self.rank, self.program = modules, shard, mesh, rank, program
        self.zero, self.lr, self.meter = zero, lr, meter
        self.optimizer = torch.optim.Adam([torch.zeros(1, requires_grad=True)], lr=lr)
        self.pending_optimizer_state: dict = {}  # moved experts' Adam moments, for the next rebuild
        self.sharded: dict[str, ShardedGroup] = {}  # ZeRO: a parameter class (PARAM_CLASSES) -> its sharded group
        self.fsdp = (
            Fsdp(
                modules=modules,
                shard=shard,
                mesh=mesh,
                rank=rank,
                program=program,
                meter=meter,
                reshard_after_forward=reshard_after_forward,
            )
            if zero == 3
            else None
        )
        self.rebuild()

    def rebuild(self) -> None:
        """(Re)collect parameters in name order and carry every parameter's Adam state over."""
        named = sorted((n, p) for m in self.modules for n, p in m.named_parameters())
        # by the group that reduces their gradients (tensor_parallel.TensorShard.param_class)
        self.class_params = {kind: [p for n, p in named if self.shard.param_class(n) == kind] for kind in PARAM_CLASSES}
        self.class_params["mirror"] = [p for _, p in named]  # DualPipe: the counterpart holds the same names
        if self.zero in (1, 2) and not self.sharded:  # once (no migration with ZeRO): parameters become flat views
            self.sharded = self._shard(named)
        # by storage: autograd also saves views of the weights (linear keeps weight.t()), which are not activations
        # (ZeRO-3: a unit's gathered buffer is added while it is gathered, sharded_params.py)
        self.meter.param_storages = {p.untyped_storage().data_ptr() for _, p in named if p.untyped_storage().nbytes()}
        in_shards = {id(p) for group in self.sharded.values() for p in group.params}
        in_shards |= self.fsdp.params() if self.fsdp else set()
        whole = [p for _, p in named if id(p) not in in_shards]
        # parameters, their gradients and Adam's two moments: the training state of the rank
        self.meter.static_bytes = (
            4.0 * sum(p.numel() * p.element_size() for p in whole)
            + sum(group.state_bytes() for group in self.sharded.values())
            + (self.fsdp.state_bytes() if self.fsdp else 0.0)
        )
        trainable = whole + [group.shard for group in self.sharded.values()]
        trainable += self.fsdp.shards() if self.fsdp else []
        old = self.optimizer.state
        self.optimizer = torch.optim.Adam(trainable, lr=self.lr)
        for p in trainable:
            state = self.pending_optimizer_state.pop(p, None) or old.get(p)
            if state:
                self.optimizer.state[p] = state

    def _shard(self, named: list[tuple[str, nn.Parameter]]) -> dict[str, ShardedGroup]:
        """ZeRO: each parameter kind the schedule reduce-scatters, sharded over that task's group."""
        groups = {}
        for task in self.program:
            if task.kind != TaskKind.REDUCE_SCATTER:
                continue
            kind = task.role.removeprefix("grad_")
            members = [(n, p) for n, p in named if self.shard.param_class(n) == kind]
            if members:
                groups[kind] = ShardedGroup(members, self.mesh.group(self.rank, task.group_axis), stage=self.zero)
        return groups

    def named_parameters(self) -> dict[str, Tensor]:
        """Tests: every parameter of the rank as it is now (ZeRO-3: gathered from the shards)."""
        out = {
            n: p.detach().clone()
            for m in self.modules
            for n, p in m.named_parameters()
            if not self.fsdp or id(p) not in self.fsdp.params()
        }
        return {**out, **(self.fsdp.full_params() if self.fsdp else {})}

    def all_reduce(self, task: Task) -> float:
        """A gradient class summed over the task's group; bytes of the buffer."""
        params = self.class_params[task.role.removeprefix("grad_")]
        if not params:
            return 0.0
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=DEFAULT_GROUPS.get(self.mesh.group(self.rank, task.group_axis)))
        offset = 0
        for p in params:
            n = p.numel()
            p.grad = flat[offset : offset + n].view_as(p).clone()
            offset += n
        return float(flat.numel() * flat.element_size())

    def sharded_collective(self, task: Task) -> float:
        """ZeRO: a class's gradients reduce-scattered, or its updated shards all-gathered; bytes moved."""
        kind = task.role.removeprefix("grad_" if task.kind == TaskKind.REDUCE_SCATTER else "param_")
        group = self.sharded.get(kind)
        if group is None:
            return 0.0
        return group.reduce_scatter() if task.kind == TaskKind.REDUCE_SCATTER else group.all_gather()

    def step(self, captured_grads: dict[str, Tensor] | None) -> None:
        """Adam on what this rank updates (whole parameters, or its ZeRO shards); then no gradient is left.
        captured_grads: filled with the reduced gradients before the update (tests)."""
        if captured_grads is not None:
            captured_grads.update(
                {
                    n: p.grad.detach().clone()
                    for m in self.modules
                    for n, p in m.named_parameters()
                    if p.grad is not None
                }
            )
            for group in self.sharded.values():  # what the rank holds of them unreduced is replaced
                captured_grads.update(group.reduced_grads())
            if self.fsdp:
                captured_grads.update(self.fsdp.reduced_grads())
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        for group in self.sharded.values():  # ZeRO-1 kept the full (unreduced) gradients until now
            for p in group.params:
                p.grad = None
