"""All-to-all algorithms on torch.distributed with uneven splits, chosen by name from a registry.

Owns: flat (split sizes exchanged, then one all_to_all_single), pairwise (P-1 rounds of paired
point-to-point messages), halo (three phases, topology-aware, Piper) and 2dh (two-dimensional
hierarchical: intra-node to the rail, then an all-to-all per rail). Every algorithm returns exactly
what flat returns: recv_rows = rows from each group member concatenated in group order, and
recv_splits = rows from each member. Rows are any tensor whose first dimension counts rows.
Only piper_sim.torch_backend may import torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
from torch import Tensor

from piper_sim.errors import ConfigError
from piper_sim.registry import Registry

from .exchange import Holding, Key, NodeLayout, a2a_phase, node_split_sizes, p2p_phase
from .groups import DEFAULT_GROUPS, GroupCache


@dataclass(frozen=True)
class AllToAllCall:
    """One rank's view of one all-to-all: its rows and splits, the EP group and the node map."""

    rows: Tensor
    send_splits: tuple[int, ...]
    ranks: tuple[int, ...]  # the EP group, global ranks; split i goes to ranks[i]
    node_of: dict[int, int]
    groups: GroupCache
    algorithm: AllToAllFn  # the algorithm running this call; it also carries the split sizes
    counts_only: bool = False  # this call is the split-size exchange itself: every chunk is one row

    @property
    def me(self) -> int:
        return dist.get_rank()

    def group(self, ranks: Sequence[int]) -> dist.ProcessGroup:
        return self.groups.get(ranks)

    def holding(self) -> Holding:
        """This rank's chunks keyed (me, destination), with the size of every chunk to or from its node.

        The counts go first by this same algorithm (one int64 row per pair, sizes known to all), then
        inside the node by one all_gather (`node_split_sizes`); the simulator models both."""
        if self.counts_only:
            sizes = {(s, d): 1 for s in self.ranks for d in self.ranks}
        else:
            counts = torch.tensor(self.send_splits, dtype=torch.int64, device=self.rows.device).view(-1, 1)
            column, _ = self.algorithm(replace(self, rows=counts, send_splits=(1,) * len(self.ranks),
                                               counts_only=True))
            local = NodeLayout.of(self.ranks, self.node_of).local(self.node_of[self.me])
            sizes = node_split_sizes(self.send_splits, column.view(-1).tolist(), self.ranks, local,
                                     self.group(local) if len(local) > 1 else None, self.rows.device)
        hold = Holding(sizes=sizes, template=self.rows[:0])
        chunks = torch.split(self.rows, list(self.send_splits))
        hold.chunks = {(self.me, d): c for d, c in zip(self.ranks, chunks, strict=True)}
        return hold

    def result(self, hold: Holding) -> tuple[Tensor, list[int]]:
        keys: list[Key] = [(s, self.me) for s in self.ranks]
        return hold.take(keys), [hold.sizes[k] for k in keys]


AllToAllFn = Callable[[AllToAllCall], tuple[Tensor, list[int]]]
ALGORITHMS: Registry[AllToAllFn] = Registry("all_to_all algorithm")


def all_to_all(rows: Tensor, send_splits: Sequence[int], group_ranks: Sequence[int],
               node_of: dict[int, int], algorithm: str = "flat", *,
               groups: GroupCache | None = None) -> tuple[Tensor, list[int]]:
    """Exchange rows among group_ranks (global ranks; send_splits[i] rows go to group_ranks[i]).

    Returns (recv_rows, recv_splits): the rows from each member concatenated in group order, and how
    many came from each. node_of maps each global rank to its node index. Collective over group_ranks.
    """
    fn = ALGORITHMS.get(algorithm, "collectives.all_to_all")
    ranks = tuple(int(r) for r in group_ranks)
    splits = tuple(int(n) for n in send_splits)
    if len(splits) != len(ranks) or len(set(ranks)) != len(ranks):
        raise ValueError(f"need one split per distinct group rank: splits {splits}, ranks {ranks}")
    if sum(splits) != rows.shape[0] or min(splits, default=0) < 0:
        raise ValueError(f"send_splits {splits} do not add up to the {rows.shape[0]} rows")
    if dist.get_rank() not in ranks:
        raise ValueError(f"rank {dist.get_rank()} is not in group {ranks}")
    if len(ranks) == 1:  # every row stays: no exchange, no library call
        return rows.contiguous(), list(splits)
    call = AllToAllCall(rows=rows.contiguous(), send_splits=splits, ranks=ranks, node_of=dict(node_of),
                        groups=groups or DEFAULT_GROUPS, algorithm=fn)
    return fn(call)


def dispatch_rows(rows: Tensor, expert_ids: Tensor, send_splits: Sequence[int], group_ranks: Sequence[int],
                  node_of: dict[int, int], algorithm: str = "flat") -> tuple[Tensor, Tensor, list[int]]:
    """The MoE dispatch as the executor runs it: the expert ids ride as one extra float32 column of the rows
    (exact below 2^24), so the dispatch is one exchange. Returns (recv_rows in the rows' dtype, contiguous;
    recv_expert_ids, int64; recv_splits). Collective over group_ranks."""
    send = torch.cat([rows.detach(), expert_ids.to(torch.float32).unsqueeze(1)], 1)
    both, recv_splits = all_to_all(send, send_splits, group_ranks, node_of, algorithm)
    return both[:, :-1].to(rows.dtype).contiguous(), both[:, -1].round().to(torch.int64), recv_splits


def prepare_groups(group_ranks: Sequence[int], node_of: dict[int, int],
                   groups: GroupCache | None = None) -> None:
    """Create, ahead of the first call, the groups the algorithms use: EP group, node group, rail group.

    Collective over group_ranks (every member calls it).
    """
    cache = groups or DEFAULT_GROUPS
    layout = NodeLayout.of(group_ranks, node_of)
    me = dist.get_rank()
    cache.get(layout.ranks)
    cache.get(layout.local(layout.node_of[me]))
    if _uniform(layout):
        cache.get(_rail(layout, layout.local_index(me)))


@ALGORITHMS.register("flat")
def flat(call: AllToAllCall) -> tuple[Tensor, list[int]]:
    """Split sizes by one all_to_all_single, then the rows by another (the vendor baseline)."""
    order = sorted(range(len(call.ranks)), key=lambda i: call.ranks[i])  # group order of the process group
    group = call.group(call.ranks)
    device = call.rows.device
    send_counts = torch.tensor([call.send_splits[i] for i in order], dtype=torch.int64, device=device)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts, group=group)
    in_sorted = recv_counts.tolist()
    chunks = torch.split(call.rows, list(call.send_splits))
    send = torch.cat([chunks[i] for i in order])
    out = call.rows.new_empty((sum(in_sorted), *call.rows.shape[1:]))
    dist.all_to_all_single(out, send, in_sorted, [call.send_splits[i] for i in order], group=group)
    received = dict(zip(order, torch.split(out, in_sorted), strict=True))
    recv_splits = [0] * len(order)
    for position, i in enumerate(order):
        recv_splits[i] = in_sorted[position]
    return torch.cat([received[i] for i in range(len(order))]), recv_splits


@ALGORITHMS.register("pairwise")
def pairwise(call: AllToAllCall) -> tuple[Tensor, list[int]]:
    """P-1 rounds; in round k rank i sends to i+k and receives from i-k (padded point-to-point)."""
    hold = call.holding()
    ranks, me = call.ranks, call.me
    index, size = ranks.index(me), len(ranks)
    for step in range(1, size):
        dst, src = ranks[(index + step) % size], ranks[(index - step) % size]
        p2p_phase(hold, {dst: [(me, dst)]}, {src: [(src, me)]}).finish()
    return call.result(hold)


@ALGORITHMS.register("halo")
def halo(call: AllToAllCall) -> tuple[Tensor, list[int]]:
    """HALO (Piper): I intra-node exchange of node-local rows, concurrent with II packed inter-node
    messages between per-(node, peer node) leaders; III leaders redistribute received rows in the node.

    Before II, each rank forwards its rows for a peer node to the local leader of that peer (one
    intra-node all-to-all). Leaders are striped: the j-th peer node of a node is carried by its
    (j mod ranks-per-node)-th rank, and leader(M, Q) exchanges with leader(Q, M).
    """
    hold = call.holding()
    layout, me = NodeLayout.of(call.ranks, call.node_of), call.me
    node = layout.node_of[me]
    local = layout.local(node)
    node_group = call.group(local) if len(local) > 1 else None
    if not layout.peers(node):
        a2a_phase(hold, me, local, lambda s, t: [(s, t)], node_group).finish()
        return call.result(hold)

    def forward_keys(s: int, t: int) -> list[Key]:
        return [(s, d) for q in layout.led(t) for d in layout.local(q)]

    def redistribute_keys(t: int, d: int) -> list[Key]:
        return [(s, d) for q in layout.led(t) for s in layout.local(q)]

    def inter_keys(src_node: int, dst_node: int) -> list[Key]:
        return [(s, d) for d in layout.local(dst_node) for s in layout.local(src_node)]

    a2a_phase(hold, me, local, forward_keys, node_group).finish()
    phase1 = a2a_phase(hold, me, local, lambda s, t: [(s, t)], node_group)
    sends = {layout.leader(q, node): inter_keys(node, q) for q in layout.led(me)}
    recvs = {layout.leader(q, node): inter_keys(q, node) for q in layout.led(me)}
    p2p_phase(hold, sends, recvs).finish()
    a2a_phase(hold, me, local, redistribute_keys, node_group).finish()
    phase1.finish()
    return call.result(hold)


@ALGORITHMS.register("2dh")
def two_dim_hierarchical(call: AllToAllCall) -> tuple[Tensor, list[int]]:
    """2D hierarchical: intra-node all-to-all to the rank with the destination's local index, then
    an all-to-all among the ranks with the same local index on every node (the rail).

    Needs the same number of group ranks on every node.
    """
    layout, me = NodeLayout.of(call.ranks, call.node_of), call.me
    if not _uniform(layout):
        raise ConfigError("collectives.all_to_all", "2dh", "halo, flat or pairwise when nodes hold unequal "
                          "numbers of EP ranks")
    hold = call.holding()
    local = layout.local(layout.node_of[me])
    rail = _rail(layout, layout.local_index(me))

    def to_rail_keys(s: int, t: int) -> list[Key]:
        return [(s, d) for d in layout.ranks if layout.local_index(d) == layout.local_index(t)]

    def across_rail_keys(a: int, b: int) -> list[Key]:
        return [(s, b) for s in layout.local(layout.node_of[a])]

    a2a_phase(hold, me, local, to_rail_keys, call.group(local) if len(local) > 1 else None).finish()
    a2a_phase(hold, me, rail, across_rail_keys, call.group(rail) if len(rail) > 1 else None).finish()
    return call.result(hold)


def _uniform(layout: NodeLayout) -> bool:
    return len({len(layout.local(n)) for n in layout.nodes}) == 1


def _rail(layout: NodeLayout, local_index: int) -> list[int]:
    return [layout.local(n)[local_index] for n in layout.nodes]
