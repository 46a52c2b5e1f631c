"""The estimator's communication: a plan's collectives priced on the topology, no event loop.

Owns CollectivePricer, the base of planning.estimate.Estimator: the same collective algorithms as the simulator
(collectives registries) on the same topology routes; each phase pays the engine's delay (network.phase_run.
phase_delay_s) plus its flows' time on the busiest link (bytes on the link / its capacity), phases chained by their
`after`; the data-parallel reductions and ZeRO's collectives run with their sibling groups' flows (every rank of a stage
runs them at once: _siblings), the MoE all-to-all with every EP group of the stage, the pipeline's hop with every rank
of the stage's, the tensor-parallel collectives alone (a lower bound: the
simulator adds contention between concurrent phases and max-min sharing). Prices the tensor-parallel collectives, the
MoE all-to-all, the pipeline's p2p hop, the data-parallel reductions and the sharded collectives of ZeRO (or DeepSpeed's
bucket all-reduces in their place), over the replica groups of a stage's parameters; results are memoized (plans share
stages, groups and messages). Pure: no simpy, torch.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from piper_sim.collectives.algorithms import ALL_REDUCE, ALL_TO_ALL, Fanout, Phase, bind_fanout
from piper_sim.collectives.sharded import ALL_GATHER, REDUCE_SCATTER
from piper_sim.network import phase_delay_s
from piper_sim.planning.plan_point import PlanPoint
from piper_sim.topology.graph import Topology
from piper_sim.workload.cost import TaskCoster
from piper_sim.workload.deepspeed_zero import DEEPSPEED, DEFAULT_GRADIENT_REDUCE
from piper_sim.workload.model import ModelSpec
from piper_sim.workload.profile import DeviceProfile
from piper_sim.workload.task_kinds import TaskKind

K = TaskKind


class CollectivePricer:
    """Prices the collectives of plans of one model on one topology (built for all the plans' GPUs) with one device
    profile, and memoizes what plans share (_cached)."""

    def __init__(
        self,
        model: ModelSpec,
        topology: Topology,
        placement: list[str],
        profile: DeviceProfile,
        *,
        collectives_all_reduce: str = "ring",
        gradient_reduce: str = DEFAULT_GRADIENT_REDUCE,
        adjacent_experts: bool = False,
    ) -> None:
        self.model, self.topo, self.gpus, self.profile = model, topology, placement, profile
        self.all_reduce = collectives_all_reduce
        self.gradient_reduce = gradient_reduce  # ZeRO-1/2: optimizer.gradient_reduce (workload/deepspeed_zero.py)
        self.adjacent_experts = adjacent_experts  # a round-robin gate's adjacent experts (routing.kind round_robin)
        self._memo: dict[tuple, object] = {}  # (what, key) -> value: plans share stages, groups and messages

    def _cached(self, key: tuple, compute):
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def _tp_s(self, kind: str, coster: TaskCoster) -> float:
        """One tensor-parallel collective ("" for none) of a micro-batch's activations in the first TP group."""
        if not kind:
            return 0.0
        split = coster.split
        size = coster.tokens * self.model.d_model * self.model.dtype_bytes
        registry = {K.ALL_REDUCE: ALL_REDUCE, K.REDUCE_SCATTER: REDUCE_SCATTER, K.ALL_GATHER: ALL_GATHER}[kind]
        gpus = tuple(self.gpus[: split.tp])
        return self._cached(
            ("tp", kind, split.tp, size),
            lambda: self.phases_s(
                registry.get(self.all_reduce, "collectives.all_reduce")(size, list(gpus), self.topo), gpus
            ),
        )

    def _all_to_all_s(self, point: PlanPoint, tokens: int) -> float:
        """One dispatch (or combine) of one microbatch in the first stage's EP groups at once (the first EP x ETP
        ranks, every ETP-th, and its translations over the stage: every rank of a stage dispatches the same layer
        at the same moment, so the groups' flows share the switch and global links they cross)."""
        if point.ep == 1:
            return 0.0
        routed = tokens * point.parallel.split.dispatch_share
        per_pair = routed * self.model.top_k / point.ep * self.model.d_model * self.model.dtype_bytes
        matrix = np.full((point.ep, point.ep), per_pair)  # the diagonal (rows that stay) moves nothing
        span = point.ep * point.etp
        groups = [
            tuple(self.gpus[start + o : start + span : point.etp])
            for start in range(0, point.num_gpus // point.pp, span)
            for o in range(point.etp)
        ]
        hosts = [{self.topo.host_of(g) for g in group} for group in groups]
        if all(len(h) == 1 for h in hosts) and len(set().union(*hosts)) == len(groups):
            groups = groups[:1]  # each group inside a node of its own: they share no link, and nodes are alike
        fanout = Fanout(self.model.top_k, self.model.num_experts, adjacent=self.adjacent_experts)
        algorithm = bind_fanout(ALL_TO_ALL.get(point.all_to_all, "collectives.all_to_all"), fanout)
        return self._merged_s([algorithm(matrix, list(g), self.topo) for g in groups], groups)

    def _p2p_s(self, point: PlanPoint, tokens: int) -> float:
        """One micro-batch's hop from the first stage to the second: every rank of the stage sends its activations to
        its counterpart at once (the simulator's one flow set of the stage's transfers), so ranks that share a NIC
        (both GCDs of a Frontier package) share its bandwidth."""
        if point.pp == 1:
            return 0.0
        per_stage = point.num_gpus // point.pp
        size = tokens * self.model.d_model * self.model.dtype_bytes * point.parallel.split.sequence_share
        ranks = np.arange(per_stage)
        phase = Phase(src=ranks, dst=ranks + per_stage, sizes=np.full(per_stage, float(size)), name="p2p")
        return self.profile.p2p_overhead_s + self._phase_s(phase, tuple(self.gpus[: 2 * per_stage]))

    def _replica_groups(self, point: PlanPoint, p: int) -> dict[str, list[str]]:
        """The replicas of stage p's rank 0's parameters of each class (memory.PARAM_CLASSES)."""
        per_stage = point.num_gpus // point.pp
        stage = self.gpus[p * per_stage : (p + 1) * per_stage]
        return {
            "dense": stage[:: point.tp],
            "replicated": stage if point.tp > 1 else [],
            "expert": stage[:: point.ep * point.etp],
        }

    def _sharded_s(self, registry, size: float, gpus: list[str]) -> float:
        """One collective of a class's replicas (ZeRO's gathers and reduce-scatters, the data-parallel all-reduce) of
        `size` bytes over `gpus`, run with its sibling groups (_siblings), memoized: units of equal size gather over
        the same groups in every plan that shares their stage's placement."""
        collective = registry.get(self.all_reduce, "collectives.all_reduce")
        group = tuple(gpus)
        return self._cached(("sharded", collective, size, group), lambda: self._together_s(collective, size, group))

    def _siblings(self, group: tuple[str, ...]) -> list[tuple[str, ...]]:
        """The groups that run a class's sharded collective at the same time as `group`: every rank of a stage
        gathers (reduces) the same unit at once, each over its own replicas, and a class's replicas are an
        arithmetic progression of the placement (CollectivePricer._replica_groups, fsdp_estimate.shard_groups) whose
        translations by 0 .. stride - 1 are the other ranks' groups. A group of any other shape runs alone."""
        index = self._cached(("placement index",), lambda: {g: i for i, g in enumerate(self.gpus)})
        at = [index[g] for g in group]
        stride = at[1] - at[0] if len(at) > 1 else 1
        if stride < 2 or any(b - a != stride for a, b in zip(at, at[1:], strict=False)) or at[-1] + stride > len(index):
            return [group]
        return [tuple(self.gpus[i + o] for i in at) for o in range(stride)]

    def _together_s(self, collective, size: float, group: tuple[str, ...]) -> float:
        """A sharded collective of `group` and its siblings at once: phase i of every group is one phase of all
        their flows (they share the links they cross: on Frontier the two GCDs of a package share its NIC), each
        phase after the phases in its `after`; groups whose phases differ in shape are priced alone (the slowest)."""
        siblings = self._siblings(group)
        return self._merged_s([collective(size, list(g), self.topo) for g in siblings], siblings)

    def _merged_s(self, runs: list[list[Phase]], groups: list[tuple[str, ...]]) -> float:
        """Equal-sized groups' runs of one collective at once: phase i of every run is one phase of all their flows,
        each phase after the phases in its `after`; runs whose phases differ in shape are priced alone (the
        slowest)."""
        shapes = [[(ph.after, ph.messages, ph.overhead_s, ph.delay_s) for ph in run] for run in runs]
        if len(runs) == 1 or any(shape != shapes[0] for shape in shapes):
            return max(self.phases_s(r, g) for r, g in zip(runs, groups, strict=True))
        n = len(groups[0])
        merged = [
            replace(
                phases[0],
                src=np.concatenate([ph.src + k * n for k, ph in enumerate(phases)]),
                dst=np.concatenate([ph.dst + k * n for k, ph in enumerate(phases)]),
                sizes=np.concatenate([ph.sizes for ph in phases]),
            )
            for phases in zip(*runs, strict=True)
        ]
        return self.phases_s(merged, tuple(g for s in groups for g in s))

    def _reduce_group_s(
        self, params: float, gpus: list[str], zero: int, buckets: tuple[float, ...] = (), *, alone: bool = False
    ) -> float:
        """One all-reduce of the gradients, or with ZeRO their reduce-scatter (ZeRO-1; ZeRO-2's are per chunk,
        _bucket_s) and the parameters' all-gather, each with its sibling groups (_sharded_s; alone: a group whose
        ranks pair otherwise, DualPipe's mirror stages). buckets: DeepSpeed's ZeRO-1 all-reduces instead of the
        reduce-scatter, one per bucket's elements of the class (_class_reduce_s)."""
        size = params * self.model.dtype_bytes
        if alone:
            return self.phases_s(
                ALL_REDUCE.get(self.all_reduce, "collectives.all_reduce")(size, list(gpus), self.topo), tuple(gpus)
            )
        if not zero:
            return self._sharded_s(ALL_REDUCE, size, gpus)
        gather = self._sharded_s(ALL_GATHER, size, gpus)
        return gather + (0.0 if zero == 2 else self._class_reduce_s(size, gpus, buckets))

    def _class_reduce_s(self, size: float, gpus: list[str], buckets: tuple[float, ...] = ()) -> float:
        """One class's ZeRO gradient reduction of `size` bytes over `gpus`: its reduce-scatter, or DeepSpeed's
        all-reduces one after another, one per bucket's elements of the class (workload/deepspeed_zero.py)."""
        if self.gradient_reduce != DEEPSPEED:
            return self._sharded_s(REDUCE_SCATTER, size, gpus)
        return sum(self._sharded_s(ALL_REDUCE, elements * self.model.dtype_bytes, gpus) for elements in buckets)

    def phases_s(self, phases: list[Phase], gpus: tuple[str, ...] | None = None) -> float:
        """End of the last phase, each after the phases in its `after`."""
        gpus = gpus if gpus is not None else tuple(self.gpus)
        ends: list[float] = []
        for phase in phases:
            start = max((ends[a] for a in phase.after), default=0.0)
            ends.append(start + self._phase_s(phase, gpus))
        return max(ends, default=0.0)

    def _phase_s(self, phase: Phase, gpus: tuple[str, ...]) -> float:
        """The engine's delay before the flows (phase_delay_s), then the busiest link's bytes over its capacity.
        Link loads are linear in the flows' sizes, so the load per byte is memoized per flow pattern."""
        if phase.sizes.size == 0:
            return 0.0
        pattern = (gpus, phase.src.tobytes(), phase.dst.tobytes())
        hit = self._memo.get(pattern)
        if hit is None:
            hit = self._memo[pattern] = self._link_matrix(phase, gpus)
        link, flow, fraction, capacity, latency = hit
        load = np.bincount(link, weights=fraction * phase.sizes[flow], minlength=capacity.size)
        delay = phase_delay_s(phase, self.topo.params.message_overhead_s, latency)
        return delay + float(np.max(load / capacity))

    def _link_matrix(self, phase: Phase, gpus: tuple[str, ...]) -> tuple:
        """The phase's flows on the links they touch: (link index among them, flow, share of the flow,
        capacity of each touched link, the largest path latency)."""
        routes = [self._route(gpus[s], gpus[d]) for s, d in zip(phase.src.tolist(), phase.dst.tolist(), strict=True)]
        if not routes:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0), 0.0
        link = np.concatenate([r[0] for r in routes])
        fraction = np.concatenate([r[1] for r in routes])
        flows = np.repeat(np.arange(len(routes)), [r[0].shape[0] for r in routes])
        latency = max(r[2] for r in routes)
        touched, index = np.unique(link, return_inverse=True)
        return index, flows, fraction, self.topo.capacity_bytes_per_s[touched], latency

    def _route(self, src: str, dst: str) -> tuple[np.ndarray, np.ndarray, float]:
        """A pair's paths as arrays, memoized: (the links of every path one after another, each entry's path
        fraction, the largest path latency)."""
        key = ("route", src, dst)
        hit = self._memo.get(key)
        if hit is None:
            paths = [(fraction, path) for fraction, path in self.topo.paths(src, dst) if path]
            lengths = np.array([len(path) for _, path in paths], dtype=np.int64)
            links = np.array([link for _, path in paths for link in path], dtype=np.int64)
            fractions = np.repeat(np.array([fraction for fraction, _ in paths], dtype=float), lengths)
            starts = np.cumsum(lengths) - lengths  # each path's first entry: its latency, the sum of its links'
            latency = float(np.add.reduceat(self.topo.latency_s[links], starts).max()) if paths else 0.0
            hit = self._memo[key] = (links, fractions, latency)
        return hit  # type: ignore[return-value]
