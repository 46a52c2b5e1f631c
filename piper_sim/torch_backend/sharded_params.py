"""ZeRO-3 / FSDP in the torch executor: each unit's parameters held as the rank's shard, gathered by the schedule's
all-gather tasks, freed when the unit's pass has used them, and their gradients reduce-scattered (docs/sharding.md).

Owns FlatUnit (one unit's parameters of one class: a chunk's block with the embedding or the head it is gathered
with, workload/fsdp.py) and Fsdp (the rank's units and the schedule's ZeRO-3 tasks on them). As FSDP2 does, a unit's
parameters are views of one flat buffer padded to a multiple of its shard group; the rank keeps its slice of it
(the one parameter Adam steps), and the buffer's storage exists only while the unit is gathered:
- all_gather (role param_*, one per unit and class, nonblocking): the storage allocated, every member's shard
  gathered into it (dist.all_gather_into_tensor, async: the task that needs the unit waits for it);
- after the unit's last compute task of a pass (forward: with reshard_after_forward; backward, its recomputation
  included: always) the storage is freed (resized to 0, as FSDP2 frees the unsharded parameters); a compute task
  that finds its unit freed is an error;
- reduce_scatter (role grad_*, after the unit's backward, every micro-batch): the unit's gradients as one flat
  buffer, dist.reduce_scatter_tensor over the shard group (gloo runs it), the rank's part added to its shard's
  gradient; under HSDP the schedule's all_reduce (axis replicate) then sums that part over the shard's replicas.
The gathered buffer is written through a tensor of its own on the storage, so the version counters of the
parameters (which autograd saved in the forward) do not move when the backward re-gathers them.
Only piper_sim.torch_backend may import torch.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import Tensor, nn

from piper_sim.errors import PiperError
from piper_sim.schedule.ir import Task
from piper_sim.workload.fsdp import NO_BLOCK
from piper_sim.workload.mesh import Mesh
from piper_sim.workload.task_kinds import FORWARD_KINDS, RECOMPUTE_KINDS, Role, TaskKind

from .activations import ActivationMeter
from .groups import DEFAULT_GROUPS
from .stage_modules import StageModule
from .tensor_parallel import TensorShard
from .zero import flatten, views

UNIT_TASK = re.compile(r"^([FRB]):c(\d+):m(\d+):u(-?\d+):")
UNIT_KINDS = FORWARD_KINDS | RECOMPUTE_KINDS | {TaskKind.BACKWARD, TaskKind.BACKWARD_EXPERT}  # a unit's passes
# (the async work, what to do with its result once it has ended) or None when nothing moves
Issued = tuple[dist.Work, Callable[[], None]] | None


class FlatUnit:
    """One unit's parameters of one class over its shard group (module docstring)."""

    def __init__(
        self,
        named: list[tuple[str, nn.Parameter]],
        shard_ranks: tuple[int, ...],
        replicate_ranks: tuple[int, ...],
        meter: ActivationMeter,
    ) -> None:
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.meter = meter
        self.group = DEFAULT_GROUPS.get(shard_ranks) if len(shard_ranks) > 1 else None
        self.across = DEFAULT_GROUPS.get(replicate_ranks) if len(replicate_ranks) > 1 else None
        self.flat, self.shard_numel = flatten(self.params, len(shard_ranks))
        index = dist.get_rank(self.group) if self.group is not None else 0
        mine = self.flat[index * self.shard_numel : (index + 1) * self.shard_numel]
        # a shard group of one (HSDP with dp_shard 1) holds the unit whole: Adam steps the buffer itself
        self.shard = nn.Parameter(mine.clone() if self.group is not None else mine)
        self.pending: dict[int, Tensor] = {}  # micro-batch -> its reduce-scattered part, for the HSDP all-reduce
        self.gathered = self.group is None  # a sharded unit starts freed: the shards are what the rank holds
        if not self.gathered:
            self.flat.untyped_storage().resize_(0)

    @property
    def nbytes(self) -> int:
        return self.flat.numel() * self.flat.element_size()

    def _views(self, flat: Tensor) -> list[Tensor]:
        return views(self.params, flat)

    def gather(self) -> Issued:
        """Allocate the buffer and all-gather the shards into it."""
        if self.group is None:
            return None
        storage = self.flat.untyped_storage()
        if not self.gathered:
            storage.resize_(self.nbytes)
            self.meter.param_storages.add(storage.data_ptr())
            self.meter.account(float(self.nbytes))
            self.gathered = True
        into = torch.empty(0, dtype=self.flat.dtype, device=self.flat.device).set_(storage, 0, (self.flat.numel(),))
        work = dist.all_gather_into_tensor(into, self.shard.detach(), group=self.group, async_op=True)
        return work, lambda: None

    def free(self) -> None:
        """Drop the gathered parameters (the shard stays)."""
        if self.group is None or not self.gathered:
            return
        storage = self.flat.untyped_storage()
        self.meter.param_storages.discard(storage.data_ptr())
        storage.resize_(0)
        self.meter.account(-float(self.nbytes))
        self.gathered = False

    def _flat_grads(self) -> Tensor:
        """The unit's gradients of this micro-batch as one padded buffer; the parameters keep none."""
        grads = torch.zeros(self.flat.numel(), dtype=self.flat.dtype, device=self.flat.device)
        for p, view in zip(self.params, self._views(grads), strict=True):
            if p.grad is not None:
                view.copy_(p.grad)
                p.grad = None
        return grads

    def _add(self, part: Tensor) -> None:
        self.shard.grad = part if self.shard.grad is None else self.shard.grad + part

    def reduce_scatter(self, microbatch: int) -> Issued:
        """The gradients summed over the shard group, the rank's part kept (for the HSDP all-reduce, or added)."""
        grads = self._flat_grads()
        self.meter.account(float(grads.numel() * grads.element_size()))
        part = torch.empty(self.shard_numel, dtype=grads.dtype, device=grads.device)
        work = dist.reduce_scatter_tensor(part, grads, group=self.group, async_op=True)

        def done() -> None:
            self.meter.account(-float(grads.numel() * grads.element_size()))
            if self.across is not None:
                self.pending[microbatch] = part
            else:
                self._add(part)

        return work, done

    def all_reduce(self, microbatch: int) -> Issued:
        """HSDP: the rank's reduced part (or, with a shard group of one, the whole gradient) summed over the
        replicas of its shard."""
        part = self.pending.pop(microbatch) if self.group is not None else self._flat_grads()
        work = dist.all_reduce(part, group=self.across, async_op=True)
        return work, lambda: self._add(part)

    def full(self) -> dict[str, Tensor]:
        """Tests: every parameter of the unit as the shards make it now (gathered apart from the buffer)."""
        whole = torch.empty(self.flat.numel(), dtype=self.flat.dtype, device=self.flat.device)
        if self.group is None:
            whole.copy_(self.shard.detach())
        else:
            dist.all_gather_into_tensor(whole, self.shard.detach(), group=self.group)
        return {n: v.clone() for n, v in zip(self.names, self._views(whole), strict=True)}

    def reduced_grads(self) -> dict[str, Tensor]:
        """Tests: the reduced gradient of every parameter, gathered from the shards' gradients."""
        grad = self.shard.grad if self.shard.grad is not None else torch.zeros_like(self.shard)
        whole = torch.empty(self.flat.numel(), dtype=grad.dtype, device=grad.device)
        if self.group is None:
            whole.copy_(grad)
        else:
            dist.all_gather_into_tensor(whole, grad.detach().contiguous(), group=self.group)
        return {n: v.clone() for n, v in zip(self.names, self._views(whole), strict=True)}

    def state_bytes(self) -> float:
        """The shard, its reduced gradient and Adam's two moments of it."""
        return 4.0 * self.shard_numel * self.flat.element_size()


def unit_of_param(name: str, layers: tuple[int, ...]) -> int:
    """The unit a chunk's parameter is gathered with (workload/fsdp.unit_of_op's rule for its op)."""
    if name.startswith("layers."):
        return int(name.split(".")[1])
    if not layers:
        return NO_BLOCK
    return layers[0] if name.startswith("embed.") else layers[-1]


class Fsdp:
    """A rank's ZeRO-3 units and the schedule's tasks on them."""

    def __init__(
        self,
        *,
        modules: list[StageModule],
        shard: TensorShard,
        mesh: Mesh,
        rank: int,
        program: tuple[Task, ...],
        meter: ActivationMeter,
        reshard_after_forward: bool,
    ) -> None:
        self.reshard_after_forward = reshard_after_forward
        axes: dict[tuple[int, int, str], dict[str, str]] = {}  # (chunk, unit, class) -> {"shard": axis, ...}
        for task in program:
            if task.nonblocking and task.role != Role.CP:
                key = (task.chunk, task.layer, task.role.partition("_")[2])
                axes.setdefault(key, {})["replicate" if task.kind == TaskKind.ALL_REDUCE else "shard"] = task.group_axis
        members: dict[tuple[int, int, str], list[tuple[str, nn.Parameter]]] = {}
        for c, module in enumerate(modules):
            for name, p in sorted(module.named_parameters()):
                key = (c, unit_of_param(name, module.layer_indices), shard.param_class(name))
                if key in axes:
                    members.setdefault(key, []).append((name, p))
        missing = sorted(set(axes) - set(members))
        if missing:
            raise PiperError(f"ZeRO-3 tasks for units this rank holds no parameters of: {missing[:3]}")
        self.units: dict[tuple[int, int, str], FlatUnit] = {}
        for key in sorted(members):
            where = axes[key]
            self.units[key] = FlatUnit(
                members[key],
                mesh.group(rank, where["shard"]) if "shard" in where else (rank,),
                mesh.group(rank, where["replicate"]) if "replicate" in where else (rank,),
                meter,
            )
        # the last compute task of each unit in each pass: the unit is freed after it
        last: dict[tuple[str, int, int, int], str] = {}
        self.unit_of: dict[str, tuple[str, int, int]] = {}  # compute task -> (pass, chunk, unit)
        for task in program:
            match = UNIT_TASK.match(task.task_id)
            if match and task.kind in UNIT_KINDS:
                pass_ = "F" if match[1] == "F" else "B"
                c, m, u = int(match[2]), int(match[3]), int(match[4])
                last[(pass_, c, m, u)] = task.task_id
                self.unit_of[task.task_id] = (pass_, c, u)
        self.frees = frozenset(last.values())

    def params(self) -> set[int]:
        return {id(p) for unit in self.units.values() for p in unit.params}

    def shards(self) -> list[nn.Parameter]:
        return [unit.shard for unit in self.units.values()]

    def state_bytes(self) -> float:
        return sum(unit.state_bytes() for unit in self.units.values())

    def _of(self, chunk: int, unit: int) -> list[FlatUnit]:
        return [u for (c, layer, _), u in self.units.items() if (c, layer) == (chunk, unit)]

    def issue(self, task: Task) -> tuple[Issued, float]:
        """A ZeRO-3 collective of the schedule, issued; the bytes it moves."""
        unit = self.units.get((task.chunk, task.layer, task.role.partition("_")[2]))
        if unit is None:
            raise PiperError(f"task {task.task_id}: no ZeRO-3 unit for it on this rank")
        if task.kind == TaskKind.ALL_GATHER:
            return unit.gather(), float(unit.nbytes)
        if task.kind == TaskKind.REDUCE_SCATTER:
            return unit.reduce_scatter(task.microbatch), float(unit.nbytes)
        return unit.all_reduce(task.microbatch), float(unit.shard_numel * unit.flat.element_size())

    def before(self, task: Task) -> None:
        """A compute task of a unit finds its parameters gathered."""
        where = self.unit_of.get(task.task_id)
        if where is not None and not all(u.gathered for u in self._of(*where[1:])):
            raise PiperError(f"task {task.task_id}: its unit's parameters are not gathered (ZeRO-3)")

    def after(self, task: Task) -> None:
        """The unit's last compute task of a pass frees its parameters (forward: with reshard_after_forward)."""
        if task.task_id in self.frees:
            pass_, c, u = self.unit_of[task.task_id]
            if pass_ == "B" or self.reshard_after_forward:
                for unit in self._of(c, u):
                    unit.free()

    def reduced_grads(self) -> dict[str, Tensor]:
        return {n: g for unit in self.units.values() for n, g in unit.reduced_grads().items()}

    def full_params(self) -> dict[str, Tensor]:
        return {n: p for unit in self.units.values() for n, p in unit.full().items()}
