"""The communicators a plan opens, counted from its ParallelSpec, model and schedule without building the schedule.

Owns the rule (docs/planning.md, the fit paragraph): one communicator per distinct process-group kind with more
than one rank that the lowered schedule (lower.py) runs a collective or a transfer on:
- "tp": the tensor-parallel group (tp > 1: the split layers' all-reduces, all-gathers, reduce-scatters);
- "pp": the pipeline's point-to-point transfers (pp > 1);
- "ep": the expert-parallel all-to-alls (a model with MoE layers, ep > 1; expert migration runs on it too);
- "ep_dp": the dense parameters' gradient group (the replicas of a tensor-parallel shard, more than one);
- "dp": the routed experts' gradient group, expert-data-parallel (a model with MoE layers, dp > 1);
- "stage": the gradients of the parameters every rank of a stage holds whole (norms, router) when tp > 1;
- "mirror": DualPipe's two copies of the same layers (the bidirectional layout, pp > 1).
ZeRO's reduce-scatters and all-gathers (any stage) run on the same groups as the all-reduces they replace, so the
stage does not change the count. Two kinds whose ranks happen to coincide (ep_dp and dp with ep 1) are two
process groups, hence two communicators, as Megatron-core creates its data- and expert-data-parallel groups apart.
The world group a launcher may open for a barrier is not counted. Pure data: loads no simpy, numpy or torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from piper_sim.schedule.generator_registry import schedule_layout
from piper_sim.schedule.ir import Layout
from piper_sim.workload.memory import reserve_bytes
from piper_sim.workload.model import ModelSpec
from piper_sim.workload.parallel import ParallelSpec

if TYPE_CHECKING:
    from piper_sim.config import Config
    from piper_sim.workload.profile import DeviceProfile

COMMUNICATOR_KINDS = ("tp", "pp", "ep", "ep_dp", "dp", "stage", "mirror")


def communicator_kinds(parallel: ParallelSpec, model: ModelSpec, schedule: str) -> tuple[str, ...]:
    """The process-group kinds (COMMUNICATOR_KINDS) with more than one rank the plan's lowered schedule uses."""
    mesh = parallel.mesh
    moe = bool(model.moe_layer_indices) and model.num_experts > 1
    used = {
        "tp": mesh.tp > 1,
        "pp": mesh.pp > 1,
        "ep": moe and mesh.ep > 1,
        "ep_dp": mesh.data_parallel > 1,
        "dp": moe and mesh.dp > 1,
        "stage": mesh.tp > 1,
        "mirror": mesh.pp > 1 and schedule_layout(schedule) == Layout.BIDIRECTIONAL,
    }
    return tuple(kind for kind in COMMUNICATOR_KINDS if used[kind])


def plan_reserve_bytes(
    profile: DeviceProfile, given_bytes: float | None, parallel: ParallelSpec, model: ModelSpec, schedule: str
) -> float:
    """The framework reserve of one device under this plan (memory.reserve_bytes with the plan's communicators)."""
    return reserve_bytes(profile, given_bytes, communicators=len(communicator_kinds(parallel, model, schedule)))


def config_reserve_bytes(cfg: Config, profile: DeviceProfile) -> float:
    """The framework reserve of one device under a config: its own (cost.framework_reserve_GiB), else its
    profile's for the communicators its plan opens."""
    return plan_reserve_bytes(profile, cfg.framework_reserve_bytes, cfg.parallel, cfg.model, cfg.schedule)
