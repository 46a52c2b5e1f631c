"""The analytic tier of the planner: a plan's step time in well under a millisecond, no event loop.

Owns Estimator and the whole-config entry points (estimate_config, estimate_with_memory, config_estimator). It
prices with the simulator's own functions, so there is no second cost model:
- compute: a chunk's passes by the simulator's cost functions (planning/compute_estimate.py, ComputePricer);
- communication: the same collective algorithms on the same topology routes, each phase's flows on its busiest
  link (planning/collective_estimate.py, CollectivePricer: a lower bound, the simulator adds contention);
- pipeline: the schedule generator's own order replayed with each pass's time (its chunk's forward, backward or
  weight pass, all-to-alls included since they block the compute stream) and the execution contract's p2p, a hop
  that starts when the receiving stage reaches the pass (planning/pipeline_replay.py: every hop of interleaved
  1F1B's lockstep is exposed); plans whose all-to-alls overlap another micro-batch's pass take the closed forms over
  per-stage times instead (planning/pipeline_estimate.py) plus 2 (pp vpp - 1) hops on the fill and drain path;
  then the gradient all-reduces (ZeRO-1/2: reduce-scatters, or DeepSpeed's bucket all-reduces:
  workload/deepspeed_zero.py) and the optimizer;
- ZeRO-3: a pass of a chunk that gathers adds the unit gathers its compute does not hide
  (workload.fsdp.exposed_gather_s; without resharding after the forward, only the passes that find their chunk
  sharded: fsdp_estimate.gather_shares); a backward adds its units' reduce-scatters on the same links
  (workload.fsdp.exposed_backward_s); a pass that gathers right after a backward waits longer for its first
  gather, which shares the links with that backward's last reduce-scatter (fsdp_estimate.after_backward_shares,
  workload.fsdp.delayed_by_reduce_s); the replay puts each where the schedule runs it; the step adds the
  reduce-scatter of the last unit of its backward.
Pure: no simpy, torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from piper_sim.collectives.params import library_units
from piper_sim.collectives.sharded import ALL_GATHER
from piper_sim.machine import Machine, build_machine
from piper_sim.planning.compute_estimate import ComputePricer
from piper_sim.planning.fsdp_estimate import after_backward_shares, gather_shares, shard_groups, unit_reduce_s
from piper_sim.planning.geometry import Chunk, Geometry, geometry
from piper_sim.planning.overlap_estimate import pair_s, paired_shares
from piper_sim.planning.pipeline_estimate import SPLIT_BACKWARD, pipeline_s
from piper_sim.planning.pipeline_replay import REPLAYED, replayed_pipeline_s
from piper_sim.planning.plan_point import PlanPoint
from piper_sim.planning.resource import stage_memory
from piper_sim.schedule.communicators import config_reserve_bytes
from piper_sim.schedule.ir import Layout
from piper_sim.workload.cost import TaskCoster
from piper_sim.workload.deepspeed_zero import reduce_buckets
from piper_sim.workload.fsdp import NO_BLOCK, delayed_by_reduce_s, exposed_backward_s, exposed_gather_s
from piper_sim.workload.fsdp_state import unit_params
from piper_sim.workload.memory import (
    PARAM_CLASSES,
    fp8_weight_params,
    headroom_bytes,
    param_shards,
    rank_param_tensors,
    rank_params,
)
from piper_sim.workload.recompute import DEFAULT_SELECTIVE_MODULES


@dataclass(frozen=True, kw_only=True)
class Estimate:
    step_time_s: float
    pipeline_s: float  # the forward/backward pipeline of all microbatches, all-to-alls and p2p included
    bubble_s: float  # pipeline_s less the busiest stage's own work
    all_to_all_s: float  # per step on the busiest stage (blocking: on the critical path)
    p2p_s: float  # what the activations' and gradients' transfers add to the pipeline (their exposed hops)
    grad_reduce_s: float
    optimizer_s: float
    model_flops_per_step: float
    tflops_per_gpu: float
    mfu: float

    def as_row(self) -> dict:
        return {f"est_{k}": v for k, v in self.__dict__.items()}


class Estimator(ComputePricer):
    """Prices plans of one model on one topology (built for all the plans' GPUs) with one device profile: their
    stages' compute (ComputePricer) and collectives (CollectivePricer) put together by the pipeline's replay (or its
    closed forms), the data-parallel reductions, ZeRO's gathers and the optimizer."""

    def estimate(self, point: PlanPoint) -> Estimate:
        m = self.model
        tokens = point.parallel.tokens_per_microbatch(m.seq_len)
        split = point.parallel.split
        shape = geometry(m.num_layers, point.schedule, point.pp, point.vpp)
        stages, layers = shape.stages, shape.layers
        a2a = self._cached(
            ("a2a", point.ep, point.all_to_all, tokens, split, point.num_gpus // point.pp),
            lambda: self._all_to_all_s(point, tokens),
        )
        zb = point.schedule in SPLIT_BACKWARD
        # a stage's times depend on these only (and, under ZeRO-2 and -3, on the stage's data-parallel groups and,
        # without resharding, on the schedule's passes): plans that differ elsewhere share them
        stage_key = (
            ("stage", tokens, split, point.ep, stages.layout, point.pp, point.vpp, zb, point.recompute, point.zero, a2a)
            + (() if point.zero < 2 else (point.num_gpus, point.parallel.dp_replicate))
            + ((point.schedule, point.num_microbatches, point.reshard_after_forward) if point.zero == 3 else ())
            + (("overlap", point.schedule, point.num_microbatches) if point.overlap_all_to_all else ())
        )
        chunks = [
            self._cached(stage_key + ("chunks", p), lambda p=p: self._stage_chunks(point, shape, p, a2a))
            for p in range(point.pp)
        ]
        per_stage, flops_per_rank_mb = [], []
        for p in range(point.pp):
            times, flops = self._cached(stage_key + (p,), lambda p=p: self._stage_s(point, shape, p, a2a, chunks[p]))
            per_stage.append(times)
            flops_per_rank_mb.append(flops)
        hop = self._cached(("p2p", point.pp, tokens, split), lambda: self._p2p_s(point, tokens))
        if point.pp > 1 and point.schedule in REPLAYED and not point.overlap_all_to_all:
            # the generator's order with each pass's own time and the contract's p2p rendezvous (pipeline_replay)
            pipeline, p2p = replayed_pipeline_s(self, point, shape, a2a, hop, stage_key, chunks)
        else:
            pipeline = pipeline_s(point, per_stage)
            p2p = 2 * (stages.pipeline_length - 1) * hop  # dualpipe: its two pipelines' hops overlap
        grad, optimizer = self._cached(
            (
                "reduce",
                point.pp,
                point.vpp,
                stages.layout,
                point.ep,
                point.dp,
                point.zero,
                split,
                point.parallel.dp_replicate,
            ),
            lambda: self._reduce_s(point, layers),
        )
        step = pipeline + p2p + grad + optimizer
        ranks_per_stage = point.num_gpus // point.pp
        model_flops = sum(flops_per_rank_mb) * ranks_per_stage * point.num_microbatches
        busiest = max(point.num_microbatches * (f + b + w) for f, b, w, _ in per_stage)
        return Estimate(
            step_time_s=step,
            pipeline_s=pipeline + p2p,
            bubble_s=max(pipeline - busiest, 0.0),
            all_to_all_s=point.num_microbatches * max(s[3] for s in per_stage),
            p2p_s=p2p,
            grad_reduce_s=grad,
            optimizer_s=optimizer,
            model_flops_per_step=model_flops,
            tflops_per_gpu=model_flops / step / point.num_gpus / 1e12,
            mfu=model_flops / (step * point.num_gpus * self.profile.peak_flops_per_s),
        )

    def _stage_s(
        self, point: PlanPoint, shape: Geometry, p: int, a2a: float, chunks: list[tuple[float, ...]]
    ) -> tuple[tuple[float, float, float, float], float]:
        """Stage p's ((F, B, W, all-to-all) of one micro-batch, its FLOPs per rank) (estimate's per_stage) from its
        chunks' (_stage_chunks), under ZeRO-3 with the exposed gathers and reduce-scatters at the shares of the
        passes that run them (_fsdp_s)."""
        f, b, w, a2a_s, flops, hidden = (sum(column) for column in zip(*chunks, strict=True))
        if point.zero == 3:  # the units' gathers that prefetch cannot hide, forward and backward
            exposed = [self._fsdp_s(point, shape.layers, p, chunk.virtual, a2a) for chunk in shape.chunks[p]]
            f, b = f + sum(e[0] for e in exposed), b + sum(e[1] for e in exposed)
        share = 1 / shape.stages.num_pipelines  # bidirectional: a microbatch runs one of the two chunks
        f, b, w, a2a_s, flops, hidden = (x * share for x in (f, b, w, a2a_s, flops, hidden))
        return (f + (a2a_s - hidden) / 2, b + (a2a_s - hidden) / 2, w, a2a_s), flops

    def _stage_chunks(self, point: PlanPoint, shape: Geometry, p: int, a2a: float) -> list[tuple[float, ...]]:
        """Each chunk of stage p in one micro-batch: (F, B, W, all-to-all, FLOPs per rank, what overlapped pairs
        hide), all-to-alls not in F and B, ZeRO-3's gathers not in either (_stage_s, pipeline_replay add them)."""
        coster = self.coster(point.parallel.tokens_per_microbatch(self.model.seq_len), point.parallel.split)
        zb = point.schedule in SPLIT_BACKWARD
        out = []
        for chunk in shape.chunks[p]:
            cf, cb, cw, flops, moe, rs, redo_moe = self._chunk_parts(coster, point, chunk, zb)
            f, b, w, hidden = cf, cb + rs, cw, 0.0
            if point.zero == 2:  # the chunk's gradients reduce-scattered after its backward of each micro-batch
                bucket = self._bucket_s(point, shape.layers, p, chunk.virtual)
                b, w = (b, w + bucket) if zb else (b + bucket, w)
            if point.overlap_all_to_all:  # what the chunk's pairs hide, over the stage's share of paired passes
                share = paired_shares(point.schedule, point.pp, point.vpp, point.num_microbatches)[p]
                hidden = share * self._hidden_s(coster, point, chunk, rs, a2a)
            out.append((f, b, w, (4 * moe + 2 * redo_moe) * a2a, flops, hidden))
        return out

    def _chunk_parts(
        self, coster: TaskCoster, point: PlanPoint, chunk: Chunk, zb: bool
    ) -> tuple[float, float, float, float, int, float, int]:
        """A chunk's (F, B, W, FLOPs, MoE layers) of one micro-batch (Estimator._chunk) and its recomputation's
        (seconds, MoE layers) (_recompute), memoized."""
        tokens, split, held, first, last = coster.tokens, coster.split, chunk.layers, chunk.first, chunk.last
        key = ("chunk", tokens, split, point.ep, held, first, last, zb)
        parts = self._cached(key, lambda: self._chunk(coster, point.ep, held, first, last, zb))
        key = ("redo", tokens, split, point.ep, held, first, point.recompute)
        redo = self._cached(key, lambda: self._recompute(coster, point.ep, held, first, point.recompute))
        return (*parts, *redo)

    def _hidden_s(self, coster: TaskCoster, point: PlanPoint, chunk: Chunk, redo_s: float, a2a: float) -> float:
        """Seconds a chunk's forward and backward save when they run as one overlapped pair (overlap_estimate.pair_s;
        the recomputation before the backward runs in its first piece, its all-to-alls as they were) over running one
        after the other."""
        zb = point.schedule in SPLIT_BACKWARD
        key = ("pieces", coster.tokens, coster.split, point.ep, chunk.layers, chunk.first, chunk.last, zb)

        def pieces() -> tuple[tuple[float, ...], tuple[float, ...]]:
            out: tuple[list[float], list[float]] = ([], [])
            self._chunk(coster, point.ep, chunk.layers, chunk.first, chunk.last, zb, pieces=out)
            return tuple(out[0]), tuple(out[1])

        forward, backward = self._cached(key, pieces)
        if len(forward) < 2:  # no all-to-all to hide
            return 0.0
        running_backward = [backward[-1] + redo_s, *backward[-2::-1]]
        alone = sum(forward) + sum(backward) + redo_s + 2 * (len(forward) - 1) * a2a
        units = self.profile.compute_units
        share = library_units(self.topo, point.all_to_all) / units if units else 0.0
        return max(alone - pair_s(forward, running_backward, a2a, share), 0.0)

    def _reduce_s(self, point: PlanPoint, layers: tuple[tuple[int, ...], ...]) -> tuple[float, float]:
        """(gradient all-reduces, optimizer) of the slowest stage."""
        stages = geometry(self.model.num_layers, point.schedule, point.pp, point.vpp).stages
        worst_grad = worst_opt = 0.0
        per_stage = point.num_gpus // point.pp
        for p in range(point.pp):
            chunks = [stages.of(p, c) for c in range(point.vpp)]
            held = tuple(layer for v in chunks for layer in layers[v])
            ends = {
                "first": any(map(stages.is_first, chunks)),
                "last": any(map(stages.is_last, chunks)),
                "ep": point.ep,
            }
            params = rank_params(self.model, held, **ends, split=point.parallel.split)
            buckets = reduce_buckets(params)  # DeepSpeed's all-reduce calls (CollectivePricer._class_reduce_s)
            grad = 0.0
            if stages.layout == Layout.BIDIRECTIONAL:  # DualPipe's two copies: summed with the mirror stage's first
                mirror = [self.gpus[p * per_stage], self.gpus[(point.pp - 1 - p) * per_stage]]
                grad += self._reduce_group_s(sum(params.values()), mirror, 0, alone=True)
            for kind, gpus in self._replica_groups(point, p).items():
                if len(gpus) > 1 and point.zero == 3:  # the step waits for its last unit's reduce-scatter
                    unit = unit_params(
                        self.model,
                        layers[chunks[0]],
                        first=ends["first"],
                        last=False,
                        ep=point.ep,
                        split=point.parallel.split,
                    )
                    grad += unit_reduce_s(
                        self,
                        next(iter(unit.values()))[kind] * self.model.dtype_bytes,
                        gpus,
                        point.parallel.dp_replicate,
                    )
                elif len(gpus) > 1:
                    grad += self._reduce_group_s(params[kind], gpus, point.zero, buckets[kind])
            shards = param_shards(
                zero=point.zero,
                data_parallel=point.parallel.data_parallel,
                dp=point.dp,
                stage_size=per_stage,
                replicate=point.parallel.dp_replicate,
            )
            updated = sum(params[kind] / shards[kind] for kind in PARAM_CLASSES)
            tensors = rank_param_tensors(self.model, held, **ends)
            fp8_params = fp8_weight_params(
                self.model, params, held, first=ends["first"], last=ends["last"], tp=point.parallel.split.tp
            )
            worst_grad = max(worst_grad, grad)
            coster = self.coster(1)
            worst_opt = max(worst_opt, coster.optimizer_time_s(updated, tensors) + coster.fp8_weight_cast_s(fp8_params))
        return worst_grad, worst_opt

    def _bucket_s(self, point: PlanPoint, layers: tuple[tuple[int, ...], ...], p: int, v: int) -> float:
        """ZeRO-2: one micro-batch's reduce-scatter of a chunk's gradients (DeepSpeed: its bucket all-reduces), every
        class."""
        stages = geometry(self.model.num_layers, point.schedule, point.pp, point.vpp).stages
        params = rank_params(
            self.model,
            layers[v],
            first=stages.is_first(v),
            last=stages.is_last(v),
            ep=point.ep,
            split=point.parallel.split,
        )
        buckets = reduce_buckets(params)
        return sum(
            self._class_reduce_s(params[kind] * self.model.dtype_bytes, gpus, buckets[kind])
            for kind, gpus in self._replica_groups(point, p).items()
            if len(gpus) > 1
        )

    def _fsdp_s(
        self, point: PlanPoint, layers: tuple[tuple[int, ...], ...], p: int, v: int, a2a: float
    ) -> tuple[float, float]:
        """ZeRO-3: (forward, backward) gather time of one micro-batch's pass of chunk v that its units' compute does
        not hide (workload.fsdp.exposed_gather_s; all-to-alls count as compute: they block the compute stream),
        times the share of the passes that gather, and the delay of the first gather of those that gather right after
        a backward, times their share."""
        stages = geometry(self.model.num_layers, point.schedule, point.pp, point.vpp).stages
        forward, backward, reducing, delay_forward, delay_backward = self._chunk_exposures(point, layers, p, v, a2a)
        shape = (point.schedule, point.pp, point.vpp, point.num_microbatches, p, stages.where(v)[1])
        shares = gather_shares(*shape, point.reshard_after_forward)
        after = after_backward_shares(*shape, point.reshard_after_forward)
        return (
            shares[0] * forward + after[0] * delay_forward,
            shares[1] * backward + (1 - shares[1]) * reducing + after[1] * delay_backward,
        )

    def _chunk_exposures(
        self, point: PlanPoint, layers: tuple[tuple[int, ...], ...], p: int, v: int, a2a: float
    ) -> tuple[float, float, float, float, float]:
        """ZeRO-3: one pass of chunk v at stage p, memoized: (_exposed_gathers_s) the forward's and the backward's
        exposed gathers and reduce-scatters, a backward's without gathers, and the delay of a forward's and a
        backward's first gather right after a backward."""
        stages = geometry(self.model.num_layers, point.schedule, point.pp, point.vpp).stages
        first, last = stages.is_first(v), stages.is_last(v)
        par = point.parallel
        key = (
            "fsdp",
            par.tokens_per_microbatch(self.model.seq_len),
            par.split,
            point.ep,
            point.num_gpus // point.pp,
            p,
            par.dp_replicate,
            layers[v],
            first,
            last,
            point.recompute,
            a2a,
        )
        return self._cached(key, lambda: self._exposed_gathers_s(point, layers[v], p, first, last, a2a))

    def _exposed_gathers_s(
        self, point: PlanPoint, layers: tuple[int, ...], p: int, first: bool, last: bool, a2a: float
    ) -> tuple[float, float, float, float, float]:
        """ZeRO-3: (forward, backward, backward without gathers) exposed communication of one pass of a chunk holding
        `layers` at stage p: its units' gathers (which depend on the split, EP, the chunk and the stage's groups) and,
        in the backward, their gradients' reduce-scatters (workload.fsdp.exposed_backward_s; every backward reduces,
        whether it gathered or not) against their passes' compute (the micro-batch's tokens, the split, EP, the
        chunk, recomputation, all-to-all); then how much later a forward's and a backward's first gather ends when it
        starts beside the reduce-scatter a backward of this chunk issued last, its first unit's
        (workload.fsdp.delayed_by_reduce_s)."""
        par = point.parallel
        tokens, split = par.tokens_per_microbatch(self.model.seq_len), par.split
        groups_key = (split, point.ep, point.num_gpus // point.pp, p, par.dp_replicate, layers, first, last)
        gathers = self._cached(("gathers", *groups_key), lambda: self._unit_gathers_s(point, layers, p, first, last))
        reduces = self._cached(("reduces", *groups_key), lambda: self._unit_reduces_s(point, layers, p, first, last))
        forward, backward = self._cached(
            ("passes", tokens, split, point.ep, layers, first, last, point.recompute, a2a),
            lambda: self._chunk_unit_passes_s(point, layers, first, last, a2a),
        )
        running = backward[::-1]
        return (
            exposed_gather_s(gathers, forward),
            exposed_backward_s(gathers[::-1], reduces[::-1], running),
            exposed_backward_s([0.0] * len(gathers), reduces[::-1], running),
            delayed_by_reduce_s(gathers[0], reduces[0]),
            delayed_by_reduce_s(gathers[-1], reduces[0]),
        )

    def _unit_gathers_s(
        self, point: PlanPoint, layers: tuple[int, ...], p: int, first: bool, last: bool
    ) -> list[float]:
        """ZeRO-3: the all-gather time of each unit of the chunk, every class over its shard group."""
        groups = shard_groups(self._replica_groups(point, p), point.parallel.dp_replicate)[0]  # HSDP: within a shard
        units = unit_params(self.model, layers, first=first, last=last, ep=point.ep, split=point.parallel.split)
        return [
            sum(
                self._sharded_s(ALL_GATHER, params[kind] * self.model.dtype_bytes, gpus)
                for kind, gpus in groups.items()
                if len(gpus) > 1
            )
            for params in units.values()
        ]

    def _unit_reduces_s(
        self, point: PlanPoint, layers: tuple[int, ...], p: int, first: bool, last: bool
    ) -> list[float]:
        """ZeRO-3: the gradient reduction time of each unit of the chunk, every class over its replica group
        (fsdp_estimate.unit_reduce_s: a reduce-scatter within the shard group and, under HSDP, an all-reduce across)."""
        units = unit_params(self.model, layers, first=first, last=last, ep=point.ep, split=point.parallel.split)
        return [
            sum(
                unit_reduce_s(self, params[kind] * self.model.dtype_bytes, gpus, point.parallel.dp_replicate)
                for kind, gpus in self._replica_groups(point, p).items()
                if len(gpus) > 1
            )
            for params in units.values()
        ]

    def _chunk_unit_passes_s(
        self, point: PlanPoint, layers: tuple[int, ...], first: bool, last: bool, a2a: float
    ) -> tuple[list[float], list[float]]:
        """ZeRO-3: the (forward, backward) compute of each unit of the chunk (_unit_passes_s)."""
        coster = self.coster(point.parallel.tokens_per_microbatch(self.model.seq_len), point.parallel.split)
        units = list(layers) if layers else [NO_BLOCK]
        forward, backward = [], []
        for unit in units:
            ends = (first and unit == units[0], last and unit == units[-1])
            key = ("unit", coster.tokens, coster.split, point.ep, unit, ends, point.recompute, a2a)
            f, b = self._cached(key, lambda unit=unit, ends=ends: self._unit_passes_s(coster, point, unit, ends, a2a))
            forward.append(f)
            backward.append(b)
        return forward, backward

    def _unit_passes_s(
        self, coster: TaskCoster, point: PlanPoint, unit: int, ends: tuple[bool, bool], a2a: float
    ) -> tuple[float, float]:
        """ZeRO-3: (forward, backward) compute of one unit (a layer; negative: the embedding or the head) in one
        micro-batch, its all-to-alls included and its recomputation before the backward."""
        layers = (unit,) if unit >= 0 else ()
        f, b, _, _, moe = self._chunk(coster, point.ep, layers, *ends, False)
        redo, redo_moe = self._recompute(coster, point.ep, layers, ends[0], point.recompute)
        return f + 2 * moe * a2a, b + redo + 2 * (moe + redo_moe) * a2a


def estimate_config(cfg, built: tuple[Estimator, PlanPoint] | None = None) -> tuple[Estimate, bool]:
    """A whole config (piper_sim.config.Config) priced by the estimator: (its estimate, whether every stage's peak
    fits HBM less the framework reserve, by the resource model). built: config_estimator(cfg), where the caller
    has it already."""
    estimate, peaks, hbm_bytes, reserve = estimate_with_memory(cfg, built)
    return estimate, min(headroom_bytes(peaks, hbm_bytes, reserve)) >= 0


def estimate_with_memory(
    cfg, built: tuple[Estimator, PlanPoint] | None = None
) -> tuple[Estimate, list[float], float, float]:
    """A whole config priced by the estimator: (its estimate, each stage's peak memory by the resource model,
    the device's HBM bytes, its framework reserve). built: config_estimator(cfg), where the caller has it."""
    estimator, point = built or config_estimator(cfg)
    profile = estimator.profile
    peaks = [
        m.peak_bytes
        for m in stage_memory(
            cfg.model,
            point,
            flash_attention=cfg.flash_attention,
            recompute_layers=cfg.recompute_layers,
            checkpoint_layers=cfg.recompute_checkpoint_layers,
            fp8_transposed_copies=profile.fp8_transposed_copies,
            recompute_modules=cfg.recompute_modules,
        )
    ]
    return estimator.estimate(point), peaks, profile.hbm_bytes, config_reserve_bytes(cfg, profile)


def config_estimator(cfg, machine: Machine | None = None) -> tuple[Estimator, PlanPoint]:
    """The estimator of a whole config's machine (build_machine(cfg) where the caller has none), and the config's
    plan as a PlanPoint."""
    par = cfg.parallel
    point = PlanPoint(
        pp=par.pp,
        ep=par.ep,
        dp=par.dp,
        cp=par.cp,
        vpp=par.vpp,
        micro_batch_size=par.micro_batch_size,
        num_microbatches=par.num_microbatches,
        schedule=cfg.schedule,
        all_to_all=cfg.collectives.all_to_all,
        overlap_all_to_all=cfg.collectives.overlap_all_to_all,
        recompute=cfg.recompute,
        zero=cfg.zero,
        tp=par.tp,
        etp=par.etp,
        sp=par.sp,
        reshard_after_forward=cfg.reshard_after_forward,
        dp_shard=par.dp_shard,
    )
    machine = machine or build_machine(cfg)
    estimator = Estimator(
        cfg.model,
        machine.topology,
        list(machine.placement),
        machine.profile,
        collectives_all_reduce=cfg.collectives.all_reduce,
        gradient_reduce=cfg.gradient_reduce,
        adjacent_experts=cfg.routing.adjacent_experts,
        flash_attention=cfg.flash_attention,
        recompute_modules=cfg.recompute_modules or DEFAULT_SELECTIVE_MODULES,
    )
    return estimator, point
