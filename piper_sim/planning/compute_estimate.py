"""The estimator's compute: a chunk's passes priced with the simulator's own cost functions, no event loop.

Owns ComputePricer, the base of planning.estimate.Estimator: TaskCoster.cost on the ops of each chunk
(schedule.lower_segments.chunk_segments), expert rows from the routing model and the contiguous expert placement
exactly as the engine takes them (balanced routing); the tensor-parallel collectives and the context-parallel K/V
ring that block the compute stream are priced in (CollectivePricer, planning/context_parallel_estimate.py), and so
is what activation recomputation re-runs before a backward. Pure: no simpy, torch.
"""

from __future__ import annotations

import functools

from piper_sim.migration.expert_placement import contiguous_owners, dispatch
from piper_sim.planning.collective_estimate import CollectivePricer
from piper_sim.planning.context_parallel_estimate import ring_overlap_s
from piper_sim.routing.models import routing_from_config
from piper_sim.schedule.lower_segments import chunk_segments, selective_segments
from piper_sim.workload.cost import TaskCoster
from piper_sim.workload.ops import parse_op
from piper_sim.workload.parallel import NO_SPLIT, TensorSplit
from piper_sim.workload.recompute import DEFAULT_SELECTIVE_MODULES, Recompute
from piper_sim.workload.task_kinds import Role, TaskKind

K = TaskKind


class ComputePricer(CollectivePricer):
    """Prices the compute of plans' chunks of one model with one device profile (a TaskCoster per micro-batch size
    and split), on the topology its collectives run on (CollectivePricer)."""

    def __init__(
        self,
        *args,
        flash_attention: bool = True,
        recompute_modules: tuple[str, ...] = DEFAULT_SELECTIVE_MODULES,
        **kwargs,
    ) -> None:
        """CollectivePricer's arguments (model, topology, placement, profile, collectives_all_reduce), and how the
        compute is priced: flash attention, and the modules selective recomputation re-runs."""
        super().__init__(*args, **kwargs)
        self.flash = flash_attention
        self.recompute_modules = recompute_modules  # what selective recomputation re-runs (workload/recompute.py)
        self._costers: dict[int, TaskCoster] = {}

    def coster(self, tokens: int, split: TensorSplit = NO_SPLIT) -> TaskCoster:
        if (tokens, split) not in self._costers:
            self._costers[(tokens, split)] = TaskCoster(self.model, self.profile, tokens, split, self.flash)
        return self._costers[(tokens, split)]

    def _chunk(
        self,
        coster: TaskCoster,
        ep: int,
        layers: tuple[int, ...],
        first: bool,
        last: bool,
        zb: bool,
        terms: dict[str, float] | None = None,
        pieces: tuple[list[float], list[float]] | None = None,
    ) -> tuple[float, float, float, float, int]:
        """(forward s, backward s (input pass for ZB), weight pass s, FLOPs, MoE layers) of one microbatch; with
        `terms`, its compute by cost term (workload.cost.COST_TERMS) and its TP collectives ("tp_comm") added there;
        with `pieces`, the forward's and the backward's seconds between their all-to-alls appended there (in the
        forward's order: the backward runs them last first)."""
        f = b = w = flops = 0.0
        moe = 0
        if pieces is not None:
            pieces[0].append(0.0)
            pieces[1].append(0.0)
        for seg in chunk_segments(self.model, layers, first=first, last=last, split=coster.split):
            if seg.tp != ("", ""):  # a tensor-parallel collective blocks the compute stream
                forward, backward = (self._tp_s(kind, coster) for kind in seg.tp)
                f, b = f + forward, b + backward
                if pieces is not None:
                    pieces[0][-1] += forward
                    pieces[1][-1] += backward
                if terms is not None:
                    terms["tp_comm"] = terms.get("tp_comm", 0.0) + forward + backward
                continue
            if seg.role:
                moe += seg.role == Role.DISPATCH
                if pieces is not None:
                    pieces[0].append(0.0)
                    pieces[1].append(0.0)
                continue
            rows = self._expert_rows(ep, seg.ops[0], _routed(coster)) if seg.expert else ()
            kinds = (
                K.FORWARD_EXPERT if seg.expert else K.FORWARD,
                *(
                    (K.BACKWARD_EXPERT_INPUT if seg.expert else K.BACKWARD_INPUT, K.BACKWARD_WEIGHT)
                    if zb
                    else (K.BACKWARD_EXPERT if seg.expert else K.BACKWARD,)
                ),
            )
            fs, ff = coster.cost(kinds[0], seg.ops, rows)
            bs, bf = coster.cost(kinds[1], seg.ops, rows)
            ws, wf = coster.cost(kinds[2], seg.ops, rows) if zb else (0.0, 0.0)
            if seg.ring:  # the attention's K/V ring beside it (planning/context_parallel_estimate.py)
                ring = ring_overlap_s(self, coster, fs, True) - fs, ring_overlap_s(self, coster, bs, False) - bs
                fs, bs = fs + ring[0], bs + ring[1]
                if terms is not None:
                    terms["cp_comm"] = terms.get("cp_comm", 0.0) + sum(ring)
            f, b, w, flops = f + fs, b + bs, w + ws, flops + ff + bf + wf
            if pieces is not None:
                pieces[0][-1] += fs
                pieces[1][-1] += bs
            for kind in kinds if terms is not None else ():
                for term, value in coster.cost_terms(kind, seg.ops, rows).items():
                    terms[term] = terms.get(term, 0.0) + value
        return f, b, w, flops, moe

    def _recompute(
        self, coster: TaskCoster, ep: int, layers: tuple[int, ...], first: bool, recompute: str
    ) -> tuple[float, int]:
        """(seconds, MoE layers whose all-to-alls run again) of what a chunk re-runs before its backward: full,
        the forward of its layers; selective, its layers' recompute modules (as schedule.lower emits them)."""
        if recompute == Recompute.SELECTIVE:
            segments = selective_segments(self.model, layers, self.recompute_modules)
        elif recompute == Recompute.FULL:
            segments = chunk_segments(self.model, layers, first=first, last=False, split=coster.split)
        else:
            return 0.0, 0
        seconds, moe = 0.0, 0
        for seg in segments:
            if seg.tp != ("", ""):
                seconds += self._tp_s(seg.tp[0], coster)
                continue
            if seg.role:
                moe += seg.role == Role.DISPATCH
                continue
            rows = self._expert_rows(ep, seg.ops[0], _routed(coster)) if seg.expert else ()
            redo = coster.cost(K.RECOMPUTE_EXPERT if seg.expert else K.RECOMPUTE, seg.ops, rows)[0]
            seconds += ring_overlap_s(self, coster, redo, True) if seg.ring else redo
        return seconds, moe

    def _expert_rows(self, ep: int, op: str, tokens: int) -> tuple[int, ...]:
        """Rows each local expert of EP rank 0 gets under balanced routing (as the engine dispatches)."""
        return _rows_cached(self.model.num_experts, self.model.top_k, ep, parse_op(op).layer, tokens)


@functools.lru_cache(maxsize=4096)
def _rows_cached(num_experts: int, top_k: int, ep: int, layer: int, tokens: int) -> tuple[int, ...]:
    """Rows each local expert of EP rank 0 gets under balanced routing, as the engine dispatches them."""
    routed = routing_from_config({"kind": "uniform"}, num_experts, top_k, 0).route(0, layer, 0, 0, ep, tokens)
    return tuple(int(r) for r in dispatch(routed.kept, contiguous_owners(num_experts, ep), ep).expert_rows[0])


def _routed(coster: TaskCoster) -> int:
    """Tokens of a micro-batch one rank routes (all, or its 1/tp slice when etp is 1)."""
    return int(coster.tokens * coster.split.dispatch_share)
