"""ParallelSpec: the parallel plan (pp x dp x ep x etp mesh with tp and cp groups, virtual stages, microbatches).

Owns plan validation against a model and a GPU count, and the mesh it lays out (mesh.py). Pure data;
must not import piper_sim.schedule.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from piper_sim.bounds import GPUS_LIMIT
from piper_sim.errors import ConfigError
from piper_sim.workload.fsdp import hsdp_replicate
from piper_sim.workload.mesh import Mesh
from piper_sim.workload.model import ModelSpec


@dataclass(frozen=True, kw_only=True)
class TensorSplit:
    """How a plan splits each layer over its tensor-parallel group (docs/tensor-parallel.md): attention heads,
    dense FFNs, the embedding's and head's vocabulary over tp ranks; each expert's FFN (and the shared experts')
    over etp ranks; sp: the activations between the split regions split by sequence; cp: each sequence split over
    cp ranks, the attention core's keys and values passed around their ring (docs/context-parallel.md)."""

    tp: int = 1
    sp: bool = False
    etp: int = 1
    cp: int = 1

    @property
    def dispatch_share(self) -> float:
        """Share of a micro-batch's tokens a rank routes: all of them when the experts are split like the
        dense layers (etp == tp), its 1/tp slice when the group's ranks hold different experts (etp 1)."""
        return self.etp / self.tp

    @property
    def sequence_share(self) -> float:
        """Share of the tokens' activations a rank keeps between the split regions (1/tp under sp)."""
        return 1 / self.tp if self.sp else 1.0


NO_SPLIT = TensorSplit()


@dataclass(frozen=True, kw_only=True)
class ParallelSpec:
    """A parallel plan in piper-sim's own form (docs/tensor-parallel.md): pp stages of dp x ep x etp ranks;
    ep expert-parallel ranks per group, each expert split over etp ranks; attention and dense FFNs split over
    tp ranks (tp consecutive ranks; etp is 1 or tp); sp: sequence parallelism inside the tp group; cp: context
    parallelism, each micro-batch's sequence split over cp ranks of the dense layers' replicas
    (docs/context-parallel.md)."""

    pp: int = 1
    ep: int = 1
    dp: int = 1
    tp: int = 1
    etp: int = 1
    sp: bool = False
    vpp: int = 1
    num_microbatches: int = 1
    micro_batch_size: int = 1
    world_size: int = 0  # when given, must equal pp * dp * ep * etp
    cp: int = 1
    dp_shard: int = 0  # ZeRO-3 under HSDP: the ranks a shard spans (0: every data-parallel replica; workload/fsdp.py)

    def __post_init__(self) -> None:
        for key in ("pp", "ep", "dp", "tp", "etp", "vpp", "num_microbatches", "micro_batch_size", "cp"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"parallel.{key}", value, "a positive integer")
            if value > MAX_DEGREE:
                raise ConfigError(f"parallel.{key}", value, f"at most {MAX_DEGREE}")
        if not isinstance(self.sp, bool):
            raise ConfigError("parallel.sp", self.sp, "true or false")
        if self.sp and self.tp == 1:
            raise ConfigError(
                "parallel.sp",
                self.sp,
                "false unless parallel.tp > 1 (sequence parallelism splits the tensor-parallel group's activations)",
            )
        if self.etp not in (1, self.tp):
            raise ConfigError("parallel.etp", self.etp, f"1 or parallel.tp ({self.tp})")
        if self.etp == 1 and self.ep % self.tp:
            raise ConfigError(
                "parallel.tp",
                self.tp,
                f"a divisor of parallel.ep ({self.ep}) when parallel.etp is 1 "
                "(a tensor-parallel group lies inside an expert-parallel group); or set etp to tp",
            )
        if (self.dp * self.ep * self.etp) % (self.tp * self.cp):
            raise ConfigError(
                "parallel.cp",
                self.cp,
                f"a divisor of a stage's dense replicas, dp x ep x etp / tp = "
                f"{self.dp * self.ep * self.etp / self.tp:g} (the context-parallel ranks of a "
                "micro-batch are data-parallel ranks of the dense layers, as in Megatron-core)",
            )
        hsdp_replicate(self.dp_shard, data_parallel=self.data_parallel, dp=self.dp)
        product = self.num_gpus
        if product > GPUS_LIMIT:
            raise ConfigError(
                "parallel",
                f"pp*dp*ep*etp = {self.pp}*{self.dp}*{self.ep}*{self.etp} = {product:,} GPUs",
                f"at most {GPUS_LIMIT:,} GPUs",
            )
        if self.world_size and self.world_size != product:
            raise ConfigError(
                "parallel.world_size",
                self.world_size,
                f"pp*dp*ep*etp = {self.pp}*{self.dp}*{self.ep}*{self.etp} = {product}",
            )

    @property
    def num_gpus(self) -> int:
        return self.pp * self.dp * self.ep * self.etp

    @property
    def mesh(self) -> Mesh:
        return Mesh(
            pp=self.pp, dp=self.dp, ep=self.ep, tp=self.tp, etp=self.etp, cp=self.cp, replicate=self.dp_replicate
        )

    @functools.cached_property
    def dp_replicate(self) -> int:
        """HSDP: the replicas of each ZeRO-3 shard (1 without parallel.dp_shard; computed once: the planner asks for it
        per stage of thousands of plans)."""
        return hsdp_replicate(self.dp_shard, data_parallel=self.data_parallel, dp=self.dp)

    @property
    def data_parallel(self) -> int:
        """Replicas of the dense layers' tensor-parallel shards: the stage's ranks over tp (the context-parallel
        ranks among them: Megatron-core reduces the dense gradients over DP x CP)."""
        return self.dp * self.ep * self.etp // self.tp

    @property
    def batch_parallel(self) -> int:
        """Ranks of a stage that feed distinct micro-batches: one per tensor- and context-parallel group."""
        return self.data_parallel // self.cp

    @property
    def sequences_per_step(self) -> int:
        """Global batch in sequences: every tensor- and context-parallel group of a stage feeds its own
        micro-batches."""
        return self.micro_batch_size * self.num_microbatches * self.batch_parallel

    def tokens_per_microbatch(self, seq_len: int) -> int:
        """Tokens of a micro-batch a rank holds: all of its sequences' tokens, or their 1/cp chunks."""
        return self.micro_batch_size * seq_len // self.cp

    @functools.cached_property
    def split(self) -> TensorSplit:
        return TensorSplit(tp=self.tp, sp=self.sp, etp=self.etp, cp=self.cp)

    def validate(self, model: ModelSpec, num_gpus: int | None = None) -> None:
        """Raise ConfigError naming the key when the plan cannot run this model."""
        if num_gpus is not None and self.num_gpus != num_gpus:
            raise ConfigError("parallel", f"pp*dp*ep*etp = {self.num_gpus}", f"equal to the GPU count ({num_gpus})")
        if model.num_experts % self.ep:
            raise ConfigError("parallel.ep", self.ep, f"a divisor of model.num_experts ({model.num_experts})")
        if self.pp * self.vpp > model.num_layers:
            raise ConfigError(
                "parallel.pp", self.pp, f"pp * vpp <= model.num_layers ({model.num_layers}); vpp is {self.vpp}"
            )
        if self.tp > 1:
            for what, width in tensor_split_widths(model):
                if width % self.tp:
                    raise ConfigError("parallel.tp", self.tp, f"a divisor of {what} ({width})")
        if self.etp > 1 and model.expert_ffn_dim % self.etp:
            raise ConfigError("parallel.etp", self.etp, f"a divisor of model.expert_ffn_dim ({model.expert_ffn_dim})")
        if self.cp > 1 and model.seq_len % (2 * self.cp):
            raise ConfigError(
                "parallel.cp",
                self.cp,
                f"a degree whose 2 x cp chunks divide model.seq_len "
                f"({model.seq_len}): each rank holds two of them (Megatron-core's load-balanced causal "
                "split)",
            )
        tokens = self.tokens_per_microbatch(model.seq_len)
        if self.tp > 1 and tokens % self.tp and (self.sp or self.etp == 1):
            raise ConfigError(
                "parallel.tp",
                self.tp,
                f"a divisor of a micro-batch's tokens ({tokens}) when the "
                "tensor-parallel group splits them (sp, or etp 1)",
            )


MAX_DEGREE = 1 << 20
CONVENTIONS = ("piper", "megatron")


def parallel_from_section(section: dict) -> ParallelSpec:
    """The parallel section as written: piper-sim's own form, or `convention: megatron` with Megatron-core's
    degrees (docs/tensor-parallel.md): dp is then the data-parallel size (GPUs over tp x cp x pp), the experts are
    carved out of the tp x cp x dp ranks of a stage (ep x etp x expert-dp), and etp defaults to tp as in
    Megatron-core. Both give the same ParallelSpec."""
    values = dict(section)
    convention = values.pop("convention", "piper")
    if convention not in CONVENTIONS:
        raise ConfigError("parallel.convention", convention, " or ".join(CONVENTIONS))
    if convention == "megatron":
        values = _from_megatron(values)
    try:
        return ParallelSpec(**values)
    except TypeError as exc:
        raise ConfigError("parallel", section, str(exc)) from None


def _from_megatron(values: dict) -> dict:
    out = dict(values)
    tp, dp, ep, cp = out.get("tp", 1), out.get("dp", 1), out.get("ep", 1), out.get("cp", 1)
    etp = out.setdefault("etp", tp)
    for key, value in (("tp", tp), ("dp", dp), ("ep", ep), ("etp", etp), ("cp", cp)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError(f"parallel.{key}", value, "a positive integer")
    if (tp * cp * dp) % (ep * etp):
        raise ConfigError(
            "parallel.dp",
            dp,
            f"a data-parallel size such that ep x etp ({ep} x {etp}) divides the "
            f"tp x cp x dp ranks of a stage ({tp} x {cp} x {dp}): Megatron-core carves the experts out "
            "of them",
        )
    out["dp"] = tp * cp * dp // (ep * etp)
    return out


def megatron_degrees(spec: ParallelSpec) -> dict[str, int]:
    """The plan as Megatron-core counts it, the inverse of `convention: megatron`: TP, PP, EP, ETP, DP (the
    data-parallel size, GPUs / (TP x CP x PP)), VPP, EDP (the experts' data parallelism, piper-sim's dp) and CP."""
    return {
        "TP": spec.tp,
        "PP": spec.pp,
        "EP": spec.ep,
        "ETP": spec.etp,
        "DP": spec.num_gpus // (spec.tp * spec.cp * spec.pp),
        "VPP": spec.vpp,
        "EDP": spec.dp,
        **({"CP": spec.cp} if spec.cp > 1 else {}),
    }


def tensor_split_widths(model: ModelSpec) -> list[tuple[str, int]]:
    """The widths tensor parallelism splits (Megatron: attention heads and the FFNs' inner width)."""
    widths = [("model.num_heads", model.num_heads)]
    if model.mla is None:
        widths.append(("the key/value heads (model.num_kv_heads)", model.kv_heads))
    if any(not model.is_moe_layer(layer) for layer in range(model.num_layers)):
        widths.append(("the dense FFN width", model.dense_ffn_dim or model.expert_ffn_dim))
    if model.num_shared_experts:
        widths.append(("model.shared_ffn_dim", model.shared_ffn_dim))
    return widths


def stage_layer_split(num_layers: int, num_virtual_stages: int) -> tuple[tuple[int, ...], ...]:
    """Contiguous layer ranges per virtual stage, as even as possible (earlier stages get the extra)."""
    base, extra = divmod(num_layers, num_virtual_stages)
    out, start = [], 0
    for v in range(num_virtual_stages):
        size = base + (1 if v < extra else 0)
        out.append(tuple(range(start, start + size)))
        start += size
    return tuple(out)
