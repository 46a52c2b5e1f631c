"""All-to-all algorithms on torch.distributed with uneven splits, chosen by name from a registry.

Owns: flat (split sizes exchanged, then one all_to_all_single), pairwise (P-1 rounds of paired
point-to-point messages), halo (Piper's three phases: the simulator's HaloPlan run message by message,
phase_plan.py) and 2dh (two-dimensional
hierarchical: intra-node to the rail, then an all-to-all per rail). Every algorithm returns exactly
what flat returns: recv_rows = rows from each group member concatenated in group order, and
recv_splits = rows from each member. Rows are any tensor whose first dimension counts rows.
Only piper_sim.torch_backend may import torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from piper_sim.collectives.halo import HaloMachine, HaloPlan, Relays, halo_plan, halo_relays, num_slices
from piper_sim.collectives.phases import SPLIT_BYTES
from piper_sim.errors import ConfigError
from piper_sim.registry import Registry

from .exchange import Holding, Key, NodeLayout, a2a_phase, node_split_sizes, p2p_phase
from .groups import DEFAULT_GROUPS, GroupCache
from .phase_plan import assemble, run_plan


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
    halo: HaloMachine = HaloMachine()  # halo: the NICs' switches and the slicing, as the topology says

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
            column, _ = self.algorithm(replace(self, rows=counts, send_splits=(1,) * len(self.ranks), counts_only=True))
            local = NodeLayout.of(self.ranks, self.node_of).local(self.node_of[self.me])
            sizes = node_split_sizes(
                self.send_splits,
                column.view(-1).tolist(),
                self.ranks,
                local,
                self.group(local) if len(local) > 1 else None,
                self.rows.device,
            )
        hold = Holding(sizes=sizes, template=self.rows[:0])
        chunks = torch.split(self.rows, list(self.send_splits))
        hold.chunks = {(self.me, d): c for d, c in zip(self.ranks, chunks, strict=True)}
        return hold

    def result(self, hold: Holding) -> tuple[Tensor, list[int]]:
        keys: list[Key] = [(s, self.me) for s in self.ranks]
        return hold.take(keys), [hold.sizes[k] for k in keys]


AllToAllFn = Callable[[AllToAllCall], tuple[Tensor, list[int]]]
ALGORITHMS: Registry[AllToAllFn] = Registry("all_to_all algorithm")


def all_to_all(
    rows: Tensor,
    send_splits: Sequence[int],
    group_ranks: Sequence[int],
    node_of: dict[int, int],
    algorithm: str = "flat",
    *,
    groups: GroupCache | None = None,
    halo: HaloMachine | None = None,
) -> tuple[Tensor, list[int]]:
    """Exchange rows among group_ranks (global ranks; send_splits[i] rows go to group_ranks[i]).

    Returns (recv_rows, recv_splits): the rows from each member concatenated in group order, and how
    many came from each. node_of maps each global rank to its node index; halo: what the halo algorithm
    needs of the machine (`collectives.halo.halo_machine`; default: no NIC switch known, the default
    slicing). Collective over group_ranks.
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
    call = AllToAllCall(
        rows=rows.contiguous(),
        send_splits=splits,
        ranks=ranks,
        node_of=dict(node_of),
        groups=groups or DEFAULT_GROUPS,
        algorithm=fn,
        halo=halo or HaloMachine(),
    )
    return fn(call)


def dispatch_rows(
    rows: Tensor,
    expert_ids: Tensor,
    send_splits: Sequence[int],
    group_ranks: Sequence[int],
    node_of: dict[int, int],
    algorithm: str = "flat",
    *,
    halo: HaloMachine | None = None,
) -> tuple[Tensor, Tensor, list[int]]:
    """The MoE dispatch as the executor runs it: the expert ids ride as one extra float32 column of the rows
    (exact below 2^24), so the dispatch is one exchange. Returns (recv_rows in the rows' dtype, contiguous;
    recv_expert_ids, int64; recv_splits). Collective over group_ranks."""
    send = torch.cat([rows.detach(), expert_ids.to(torch.float32).unsqueeze(1)], 1)
    both, recv_splits = all_to_all(send, send_splits, group_ranks, node_of, algorithm, halo=halo)
    return both[:, :-1].to(rows.dtype).contiguous(), both[:, -1].round().to(torch.int64), recv_splits


def prepare_groups(group_ranks: Sequence[int], node_of: dict[int, int], groups: GroupCache | None = None) -> None:
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


COUNT_BITS = 32  # a split-size row of halo: the count below this bit, the sender's largest phase II rows above


@ALGORITHMS.register("halo")
def halo(call: AllToAllCall) -> tuple[Tensor, list[int]]:
    """HALO as the simulator models it (collectives/halo.py, the same HaloPlan): I the node-local chunks
    directly, concurrent with II every member's rows for each other node in one message to its relay there,
    then III each relay forwards to the members of its node what it received for them; II and III in slices.

    On one node: flat. The split sizes go first by the same plan (one int64 row per pair): a relay learns
    the sizes of what it receives and forwards from the counts it relays, and each count row also carries its
    sender's largest phase II message in rows (above COUNT_BITS), so every member derives the slice count
    the simulator derives from the whole matrix."""
    if len(NodeLayout.of(call.ranks, call.node_of).nodes) == 1:
        return flat(call)
    ranks, me = call.ranks, call.ranks.index(call.me)
    ids: dict[int, int] = {}  # host groups numbered in order of first appearance, as host_groups does
    host = np.array([ids.setdefault(call.node_of[r], len(ids)) for r in ranks], dtype=np.int64)
    n, machine = len(ranks), call.halo
    switch = machine.switch_ids(ranks)
    relays, count_plan = _halo_members(host, switch, machine)
    splits = np.array(call.send_splits, dtype=np.int64)
    largest = int(max(splits[host == b].sum() for b in range(len(ids)) if b != host[me]))
    if max(largest, int(splits.max())) >= 1 << (COUNT_BITS - 1):
        raise ValueError(f"halo: more than 2^{COUNT_BITS - 1} rows in one message")
    device = call.rows.device
    counts = torch.tensor((splits + (largest << COUNT_BITS)).tolist(), dtype=torch.int64, device=device).view(-1, 1)
    got = run_plan(
        count_plan,
        me,
        ranks,
        {(me, d): counts[d : d + 1] for d in range(n)},
        lambda key: 1,
        counts[:0],
        prefix="splits:",
    )
    values = {key: int(v) for (key, _), v in got.items() if len(v)}  # one row per chunk, in one of its slices
    sizes = {key: v & ((1 << COUNT_BITS) - 1) for key, v in values.items()}
    sizes.update({(me, d): int(c) for d, c in enumerate(splits.tolist())})
    row_bytes = float(np.prod(call.rows.shape[1:], dtype=np.int64) * call.rows.element_size())
    most = max([largest, *(v >> COUNT_BITS for v in values.values())])
    matrix = np.zeros((n, n))  # what this member knows of the matrix: every chunk it sends, receives or relays
    for key, rows in sizes.items():
        matrix[key] = rows * row_bytes
    plan = halo_plan(
        matrix,
        host,
        switch,
        machine.chunk_bytes,
        machine.max_slices,
        relays=relays,
        slices=num_slices(np.array([most * row_bytes]), machine.chunk_bytes, machine.max_slices),
    )
    template = call.rows[:0]
    own = dict(zip(((me, d) for d in range(n)), torch.split(call.rows, list(call.send_splits)), strict=True))
    got = run_plan(plan, me, ranks, own, sizes.__getitem__, template)
    return torch.cat(assemble(plan, me, own, got, template)), [sizes[(s, me)] for s in range(n)]


_HALO_MEMBERS: dict[tuple, tuple[Relays, HaloPlan]] = {}


def _halo_members(host: np.ndarray, switch: np.ndarray, machine: HaloMachine) -> tuple[Relays, HaloPlan]:
    """What halo's plans over these members share, computed once per process: the relays, and the plan of
    the split sizes (one int64 row per pair, whatever the matrix)."""
    key = (host.tobytes(), switch.tobytes(), machine.chunk_bytes, machine.max_slices)
    hit = _HALO_MEMBERS.get(key)
    if hit is None:
        n = host.size
        relays = halo_relays(host, switch)
        counts = halo_plan(
            np.full((n, n), float(SPLIT_BYTES)), host, switch, machine.chunk_bytes, machine.max_slices, relays=relays
        )
        hit = _HALO_MEMBERS[key] = (relays, counts)
    return hit


@ALGORITHMS.register("2dh")
def two_dim_hierarchical(call: AllToAllCall) -> tuple[Tensor, list[int]]:
    """2D hierarchical: intra-node all-to-all to the rank with the destination's local index, then
    an all-to-all among the ranks with the same local index on every node (the rail).

    Needs the same number of group ranks on every node.
    """
    layout, me = NodeLayout.of(call.ranks, call.node_of), call.me
    if not _uniform(layout):
        raise ConfigError(
            "collectives.all_to_all", "2dh", "halo, flat or pairwise when nodes hold unequal numbers of EP ranks"
        )
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
