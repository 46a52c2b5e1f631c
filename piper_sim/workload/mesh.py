"""Mesh: the pp x dp x ep x etp rank layout of a parallel plan, its tensor-parallel groups, and the rank <->
coordinate map.

Owns rank numbering, a rank's pipeline stage and peers, and its collective groups along an axis (cached).
Pure data: the schedule IR (piper_sim.schedule.ir) and ParallelSpec use it. Must not import
piper_sim.schedule, simpy, torch or numpy.

Layout (docs/tensor-parallel.md): rank = ((pp_index * dp + dp_index) * ep + ep_index) * etp + etp_index.
A pipeline stage holds dp x ep x etp ranks. The routed experts of a layer are spread over the ep ranks of an
expert-parallel group, each expert's FFN split over etp ranks. Attention and dense FFNs are split over tp
consecutive ranks (a tensor-parallel group), so a rank's tp index is rank % tp:
- etp == tp: an expert-parallel group holds the ranks of one tp index (experts are split like the FFNs);
- etp == 1 (tp divides ep): a tensor-parallel group lies inside an expert-parallel group, whose tp ranks
  hold different experts.
With tp == etp == 1 the layout is pp x dp x ep.
With context parallelism (cp > 1; docs/context-parallel.md) the dense layers see a stage as tp x cp x (dense replicas),
tp fastest, then cp, as Megatron-core orders its ranks (tp-cp-ep-dp-pp, megatron/core/parallel_state.py): a CP group
is the cp ranks of a stage with the same tp index and the same dense replica, a stride of tp apart; the experts keep
the stage's dp x ep x etp layout (Megatron-core's MoE parallel folding carves them out of tp x cp x dp).
Under DualPipe's bidirectional layout stage p and stage pp - 1 - p hold the same layers; the "mirror" group (a rank
and its counterpart there, same dp, ep and etp coordinates) sums the two copies' gradients.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

GROUP_AXES = ("ep", "dp", "ep_dp", "tp", "stage", "mirror", "cp", "dp_shard", "ep_dp_shard", "stage_shard", "replicate")


@dataclass(frozen=True, kw_only=True, slots=True)
class Mesh:
    """Rank layout (module docstring). Group axes: "ep" (expert parallel: an all-to-all's members), "dp" (the
    replicas of an expert shard: expert gradients), "ep_dp" (the replicas of a tensor-parallel shard of the
    dense layers: dense gradients), "tp" (a tensor-parallel group), "stage" (every rank of the stage: the
    gradients of parameters every rank of the stage holds whole when tp > 1), "mirror" (the rank and its counterpart
    at stage pp - 1 - p: DualPipe's two copies of the same layers), "cp" (a context-parallel group: the ranks that
    hold one micro-batch's sequence chunks and pass its keys and values around their ring); under HSDP (replicate > 1:
    the dp index split into replicate blocks, outermost, as torchtitan's dp_replicate x dp_shard) "dp_shard",
    "ep_dp_shard" and "stage_shard" (the members of that group in the rank's block: ZeRO-3's shard group) and
    "replicate" (the rank's counterparts in the other blocks, which hold the same shards)."""

    pp: int
    dp: int = 1
    ep: int = 1
    tp: int = 1
    etp: int = 1
    cp: int = 1
    replicate: int = 1  # HSDP: replicas of each ZeRO-3 shard (a divisor of dp)

    def __post_init__(self) -> None:
        if self.etp not in (1, self.tp):
            raise ValueError(f"etp must be 1 or tp ({self.tp}), not {self.etp}")
        if self.stage_size % (self.tp * self.cp):
            raise ValueError(f"tp x cp ({self.tp} x {self.cp}) must divide a stage's {self.stage_size} ranks")
        if self.etp == 1 and self.ep % self.tp:
            raise ValueError(f"with etp 1, tp ({self.tp}) must divide ep ({self.ep})")

    @property
    def stage_size(self) -> int:
        return self.dp * self.ep * self.etp

    @property
    def num_ranks(self) -> int:
        return self.pp * self.stage_size

    @property
    def data_parallel(self) -> int:
        """Replicas of the dense layers' tensor-parallel shards in a stage (the "ep_dp" group: Megatron-core's data
        and context parallel ranks, over which it reduces the dense gradients)."""
        return self.stage_size // self.tp

    @property
    def batch_parallel(self) -> int:
        """Ranks of a stage that feed distinct micro-batches: one per tensor- and context-parallel group."""
        return self.stage_size // (self.tp * self.cp)

    def coords(self, rank: int) -> dict[str, int]:
        """pp, dp, ep, etp indices of the layout, and tp: the rank's index in its tensor-parallel group."""
        etp_index = rank % self.etp
        ep_index = rank // self.etp % self.ep
        dp_index = rank // (self.etp * self.ep) % self.dp
        pp_index = rank // self.stage_size
        return {
            "pp": pp_index,
            "dp": dp_index,
            "ep": ep_index,
            "etp": etp_index,
            "tp": rank % self.tp,
            "cp": rank % self.stage_size // self.tp % self.cp,
        }

    def rank_of(self, *, pp: int, dp: int = 0, ep: int = 0, etp: int = 0) -> int:
        return ((pp * self.dp + dp) * self.ep + ep) * self.etp + etp

    def stage_of(self, rank: int) -> int:
        return rank // self.stage_size

    def stage_ranks(self, pp_index: int) -> range:
        return range(pp_index * self.stage_size, (pp_index + 1) * self.stage_size)

    def peer(self, rank: int, peer_stage: int) -> int:
        """The rank at another pipeline stage with the same dp, ep and etp (hence tp) coordinates."""
        return rank + (peer_stage - self.stage_of(rank)) * self.stage_size

    def group(self, rank: int, axis: str) -> tuple[int, ...]:
        """Ranks of the collective group of `rank` along `axis` (GROUP_AXES)."""
        return _group(self, rank, axis)

    def _group_uncached(self, rank: int, axis: str) -> tuple[int, ...]:
        if axis not in GROUP_AXES:
            raise ValueError(f"unknown group axis {axis!r}; allowed: {GROUP_AXES}")
        stage = self.stage_ranks(self.stage_of(rank))
        if axis == "stage":
            return tuple(stage)
        if axis == "mirror":
            return tuple(sorted({rank, self.peer(rank, self.pp - 1 - self.stage_of(rank))}))
        if axis == "tp":
            first = rank - rank % self.tp
            return tuple(range(first, first + self.tp))
        if axis == "cp":  # same tp index and dense replica: a stride of tp (a stage starts at a multiple of tp x cp)
            first = rank - (rank % self.stage_size) // self.tp % self.cp * self.tp
            return tuple(range(first, first + self.cp * self.tp, self.tp))
        if axis.endswith("_shard") or axis == "replicate":  # HSDP: blocks of dp / replicate dp indices
            return self._hsdp_group(rank, axis)
        if axis == "ep_dp":  # the stage's ranks of this tp index (a stage starts at a multiple of tp)
            return tuple(range(stage.start + (rank - stage.start) % self.tp, stage.stop, self.tp))
        c = self.coords(rank)
        eps = range(self.ep) if axis == "ep" else (c["ep"],)
        dps = range(self.dp) if axis == "dp" else (c["dp"],)
        return tuple(self.rank_of(pp=c["pp"], dp=d, ep=e, etp=c["etp"]) for d in dps for e in eps)

    def _hsdp_group(self, rank: int, axis: str) -> tuple[int, ...]:
        block = self.dp // self.replicate
        c = self.coords(rank)
        if axis == "replicate":
            return tuple(rank + (k - c["dp"] // block) * block * self.ep * self.etp for k in range(self.replicate))
        return tuple(
            r
            for r in self.group(rank, axis.removesuffix("_shard"))
            if self.coords(r)["dp"] // block == c["dp"] // block
        )

    def groups(self, axis: str, pp_index: int) -> list[tuple[int, ...]]:
        """All distinct groups along `axis` in one pipeline stage."""
        seen: dict[tuple[int, ...], None] = {}
        for rank in self.stage_ranks(pp_index):
            seen.setdefault(self.group(rank, axis), None)
        return list(seen)


@functools.lru_cache(maxsize=1 << 16)
def _group(mesh: Mesh, rank: int, axis: str) -> tuple[int, ...]:
    return mesh._group_uncached(rank, axis)
