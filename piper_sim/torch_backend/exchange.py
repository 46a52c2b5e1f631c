"""Building blocks of multi-phase all-to-all algorithms: keyed row chunks and padded exchange phases.

Owns the bookkeeping shared by the algorithms in a2a_algorithms.py. Every chunk of rows is named by its
key (source rank, destination rank), global ranks; a rank knows the size of every chunk whose source or
destination is on its node (`node_split_sizes`), which is every chunk it sends or receives in any
phase, so a phase is described by which keys each sender sends to each receiver, in order, and the
receiver evaluates the same description to know what it gets. Every message carries at least one row
(zero padding when empty), so no rank ever receives zero rows; the receiver strips the padding.
Only piper_sim.torch_backend may import torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor

Key = tuple[int, int]
KeysFn = Callable[[int, int], list[Key]]


@dataclass
class Holding:
    """The row chunks a rank currently holds, by key, plus every chunk's size."""

    sizes: dict[Key, int]
    template: Tensor  # an empty (0, *row_shape) tensor giving dtype, device and row shape
    chunks: dict[Key, Tensor] = field(default_factory=dict)

    def count(self, keys: Sequence[Key]) -> int:
        return sum(self.sizes[k] for k in keys)

    def padded(self, keys: Sequence[Key]) -> int:
        return max(self.count(keys), 1)

    def pack(self, keys: Sequence[Key]) -> Tensor:
        """Remove the chunks for keys and concatenate them; one zero row if they are all empty."""
        parts = [self.chunks.pop(k) for k in keys]
        if not self.count(keys):
            return self.template.new_zeros((1, *self.template.shape[1:]))
        return torch.cat(parts)

    def unpack(self, keys: Sequence[Key], rows: Tensor) -> None:
        """Store a received message's chunks, dropping the padding row if any."""
        counts = [self.sizes[k] for k in keys]
        for key, chunk in zip(keys, torch.split(rows[: sum(counts)], counts), strict=True):
            self.chunks[key] = chunk

    def take(self, keys: Sequence[Key]) -> Tensor:
        parts = [self.chunks.pop(k) for k in keys]
        return torch.cat(parts) if parts else self.template


@dataclass
class Pending:
    """An issued phase; finish() waits for it and stores what it received."""

    finish: Callable[[], None]


def node_split_sizes(
    row: Sequence[int],
    column: Sequence[int],
    ranks: Sequence[int],
    local: Sequence[int],
    node_group: dist.ProcessGroup | None,
    device: torch.device,
) -> dict[Key, int]:
    """sizes[(s, d)] for every chunk to or from this rank's node: one all_gather inside the node of each
    member's row (what it sends to each group member) and column (what each member sends it), in
    group order."""
    me = dist.get_rank()
    mine = torch.tensor([*row, *column], dtype=torch.int64, device=device)
    owners = sorted(local)
    if node_group is not None and len(owners) > 1:
        gathered = [torch.empty_like(mine) for _ in owners]
        dist.all_gather(gathered, mine, group=node_group)
    else:
        owners, gathered = [me], [mine]
    n = len(ranks)
    sizes: dict[Key, int] = {}
    for owner, both in zip(owners, gathered, strict=True):
        values = both.tolist()
        for i, other in enumerate(ranks):
            sizes[(owner, other)] = int(values[i])
            sizes[(other, owner)] = int(values[n + i])
    return sizes


def a2a_phase(
    hold: Holding, me: int, members: Sequence[int], keys_fn: KeysFn, group: dist.ProcessGroup | None
) -> Pending:
    """All-to-all among members (sorted global ranks of `group`): keys_fn(sender, receiver) per pair."""
    members = sorted(members)
    send = [hold.pack(keys_fn(me, t)) for t in members]
    recv_keys = [keys_fn(s, me) for s in members]
    if len(members) == 1:
        hold.unpack(recv_keys[0], send[0])
        return Pending(lambda: None)
    recv_sizes = [hold.padded(keys) for keys in recv_keys]
    out = hold.template.new_empty((sum(recv_sizes), *hold.template.shape[1:]))
    work = dist.all_to_all_single(out, torch.cat(send), recv_sizes, [len(c) for c in send], group=group, async_op=True)

    def finish() -> None:
        work.wait()
        for keys, chunk in zip(recv_keys, torch.split(out, recv_sizes), strict=True):
            hold.unpack(keys, chunk)

    return Pending(finish)


def p2p_phase(hold: Holding, sends: dict[int, list[Key]], recvs: dict[int, list[Key]]) -> Pending:
    """Batched asynchronous point-to-point messages: sends[peer] / recvs[peer] list the keys of each."""
    ops = [dist.P2POp(dist.isend, hold.pack(keys), peer) for peer, keys in sends.items()]
    buffers = {
        peer: hold.template.new_empty((hold.padded(keys), *hold.template.shape[1:])) for peer, keys in recvs.items()
    }
    ops += [dist.P2POp(dist.irecv, buf, peer) for peer, buf in buffers.items()]
    works = dist.batch_isend_irecv(ops) if ops else []

    def finish() -> None:
        for work in works:
            work.wait()
        for peer, keys in recvs.items():
            hold.unpack(keys, buffers[peer])

    return Pending(finish)


@dataclass(frozen=True)
class NodeLayout:
    """An EP group seen through its nodes: its nodes and the group's ranks on each."""

    ranks: tuple[int, ...]
    node_of: dict[int, int]
    nodes: tuple[int, ...]
    local_ranks: dict[int, tuple[int, ...]]  # node -> the group's ranks on it, in group order

    @classmethod
    def of(cls, ranks: Sequence[int], node_of: dict[int, int]) -> NodeLayout:
        missing = [r for r in ranks if r not in node_of]
        if missing:
            raise ValueError(f"node_of has no node for ranks {missing}")
        nodes = tuple(sorted({node_of[r] for r in ranks}))
        local = {n: tuple(r for r in ranks if node_of[r] == n) for n in nodes}
        return cls(tuple(ranks), {r: node_of[r] for r in ranks}, nodes, local)

    def local(self, node: int) -> tuple[int, ...]:
        return self.local_ranks[node]

    def local_index(self, rank: int) -> int:
        return self.local_ranks[self.node_of[rank]].index(rank)
