"""Expert placement (expert -> EP rank, per MoE layer) and dispatch under any placement.

Ranks are member indices within an EP group (0..ep-1); every EP group holding a layer (pipeline stage,
data-parallel replica) uses the same map, so expert gradients still pair up across replicas. Every
rank holds exactly E / ep experts (the memory model's assumption); swaps and the policies keep that.
The default placement is contiguous: expert e on rank e // (E / ep), as the simulator assumed before.
Pure numpy: no simpy, no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from piper_sim.errors import ConfigError
from piper_sim.workload.task_kinds import Role


def _frozen(a: np.ndarray) -> np.ndarray:
    a = np.array(a, dtype=np.int64)
    a.setflags(write=False)
    return a


def contiguous_owners(num_experts: int, ep: int) -> np.ndarray:
    return np.arange(num_experts, dtype=np.int64) // (num_experts // ep)


@dataclass(frozen=True, eq=False)
class ExpertPlacement:
    """owner[i, e] = EP rank holding expert e of layers[i]."""

    layers: tuple[int, ...]
    owner: np.ndarray  # int64 [len(layers), E], read-only
    ep: int
    _index: dict[int, int] = field(init=False, repr=False, compare=False)  # layer -> its row of owner

    def __post_init__(self) -> None:
        owner = _frozen(self.owner)
        object.__setattr__(self, "owner", owner)
        object.__setattr__(self, "layers", tuple(int(x) for x in self.layers))
        if owner.ndim != 2 or owner.shape[0] != len(self.layers):
            raise ValueError(f"owner must be [layers, experts]; got {owner.shape} for {len(self.layers)} layers")
        experts = owner.shape[1]
        if self.ep <= 0 or experts % self.ep:
            raise ConfigError("parallel.ep", self.ep, f"a divisor of num_experts ({experts})")
        if owner.size and (owner.min() < 0 or owner.max() >= self.ep):
            raise ValueError(f"owners must be EP ranks 0..{self.ep - 1}")
        per_rank = np.stack([np.bincount(row, minlength=self.ep) for row in owner]) if len(owner) else None
        if per_rank is not None and np.any(per_rank != experts // self.ep):
            bad = int(np.argwhere(per_rank != experts // self.ep)[0][0])
            raise ValueError(
                f"layer {self.layers[bad]}: every rank must hold {experts // self.ep} experts; "
                f"got {per_rank[bad].tolist()}"
            )
        object.__setattr__(self, "_index", {layer: i for i, layer in enumerate(self.layers)})

    @classmethod
    def contiguous(cls, layers: Sequence[int], num_experts: int, ep: int) -> ExpertPlacement:
        if ep <= 0 or num_experts % ep:
            raise ConfigError("parallel.ep", ep, f"a divisor of num_experts ({num_experts})")
        return cls(tuple(layers), np.tile(contiguous_owners(num_experts, ep), (len(layers), 1)), ep)

    @property
    def num_experts(self) -> int:
        return int(self.owner.shape[1])

    @property
    def experts_per_rank(self) -> int:
        return self.num_experts // self.ep

    def owners(self, layer: int) -> np.ndarray:
        """owner[e] for this layer (read-only)."""
        try:
            return self.owner[self._index[layer]]
        except KeyError:
            raise KeyError(f"layer {layer} is not placed (placed layers: {list(self.layers)})") from None

    def experts_on(self, layer: int, rank: int) -> np.ndarray:
        """Expert ids held by `rank` for this layer, ascending."""
        return np.flatnonzero(self.owners(layer) == rank)

    def with_owners(self, layer: int, owners: np.ndarray) -> ExpertPlacement:
        new = self.owner.copy()
        new[self._index[layer]] = owners
        return ExpertPlacement(self.layers, new, self.ep)

    def same_as(self, other: ExpertPlacement) -> bool:
        return self.layers == other.layers and self.ep == other.ep and np.array_equal(self.owner, other.owner)


@dataclass(frozen=True, eq=False)
class Dispatch:
    """One all-to-all under a placement: rows per (source, destination rank) and per rank's experts."""

    rows: np.ndarray  # int64 [source, destination rank], diagonal = rows that stay local
    tokens_per_rank: np.ndarray  # int64 [rank]: rows each rank's experts compute (= rows.sum(axis=0))
    local_rows: np.ndarray  # int64 [rank, j]: rows of the rank's j-th expert by ascending id, 0 past num_local
    num_local: np.ndarray  # int64 [rank]: experts the rank holds

    @cached_property
    def expert_rows(self) -> tuple[tuple[int, ...], ...]:
        """Per rank: rows of each expert it holds, ascending expert id."""
        return tuple(tuple(r[:n]) for r, n in zip(self.local_rows.tolist(), self.num_local.tolist(), strict=True))

    def bytes_matrix(self, row_bytes: int, role: str = Role.DISPATCH) -> np.ndarray:
        """[src, dst] bytes: dispatch sends rows to expert owners; combine is the transpose (results back)."""
        if role not in (Role.DISPATCH, Role.COMBINE):
            raise ValueError(f"role must be dispatch or combine, not {role!r}")
        matrix = self.rows * row_bytes
        return matrix.T.copy() if role == Role.COMBINE else matrix


def one_hot_owners(owners: np.ndarray, ep: int) -> np.ndarray:
    """[E, ep] with 1 where the expert lives."""
    out = np.zeros((len(owners), ep), dtype=np.int64)
    out[np.arange(len(owners)), owners] = 1
    return out


def dispatch(counts: np.ndarray, owners: np.ndarray, ep: int) -> Dispatch:
    """counts[source, expert] (kept rows) and owner[e] -> rows per (source, rank), per rank, per local expert.

    Conservation: rows.sum() == counts.sum(); each kept row goes to exactly one rank (its expert's owner)
    in the dispatch and comes back once in the combine (bytes_matrix(..., "combine")).
    """
    counts = np.asarray(counts, dtype=np.int64)
    owners = np.asarray(owners, dtype=np.int64)
    if counts.ndim != 2 or counts.shape[1] != len(owners):
        raise ValueError(f"counts must be [source, {len(owners)} experts]; got {counts.shape}")
    # rows to each rank: a float product (BLAS; numpy's integer one is a plain loop), exact for counts below 2^53
    rows = (counts.astype(np.float64) @ one_hot_owners(owners, ep).astype(np.float64)).astype(np.int64)
    per_expert = counts.sum(axis=0)
    by_owner = np.argsort(owners, kind="stable")  # experts grouped by owner, ascending id within each
    num_local = np.bincount(owners, minlength=ep)
    first = np.concatenate(([0], np.cumsum(num_local)[:-1]))
    local_rows = np.zeros((ep, int(num_local.max(initial=0))), dtype=np.int64)
    held = owners[by_owner]
    local_rows[held, np.arange(len(owners)) - first[held]] = per_expert[by_owner]
    return Dispatch(rows=rows, tokens_per_rank=rows.sum(axis=0), local_rows=local_rows, num_local=num_local)


def rank_loads(expert_loads: np.ndarray, owners: np.ndarray, ep: int) -> np.ndarray:
    """Load per rank: sum of its experts' loads (float64 [ep])."""
    return np.bincount(
        np.asarray(owners, dtype=np.int64), weights=np.asarray(expert_loads, dtype=np.float64), minlength=ep
    )
