"""ParallelSpec: the parallel plan (pp x dp x ep x tp mesh, virtual stages, microbatches).

Owns plan validation against a model and a GPU count, and the mesh it lays out (mesh.py). Pure data;
must not import piper_sim.schedule.
"""

from __future__ import annotations

from dataclasses import dataclass

from piper_sim.errors import ConfigError
from piper_sim.workload.mesh import Mesh
from piper_sim.workload.model import ModelSpec


@dataclass(frozen=True, kw_only=True)
class ParallelSpec:
    pp: int = 1
    ep: int = 1
    dp: int = 1
    tp: int = 1
    vpp: int = 1
    num_microbatches: int = 1
    micro_batch_size: int = 1
    world_size: int = 0  # when given, must equal pp * ep * dp * tp

    def __post_init__(self) -> None:
        for key in ("pp", "ep", "dp", "tp", "vpp", "num_microbatches", "micro_batch_size"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"parallel.{key}", value, "a positive integer")
        product = self.pp * self.ep * self.dp * self.tp
        if self.world_size and self.world_size != product:
            raise ConfigError("parallel.world_size", self.world_size,
                              f"pp*ep*dp*tp = {self.pp}*{self.ep}*{self.dp}*{self.tp} = {product}")

    @property
    def num_gpus(self) -> int:
        return self.pp * self.ep * self.dp * self.tp

    @property
    def mesh(self) -> Mesh:
        return Mesh(pp=self.pp, dp=self.dp, ep=self.ep, tp=self.tp)

    @property
    def sequences_per_step(self) -> int:
        """Global batch in sequences: every (dp, ep) rank of a stage feeds its own micro-batches."""
        return self.micro_batch_size * self.num_microbatches * self.dp * self.ep

    def validate(self, model: ModelSpec, num_gpus: int | None = None) -> None:
        """Raise ConfigError naming the key when the plan cannot run this model."""
        if num_gpus is not None and self.num_gpus != num_gpus:
            raise ConfigError("parallel", f"pp*ep*dp*tp = {self.num_gpus}", f"equal to the GPU count ({num_gpus})")
        if model.num_experts % self.ep:
            raise ConfigError("parallel.ep", self.ep, f"a divisor of model.num_experts ({model.num_experts})")
        if self.pp * self.vpp > model.num_layers:
            raise ConfigError("parallel.pp", self.pp,
                              f"pp * vpp <= model.num_layers ({model.num_layers}); vpp is {self.vpp}")
        if self.tp > 1:
            raise ConfigError("parallel.tp", self.tp,
                              "1 (tensor parallelism is described in the plan but not yet lowered)")


def stage_layer_split(num_layers: int, num_virtual_stages: int) -> tuple[tuple[int, ...], ...]:
    """Contiguous layer ranges per virtual stage, as even as possible (earlier stages get the extra)."""
    base, extra = divmod(num_layers, num_virtual_stages)
    out, start = [], 0
    for v in range(num_virtual_stages):
        size = base + (1 if v < extra else 0)
        out.append(tuple(range(start, start + size)))
        start += size
    return tuple(out)
