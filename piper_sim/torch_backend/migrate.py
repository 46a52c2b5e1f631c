"""Expert migration on real ranks: decide with the same policy as the simulator, move expert state.

Owns the `migrate` task of the torch backend: the step's routed rows per expert are summed over the
stage's EP groups (one all-reduce), the Migrator (piper_sim.migration, the simulator's policy code)
decides the same moves on every rank, and each moved expert's weights, gradients and Adam state
(exp_avg, exp_avg_sq, step) go from its old to its new owner by point-to-point messages. The
expert -> rank map of the stage modules and the optimizer follow. The model computes the same
function before and after. Only piper_sim.torch_backend may import torch.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn

from piper_sim.migration.controller import MigrationSpec, Migrator
from piper_sim.migration.expert_placement import ExpertPlacement
from piper_sim.migration.moved_bytes import expert_state_bytes

from .groups import DEFAULT_GROUPS
from .layers import FFN

SLOTS = ("w1", "w2", "w3")


class ExpertMigration:
    def __init__(self, executor, spec: MigrationSpec) -> None:
        self.ex = executor
        model, mesh = executor.model, executor.mesh
        layers = sorted(layer for m in executor.modules for layer in m.owners)
        self.migrator = Migrator(
            spec,
            ExpertPlacement.contiguous(layers, model.num_experts, mesh.ep),
            expert_state_bytes(model, spec.state_bytes_per_param),
        )
        self.group = mesh.group(executor.rank, "ep")
        self.stage_group = mesh.group(executor.rank, "ep_dp")

    def run(self, step: int, routing_rows: list) -> float:
        """The migrate task: returns the bytes this rank sent."""
        loads = self._loads(step, routing_rows)
        for layer, rows in loads.items():
            self.migrator.observe(layer, rows)
        event = self.migrator.end_of_step(step)
        if not event.moves:
            return 0.0
        sent = self._move(event.moves)
        for module in self.ex.modules:
            for layer in module.owners:
                module.owners[layer] = torch.as_tensor(event.placement.owners(layer), dtype=torch.int64)
        self.ex.train.rebuild()
        return sent

    def _loads(self, step: int, routing_rows: list) -> dict[int, np.ndarray]:
        layers = self.migrator.placement.layers
        mine = torch.zeros(len(layers), self.ex.model.num_experts, dtype=torch.float64, device=self.ex.device)
        index = {layer: i for i, layer in enumerate(layers)}
        for s, layer, _mb, _source, counts in routing_rows:
            if s == step and layer in index:
                mine[index[layer]] += torch.tensor(counts, dtype=torch.float64, device=self.ex.device)
        if len(self.stage_group) > 1:
            dist.all_reduce(mine, group=DEFAULT_GROUPS.get(self.stage_group))
        return {layer: mine[i].cpu().numpy() for layer, i in index.items()}

    def _holder(self, layer: int) -> nn.ModuleDict:
        for module in self.ex.modules:
            if str(layer) in module.layers:
                return module.layers[str(layer)].experts
        raise KeyError(layer)

    def _move(self, moves) -> float:
        me = self.group.index(self.ex.rank)
        ops, incoming, sent = [], [], 0.0
        for move in moves:
            experts = self._holder(move.layer)
            if move.src == me:
                for tensor in self._state_tensors(experts[str(move.expert)]):
                    ops.append(dist.P2POp(dist.isend, tensor, self.group[move.dst]))
                    sent += tensor.numel() * tensor.element_size()
            elif move.dst == me:
                template = self._template()
                buffers = [torch.empty_like(t) for t in self._state_tensors(template)]
                ops += [dist.P2POp(dist.irecv, b, self.group[move.src]) for b in buffers]
                incoming.append((move, template, buffers))
        for work in dist.batch_isend_irecv(ops) if ops else []:
            work.wait()
        for move in moves:
            if move.src == me:
                del self._holder(move.layer)[str(move.expert)]
        for move, template, buffers in incoming:
            self._install(template, buffers)
            self._holder(move.layer)[str(move.expert)] = template
        return sent

    def _template(self) -> FFN:
        m = self.ex.model
        return FFN(m.d_model, m.expert_ffn_dim, m.expert_matrices, device=self.ex.device, dtype=self.ex.dtype)

    def _state_tensors(self, expert: FFN) -> list[Tensor]:
        """Weights, gradients (zeros when none) and Adam state of one expert, in a fixed order."""
        out = []
        for name in SLOTS:
            p = getattr(expert, name)
            if p is None:
                continue
            state = self.ex.train.optimizer.state.get(p, {})
            out += [
                p.data,
                p.grad if p.grad is not None else torch.zeros_like(p),
                state.get("exp_avg", torch.zeros_like(p)),
                state.get("exp_avg_sq", torch.zeros_like(p)),
                torch.as_tensor(state.get("step", torch.zeros(())), dtype=torch.float32, device=p.device).reshape(1),
            ]
        return [t.contiguous() for t in out]

    def _install(self, expert: FFN, buffers: list[Tensor]) -> None:
        it = iter(buffers)
        for name in SLOTS:
            p = getattr(expert, name)
            if p is None:
                continue
            data, grad, exp_avg, exp_avg_sq, step = (next(it) for _ in range(5))
            p.data.copy_(data)
            p.grad = grad if grad.abs().sum() > 0 else None
            if step.item() > 0:
                self.ex.train.pending_optimizer_state[p] = {
                    "step": step.reshape(()),
                    "exp_avg": exp_avg,
                    "exp_avg_sq": exp_avg_sq,
                }
