"""The plan space: every knob of a parallel plan, Piper's constraints on it, and its enumeration.

Owns PlanPoint (one candidate: pp, ep, dp, tp, etp, sp, vpp, micro-batch size, microbatches, schedule,
all-to-all, activation recomputation, ZeRO stage), parse_fixes (--fix) and enumerate_plans with the constraints
that need no memory model: the mesh uses all GPUs, ep divides the experts, tp divides the heads and FFN widths
and a node's GPUs (etp 1 and sequence parallelism unless --fix asks otherwise), pp x vpp <= layers, the global batch
splits into whole microbatches, an EP group fits the locality domain asked for (node, switch or dragonfly
group of the topology), optimizer sharding only with more than one replica, and each schedule's own rules
(interleaved needs vpp >= 2 and microbatches a multiple of pp; the others vpp = 1; duplicates
dropped: ZB-H1 at pp 1 is 1F1B). Memory (the stage-0 bottleneck) is resource.py's. Pure: no simpy, torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from piper_sim.config import RECOMPUTE_MODES, ZERO_STAGES
from piper_sim.errors import ConfigError
from piper_sim.workload.model import ModelSpec
from piper_sim.workload.parallel import ParallelSpec, tensor_split_widths

SCHEDULE_NAMES = ("1f1b", "gpipe", "interleaved-1f1b", "zb-h1", "dualpipe", "dualpipe-v")
A2A_NAMES = ("flat", "halo")
DOMAINS = ("node", "switch", "group", "any")


@dataclass(frozen=True, kw_only=True)
class PlanPoint:
    pp: int
    ep: int
    dp: int
    vpp: int
    micro_batch_size: int
    num_microbatches: int
    schedule: str
    all_to_all: str
    recompute: str = "none"
    zero: int = 0
    tp: int = 1
    etp: int = 1
    sp: bool = False

    @property
    def num_gpus(self) -> int:
        return self.pp * self.ep * self.dp * self.etp

    @property
    def parallel(self) -> ParallelSpec:
        return ParallelSpec(pp=self.pp, ep=self.ep, dp=self.dp, tp=self.tp, etp=self.etp, sp=self.sp, vpp=self.vpp,
                            num_microbatches=self.num_microbatches, micro_batch_size=self.micro_batch_size)

    def label(self) -> str:
        vpp = f" vpp{self.vpp}" if self.vpp > 1 else ""
        tp = (f" tp{self.tp}" + (f" etp{self.etp}" if self.etp > 1 else "") + (" sp" if self.sp else "")
              if self.tp > 1 else "")
        extra = (f" rc-{self.recompute}" if self.recompute != "none" else "") + (f" z{self.zero}" if self.zero else "")
        return (f"pp{self.pp} ep{self.ep} dp{self.dp}{tp}{vpp} mbs{self.micro_batch_size} x{self.num_microbatches} "
                f"{self.schedule} {self.all_to_all}{extra}")

    def config_sections(self) -> dict:
        """The config sections this point sets (merged over the base config)."""
        return {"parallel": {"pp": self.pp, "ep": self.ep, "dp": self.dp, "tp": self.tp, "etp": self.etp,
                             "sp": self.sp, "vpp": self.vpp,
                             "num_microbatches": self.num_microbatches, "micro_batch_size": self.micro_batch_size},
                "schedule": self.schedule, "collectives": {"all_to_all": self.all_to_all},
                "recompute": self.recompute, "optimizer": {"zero": self.zero}}

    def as_row(self) -> dict:
        return asdict(self)


KNOB_NAMES = tuple(f.name for f in fields(PlanPoint))
# --fix keys as users write them (config keys) -> knob
FIX_KEYS = {"parallel.pp": "pp", "parallel.ep": "ep", "parallel.dp": "dp", "parallel.vpp": "vpp",
            "parallel.tp": "tp", "parallel.etp": "etp", "parallel.sp": "sp",
            "parallel.micro_batch_size": "micro_batch_size", "parallel.num_microbatches": "num_microbatches",
            "schedule": "schedule", "collectives.all_to_all": "all_to_all", "recompute": "recompute",
            "optimizer.zero": "zero"}
DEFAULT_MICRO_BATCH_SIZES = (1, 2, 4)
DEFAULT_VPP = (1, 2, 4)
DEFAULT_TP = (1, 2)


def parse_fixes(items: list[str]) -> dict[str, tuple]:
    """--fix KEY=VALUE[,VALUE...] -> {knob: allowed values}; KEY is a config key (parallel.pp) or a knob (pp)."""
    out: dict[str, tuple] = {}
    for item in items:
        key, sep, value = item.partition("=")
        knob = FIX_KEYS.get(key, key if key in KNOB_NAMES else None)
        if not sep or knob is None or not value:
            raise ConfigError("--fix", item, f"KEY=VALUE[,VALUE...] with KEY one of {', '.join(FIX_KEYS)}")
        values = tuple(v.strip() for v in value.split(","))
        if knob == "sp":
            flags = {"true": True, "false": False}
            bad = [v for v in values if v.lower() not in flags]
            if bad:
                raise ConfigError(f"--fix {key}", bad[0], "true or false")
            out[knob] = tuple(flags[v.lower()] for v in values)
            continue
        if knob in ("schedule", "all_to_all", "recompute"):
            allowed = {"schedule": SCHEDULE_NAMES, "all_to_all": A2A_NAMES, "recompute": RECOMPUTE_MODES}[knob]
            bad = [v for v in values if v not in allowed]
            if bad:
                raise ConfigError(f"--fix {key}", bad[0], f"one of {', '.join(allowed)}")
            out[knob] = values
        else:
            try:
                ints = tuple(int(v) for v in values)
            except ValueError:
                raise ConfigError(f"--fix {key}", value, "positive integers") from None
            if knob == "zero" and any(v not in ZERO_STAGES for v in ints):
                raise ConfigError(f"--fix {key}", value, "0, 1 or 2")
            if knob != "zero" and any(v <= 0 for v in ints):
                raise ConfigError(f"--fix {key}", value, "positive integers")
            out[knob] = ints
    return out


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def enumerate_plans(model: ModelSpec, num_gpus: int, global_batch: int, *, domain_gpus: int,
                    fixed: dict[str, tuple] | None = None, schedules: tuple[str, ...] = SCHEDULE_NAMES,
                    all_to_alls: tuple[str, ...] = A2A_NAMES, recomputes: tuple[str, ...] = ("none",),
                    zeros: tuple[int, ...] = (0,), node_gpus: int = 1, tps: tuple[int, ...] = DEFAULT_TP
                    ) -> list[PlanPoint]:
    """Every plan that satisfies the structural constraints, in a fixed order.

    global_batch: sequences per step (= micro_batch_size x num_microbatches x the data-parallel replicas, dp x ep
    x etp / tp). domain_gpus: the largest EP group allowed (the locality domain's GPU count; num_gpus for "any").
    node_gpus: GPUs per node (a tensor-parallel group stays inside one); tps: the tensor-parallel degrees tried,
    each with etp 1 and sequence parallelism unless fixed otherwise (Megatron-core's MoE form)."""
    fixed = fixed or {}
    _check_fixed(fixed, num_gpus, global_batch)

    def allowed(knob: str, values) -> list:
        return [v for v in values if knob not in fixed or v in fixed[knob]]

    out = []
    for tp in allowed("tp", sorted(set(tps) | set(fixed.get("tp", ())))):
        if tp > 1 and (node_gpus % tp or not _splits(model, tp)):
            continue
        for etp in allowed("etp", sorted({1, tp} if "etp" in fixed else {1})):
            for sp in allowed("sp", (True, False) if tp > 1 and "sp" in fixed else ((tp > 1),)):
                out.extend(_plans_at(model, num_gpus, global_batch, domain_gpus, allowed, fixed, schedules,
                                     all_to_alls, recomputes, zeros, tp, etp, sp, node_gpus))
    return out


def _zeros(zeros: tuple[int, ...], schedule: str, replicated: bool) -> tuple[int, ...]:
    """ZeRO stages a plan may use: none without replicas; not 2 under DualPipe (config.py says why)."""
    if not replicated:
        return (0,)
    return tuple(z for z in zeros if not (z == 2 and schedule == "dualpipe"))


def _splits(model: ModelSpec, tp: int) -> bool:
    return all(width % tp == 0 for _, width in tensor_split_widths(model))


def _plans_at(model: ModelSpec, num_gpus: int, global_batch: int, domain_gpus: int, allowed, fixed: dict,
              schedules: tuple[str, ...], all_to_alls: tuple[str, ...], recomputes: tuple[str, ...],
              zeros: tuple[int, ...], tp: int, etp: int, sp: bool, node_gpus: int) -> list[PlanPoint]:
    out = []
    for pp in allowed("pp", [d for d in divisors(num_gpus) if d <= model.num_layers]):
        stage = num_gpus // pp
        if stage % etp:
            continue
        for ep in allowed("ep", [d for d in divisors(stage // etp)
                                 if model.num_experts % d == 0 and d * etp <= domain_gpus
                                 and (etp > 1 or d % tp == 0)]):
            dp = stage // (ep * etp)
            if "dp" in fixed and dp not in fixed["dp"]:
                continue
            replicas = stage // tp
            if global_batch % replicas:
                continue
            for mbs in allowed("micro_batch_size", [b for b in DEFAULT_MICRO_BATCH_SIZES + tuple(fixed.get(
                    "micro_batch_size", ())) if (global_batch // replicas) % b == 0
                    and (tp == 1 or (b * model.seq_len) % tp == 0)]):
                m = global_batch // replicas // mbs
                if "num_microbatches" in fixed and m not in fixed["num_microbatches"]:
                    continue
                for schedule in allowed("schedule", schedules):
                    for vpp in allowed("vpp", sorted(set(DEFAULT_VPP + tuple(fixed.get("vpp", ()))))):
                        if not _schedule_allows(schedule, pp, vpp, m, model.num_layers):
                            continue
                        for a2a in _all_to_alls(allowed("all_to_all", all_to_alls), ep * etp, node_gpus):
                            for recompute in allowed("recompute", recomputes):
                                for zero in allowed("zero", _zeros(zeros, schedule, replicas > 1 or dp > 1)):
                                    out.append(PlanPoint(pp=pp, ep=ep, dp=dp, vpp=vpp, micro_batch_size=mbs,
                                                         num_microbatches=m, schedule=schedule, all_to_all=a2a,
                                                         recompute=recompute, zero=zero, tp=tp, etp=etp, sp=sp))
    return out


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
    for knob in ("pp", "ep", "dp", "tp", "etp"):
        for v in fixed.get(knob, ()):
            if num_gpus % v:
                raise ConfigError(f"--fix parallel.{knob}", v, f"a divisor of the GPU count ({num_gpus})")
    if global_batch <= 0:
        raise ConfigError("--global-batch", global_batch, "a positive number of sequences")
