"""Mesh: the pp x dp x ep x tp rank layout of a parallel plan, and the rank <-> coordinate map.

Owns rank numbering (tp innermost, then ep, dp, pp), a rank's pipeline stage and peers, and its collective
groups along an axis (cached). Pure data: the schedule IR (piper_sim.schedule.ir) and ParallelSpec use it.
Must not import piper_sim.schedule, simpy, torch or numpy.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

GROUP_AXES = ("ep", "dp", "ep_dp")


@dataclass(frozen=True, kw_only=True, slots=True)
class Mesh:
    """Rank layout: rank = ((pp_index * dp + dp_index) * ep + ep_index) * tp + tp_index.

    tp is innermost, then ep, so an expert-parallel group is a block of consecutive ranks and lands
    inside one node under contiguous placement.
    """

    pp: int
    dp: int = 1
    ep: int = 1
    tp: int = 1

    @property
    def num_ranks(self) -> int:
        return self.pp * self.dp * self.ep * self.tp

    def coords(self, rank: int) -> dict[str, int]:
        tp_index = rank % self.tp
        ep_index = rank // self.tp % self.ep
        dp_index = rank // (self.tp * self.ep) % self.dp
        pp_index = rank // (self.tp * self.ep * self.dp)
        return {"pp": pp_index, "dp": dp_index, "ep": ep_index, "tp": tp_index}

    def rank_of(self, *, pp: int, dp: int = 0, ep: int = 0, tp: int = 0) -> int:
        return ((pp * self.dp + dp) * self.ep + ep) * self.tp + tp

    def stage_of(self, rank: int) -> int:
        return rank // (self.tp * self.ep * self.dp)

    def stage_ranks(self, pp_index: int) -> range:
        size = self.tp * self.ep * self.dp
        return range(pp_index * size, (pp_index + 1) * size)

    def peer(self, rank: int, peer_stage: int) -> int:
        """The rank at another pipeline stage with the same dp, ep and tp coordinates."""
        c = self.coords(rank)
        return self.rank_of(pp=peer_stage, dp=c["dp"], ep=c["ep"], tp=c["tp"])

    def group(self, rank: int, axis: str) -> tuple[int, ...]:
        """Ranks of the collective group of `rank` along `axis` ("ep", "dp" or "ep_dp")."""
        return _group(self, rank, axis)

    def _group_uncached(self, rank: int, axis: str) -> tuple[int, ...]:
        c = self.coords(rank)
        eps = range(self.ep) if axis in ("ep", "ep_dp") else (c["ep"],)
        dps = range(self.dp) if axis in ("dp", "ep_dp") else (c["dp"],)
        if axis not in GROUP_AXES:
            raise ValueError(f"unknown group axis {axis!r}; allowed: {GROUP_AXES}")
        return tuple(self.rank_of(pp=c["pp"], dp=d, ep=e, tp=c["tp"]) for d in dps for e in eps)

    def groups(self, axis: str, pp_index: int) -> list[tuple[int, ...]]:
        """All distinct groups along `axis` in one pipeline stage."""
        seen: dict[tuple[int, ...], None] = {}
        for rank in self.stage_ranks(pp_index):
            seen.setdefault(self.group(rank, axis), None)
        return list(seen)



@functools.lru_cache(maxsize=1 << 16)
def _group(mesh: Mesh, rank: int, axis: str) -> tuple[int, ...]:
    return mesh._group_uncached(rank, axis)
