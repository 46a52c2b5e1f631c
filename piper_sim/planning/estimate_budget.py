"""An error budget's estimate side: the estimator's step of a plan split into the terms that make it.

Owns estimate_budget(). The estimator's step is the pipeline (the busiest stage's own work over the micro-batches,
plus the bubble), what the activations' p2p transfers add to it, the gradient reductions and the optimizer
(planning/estimate.py). The busiest stage's work is split further: its compute by cost term (workload.cost.
COST_TERMS: GEMMs, attention, memory-bound kernels, launches, the stack's measured fixed costs), the recomputation
before its backward, its tensor-parallel collectives (tp_comm), the part of its context-parallel K/V rings the
attention does not hide (cp_comm), its MoE all-to-alls (ep_comm) and, under ZeRO-2,
the reduce-scatter of each chunk's gradients (dp_comm). The terms sum to the estimate's step time. Pure: no simpy,
torch.
"""

from __future__ import annotations

from piper_sim.planning.estimate import SPLIT_BACKWARD, Estimate, Estimator
from piper_sim.planning.plan_point import PlanPoint
from piper_sim.schedule.build import split_layers
from piper_sim.schedule.generator_registry import schedule_layout
from piper_sim.schedule.ir import VirtualStages
from piper_sim.workload.cost import COST_TERMS

ESTIMATE_TERMS = (
    *COST_TERMS,
    "recomputation",
    "tp_comm",
    "cp_comm",
    "ep_comm",
    "bubble",
    "pp_comm",
    "dp_comm",
    "optimizer",
)


def estimate_budget(estimator: Estimator, point: PlanPoint) -> tuple[Estimate, dict[str, float]]:
    """(the plan's estimate, seconds per step of each ESTIMATE_TERMS; with "stage": the busiest stage)."""
    estimate = estimator.estimate(point)
    m = estimator.model
    tokens = point.parallel.tokens_per_microbatch(m.seq_len)
    coster = estimator.coster(tokens, point.parallel.split)
    stages = VirtualStages(schedule_layout(point.schedule), point.pp, point.vpp)
    layers = split_layers(m.num_layers, stages)
    a2a = estimator._all_to_all_s(point, tokens)
    zb = point.schedule in SPLIT_BACKWARD
    best: tuple[float, int, dict[str, float]] | None = None
    for p in range(point.pp):
        terms = dict.fromkeys(ESTIMATE_TERMS, 0.0)
        for c in range(point.vpp):
            v = stages.of(p, c)
            first, last = stages.is_first(v), stages.is_last(v)
            *_, moe = estimator._chunk(coster, point.ep, layers[v], first, last, zb, terms)
            redo_s, redo_moe = estimator._recompute(coster, point.ep, layers[v], first, point.recompute)
            terms["recomputation"] += redo_s
            if point.zero == 2:
                terms["dp_comm"] += estimator._bucket_s(point, layers, p, v)
            if point.zero == 3:  # the unit gathers prefetch does not hide
                terms["dp_comm"] += sum(estimator._fsdp_s(point, layers, p, v, a2a))
            terms["ep_comm"] += (4 * moe + 2 * redo_moe) * a2a
        scale = point.num_microbatches / stages.num_pipelines
        terms = {k: v * scale for k, v in terms.items()}
        work = sum(terms.values())
        if best is None or work > best[0]:
            best = (work, p, terms)
    _, stage, terms = best
    terms["bubble"] = (
        estimate.step_time_s - sum(terms.values()) - estimate.p2p_s - estimate.grad_reduce_s - estimate.optimizer_s
    )
    terms["pp_comm"] = estimate.p2p_s
    terms["dp_comm"] += estimate.grad_reduce_s
    terms["optimizer"] = estimate.optimizer_s
    return estimate, {"stage": stage, **terms}
