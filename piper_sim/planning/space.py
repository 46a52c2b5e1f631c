"""The plan space: the plans Piper's constraints allow, and their enumeration.

Owns enumerate_plans with the constraints that need no memory model: the mesh uses all GPUs, ep divides the
experts, tp divides the heads and FFN widths and a node's GPUs (etp 1 and sequence parallelism unless --fix asks
otherwise; a dense model's etp follows tp), pp x vpp <= layers, the global batch splits into whole microbatches, an
EP group fits the locality domain asked for (node, switch or dragonfly group of the topology), optimizer sharding
only with more than one replica, and each schedule's own rules (interleaved needs vpp >= 2 and microbatches a
multiple of pp; DualPipe and DualPipeV vpp = 2 whatever --fix bounds vpp to; the others vpp = 1; duplicates
dropped: ZB-H1 at pp 1 is 1F1B). space_notes says what the space took that --fix did not ask for; no_plan_error
names the --fix or --ep-domain that leaves no plan. A point of the space is plan_point.PlanPoint; the --fix values
that bound it are parsed by plan_fixes.py. Memory (the stage-0 bottleneck) is resource.py's. Pure: no simpy, torch.
"""

from __future__ import annotations

from dataclasses import replace

from piper_sim.config import TWO_CHUNK_SCHEDULES, ZERO3_SCHEDULES, pairs_with_pipelining
from piper_sim.errors import ConfigError
from piper_sim.planning.context_parallel_estimate import cp_degrees
from piper_sim.planning.overlap_estimate import paired_shares
from piper_sim.planning.plan_fixes import FIX_KEYS
from piper_sim.planning.plan_point import A2A_NAMES, SCHEDULE_NAMES, PlanPoint
from piper_sim.workload.fsdp import hsdp_replicate
from piper_sim.workload.model import ModelSpec
from piper_sim.workload.parallel import tensor_split_widths

DEFAULT_MICRO_BATCH_SIZES = (1, 2, 4)
DEFAULT_VPP = (1, 2, 4)
DEFAULT_TP = (1, 2)


def is_dense(model: ModelSpec) -> bool:
    """No layer routes to experts: the expert tensor parallelism (etp) has nothing of its own to split."""
    return model.num_experts <= 1 or not model.moe_layer_indices


def space_notes(model: ModelSpec, fixed: dict[str, tuple] | None) -> list[str]:
    """What the space takes that --fix did not ask for, one line each (the CLI prints them as notes)."""
    fixed = fixed or {}
    notes = []
    if is_dense(model) and "etp" not in fixed and any(tp > 1 for tp in fixed.get("tp", DEFAULT_TP)):
        notes.append(
            f"{model.name} is dense: parallel.etp follows parallel.tp (its FFNs split like the rest of "
            "each layer; --fix parallel.etp to set it)"
        )
    two_chunk = [s for s in fixed.get("schedule", SCHEDULE_NAMES) if s in TWO_CHUNK_SCHEDULES]
    if two_chunk and "vpp" in fixed and 2 not in fixed["vpp"]:
        notes.append(
            f"schedule {' and '.join(two_chunk)}: parallel.vpp 2, the only value it allows (each rank holds "
            f"two chunks); --fix parallel.vpp={','.join(map(str, fixed['vpp']))} bounds the other schedules"
        )
    return notes


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def enumerate_plans(
    model: ModelSpec,
    num_gpus: int,
    global_batch: int,
    *,
    domain_gpus: int,
    fixed: dict[str, tuple] | None = None,
    schedules: tuple[str, ...] = SCHEDULE_NAMES,
    all_to_alls: tuple[str, ...] = A2A_NAMES,
    recomputes: tuple[str, ...] = ("none",),
    zeros: tuple[int, ...] = (0,),
    node_gpus: int = 1,
    tps: tuple[int, ...] = DEFAULT_TP,
) -> list[PlanPoint]:
    """Every plan that satisfies the structural constraints, in a fixed order.

    global_batch: sequences per step (= micro_batch_size x num_microbatches x the data-parallel replicas, dp x ep
    x etp / tp). all_to_alls: the algorithms tried unless --fix names others (any registered one: rccl, nccl, ...).
    domain_gpus: the largest EP group allowed (the locality domain's GPU count; num_gpus for "any").
    node_gpus: GPUs per node (a tensor-parallel group stays inside one); tps: the tensor-parallel degrees tried,
    each with etp 1 and sequence parallelism unless fixed otherwise (Megatron-core's MoE form); a dense model's
    etp is tp unless fixed (Megatron's dense form: no expert layer to split otherwise)."""
    fixed = fixed or {}
    _check_fixed(fixed, num_gpus, global_batch)

    def allowed(knob: str, values) -> list:
        return [v for v in values if knob not in fixed or v in fixed[knob]]

    out = []
    for tp in allowed("tp", sorted(set(tps) | set(fixed.get("tp", ())))):
        if tp > 1 and (node_gpus % tp or not _splits(model, tp)):
            continue
        for etp in allowed("etp", sorted({1, tp} if "etp" in fixed else {tp} if is_dense(model) else {1})):
            for sp in allowed("sp", (True, False) if tp > 1 and "sp" in fixed else ((tp > 1),)):
                for cp in cp_degrees(model, fixed):
                    out.extend(
                        replace(point, cp=cp)
                        for point in _plans_at(
                            model,
                            num_gpus,
                            global_batch,
                            domain_gpus,
                            allowed,
                            fixed,
                            schedules,
                            all_to_alls,
                            recomputes,
                            zeros,
                            tp,
                            etp,
                            sp,
                            node_gpus,
                            cp,
                        )
                    )
    return out


def _zeros(zeros: tuple[int, ...], schedule: str, replicated: bool) -> tuple[int, ...]:
    """ZeRO stages a plan may use: none without replicas; not 2 under DualPipe, 3 only under a schedule of one
    backward per chunk (config.py says why)."""
    if not replicated:
        return (0,)
    return tuple(
        z for z in zeros if not (z == 2 and schedule == "dualpipe") and not (z == 3 and schedule not in ZERO3_SCHEDULES)
    )


def _fsdp_options(
    zero: int, allowed, fixed: dict, stage: int, tp: int, dp: int, node_gpus: int
) -> list[tuple[bool, int]]:
    """ZeRO-3's (reshard_after_forward, dp_shard) pairs a plan may take: both reshard settings; shards over every
    replica (0) and, where a stage spans several nodes, HSDP with one node's replicas per shard (torchtitan's
    dp_shard within a node, dp_replicate across) or the --fix parallel.dp_shard values. Other stages: (True, 0)."""
    if zero != 3:
        return [(r, s) for r in allowed("reshard_after_forward", (True,)) for s in allowed("dp_shard", (0,))]
    replicas, shards = stage // tp, {0}
    if stage > node_gpus and stage % node_gpus == 0:
        shards.add(replicas // (stage // node_gpus))
    valid = []
    for shard in sorted(shards | set(fixed.get("dp_shard", ()))):
        try:
            replicate = hsdp_replicate(shard, data_parallel=replicas, dp=dp)
        except ConfigError:
            continue
        valid.append(0 if replicate == 1 else shard)
    return [
        (r, s) for r in allowed("reshard_after_forward", (True, False)) for s in allowed("dp_shard", sorted(set(valid)))
    ]


def _splits(model: ModelSpec, tp: int) -> bool:
    return all(width % tp == 0 for _, width in tensor_split_widths(model))


def _plans_at(
    model: ModelSpec,
    num_gpus: int,
    global_batch: int,
    domain_gpus: int,
    allowed,
    fixed: dict,
    schedules: tuple[str, ...],
    all_to_alls: tuple[str, ...],
    recomputes: tuple[str, ...],
    zeros: tuple[int, ...],
    tp: int,
    etp: int,
    sp: bool,
    node_gpus: int,
    cp: int = 1,
) -> list[PlanPoint]:
    out = []
    for pp in allowed("pp", [d for d in divisors(num_gpus) if d <= model.num_layers]):
        stage = num_gpus // pp
        if stage % etp or stage % (tp * cp):
            continue
        for ep in allowed(
            "ep",
            [
                d
                for d in divisors(stage // etp)
                if model.num_experts % d == 0 and d * etp <= domain_gpus and (etp > 1 or d % tp == 0)
            ],
        ):
            dp = stage // (ep * etp)
            if "dp" in fixed and dp not in fixed["dp"]:
                continue
            replicas = stage // (tp * cp)  # micro-batch streams: one per tensor- and context-parallel group
            if global_batch % replicas:
                continue
            for mbs in allowed(
                "micro_batch_size",
                [
                    b
                    for b in sorted(set(DEFAULT_MICRO_BATCH_SIZES) | set(fixed.get("micro_batch_size", ())))
                    if (global_batch // replicas) % b == 0 and (tp == 1 or (b * model.seq_len // cp) % tp == 0)
                ],
            ):
                m = global_batch // replicas // mbs
                if "num_microbatches" in fixed and m not in fixed["num_microbatches"]:
                    continue
                for schedule in allowed("schedule", schedules):
                    for vpp in _vpps(schedule, allowed, fixed):
                        if not _schedule_allows(schedule, pp, vpp, m, model.num_layers):
                            continue
                        for a2a in _all_to_alls(list(fixed.get("all_to_all", all_to_alls)), ep * etp, node_gpus):
                            for recompute in allowed("recompute", recomputes):
                                for zero in allowed("zero", _zeros(zeros, schedule, stage // tp > 1 or dp > 1)):
                                    for reshard, shard in _fsdp_options(zero, allowed, fixed, stage, tp, dp, node_gpus):
                                        for overlap in _overlaps(fixed, schedule, pp, vpp, m, zero):
                                            out.append(
                                                PlanPoint(
                                                    pp=pp,
                                                    ep=ep,
                                                    dp=dp,
                                                    vpp=vpp,
                                                    micro_batch_size=mbs,
                                                    num_microbatches=m,
                                                    schedule=schedule,
                                                    all_to_all=a2a,
                                                    recompute=recompute,
                                                    zero=zero,
                                                    tp=tp,
                                                    etp=etp,
                                                    sp=sp,
                                                    reshard_after_forward=reshard,
                                                    dp_shard=shard,
                                                    overlap_all_to_all=overlap,
                                                )
                                            )
    return out


def _overlaps(fixed: dict, schedule: str, pp: int, vpp: int, m: int, zero: int) -> list[bool]:
    """Whether the MoE all-to-alls overlap a paired pass's compute: off unless --fix names true (both with
    true,false), and on only where the schedule pairs passes (config.check_overlap) and some stage has a pair
    (overlap_estimate.paired_shares: one micro-batch without pipelining has none)."""
    return [
        o
        for o in fixed.get("overlap_all_to_all", (False,))
        if not o
        or (zero != 3 and pairs_with_pipelining(schedule, pp, vpp) and any(paired_shares(schedule, pp, vpp, m)))
    ]


def _vpps(schedule: str, allowed, fixed: dict) -> list[int]:
    """The virtual stages tried: DualPipe and DualPipeV take 2, the only value they allow, whatever --fix bounds
    vpp to (space_notes says so); the others the defaults and the fixed values, within the fix."""
    if schedule in TWO_CHUNK_SCHEDULES:
        return [2]
    return allowed("vpp", sorted(set(DEFAULT_VPP + tuple(fixed.get("vpp", ())))))


def _all_to_alls(names: list[str], ep_span: int, node_gpus: int) -> list[str]:
    """The all-to-all algorithms worth trying: where every EP group lies inside one node (its ep x etp consecutive
    ranks, Mesh's layout, a divisor of the node's GPUs), HALO runs flat's phases (collectives/halo.py), so the
    flat twin alone is kept."""
    if "flat" in names and node_gpus % ep_span == 0:
        return [n for n in names if n != "halo"]
    return names


def _schedule_allows(schedule: str, pp: int, vpp: int, m: int, num_layers: int) -> bool:
    """The schedule's own rules; at pp 1, ZB-H1 is 1F1B (nothing to fill), so only 1F1B is kept. DualPipe
    (generators.dualpipe): even pp, two chunks per rank, an even number of microbatches >= 2 pp; DualPipeV the
    same but any pp > 1 and any number of microbatches >= 2 pp."""
    if pp * vpp > num_layers or (pp == 1 and schedule == "zb-h1"):
        return False
    if schedule == "interleaved-1f1b":
        return vpp >= 2 and pp > 1 and m % pp == 0
    if schedule == "dualpipe":
        return pp % 2 == 0 and vpp == 2 and m % 2 == 0 and m >= 2 * pp
    if schedule == "dualpipe-v":
        return pp > 1 and vpp == 2 and m >= 2 * pp
    return vpp == 1


def _check_fixed(fixed: dict[str, tuple], num_gpus: int, global_batch: int) -> None:
    for knob in ("pp", "ep", "dp", "tp", "etp", "cp"):
        for v in fixed.get(knob, ()):
            if num_gpus % v:
                raise ConfigError(f"--fix parallel.{knob}", v, f"a divisor of the GPU count ({num_gpus})")
    if global_batch <= 0:
        raise ConfigError("--global-batch", global_batch, "a positive number of sequences")


def no_plan_error(
    model: ModelSpec,
    num_gpus: int,
    global_batch: int,
    *,
    domain: str,
    domain_gpus: int,
    fixed: dict[str, tuple],
    **space,
) -> ConfigError:
    """The error of a request whose space is empty, naming what rules every plan out: --ep-domain where a wider
    domain admits plans with the same fixes, else the last given --fix without which there are plans (with a value
    that admits one), else the request itself. space: enumerate_plans' other keyword arguments."""

    def plans(fixes: dict, gpus: int) -> list[PlanPoint]:
        return enumerate_plans(model, num_gpus, global_batch, fixed=fixes, domain_gpus=gpus, **space)

    if domain_gpus < num_gpus and (wider := plans(fixed, num_gpus)):
        return ConfigError(
            "--ep-domain",
            domain,
            f"a domain an EP group fits in: a {domain} holds {domain_gpus} GPUs, "
            f"and with --ep-domain any there are {len(wider)} plans (e.g. "
            f"{wider[0].label()})",
        )
    keys = {knob: key for key, knob in FIX_KEYS.items()}
    for knob in reversed([k for k in fixed if k in keys]):  # the last given first: most likely the one in conflict
        key = keys[knob]
        if without := plans({k: v for k, v in fixed.items() if k != knob}, domain_gpus):
            dense = (
                " (a dense model has no expert layers: its etp follows tp)" if knob == "etp" and is_dense(model) else ""
            )
            return ConfigError(
                f"--fix {key}",
                ",".join(map(str, fixed[knob])),
                f"values that admit a plan with the other --fix values{dense}: without this fix there "
                f"are {len(without)} plans, e.g. {key}={getattr(without[0], knob)}",
            )
    return ConfigError(
        "plan",
        f"{model.name} on {num_gpus} GPUs, global batch {global_batch}",
        "a GPU count, batch and --fix values that admit at least one plan (ep must divide "
        f"{model.num_experts} experts and fit the {domain} (--ep-domain), pp <= {model.num_layers} "
        "layers, the batch must split into whole microbatches)",
    )
