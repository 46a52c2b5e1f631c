"""Communication micro-benchmarks between the ranks of the process group (gloo): point-to-point,
all-to-all, all-reduce, all-gather and reduce-scatter over message sizes and group sizes.

Owns the benchmark bodies; each returns this rank's records (bench, level, group_size, bytes, time_s).
Point-to-point is a ping-pong (time = half the round trip) between the rank pairs of one topology
level, all pairs at once (contention) and one pair alone. Collectives run in disjoint groups of
group_size ranks at the same time. Every rank calls every function (collectives need all of them).
Imports torch; must not import piper_sim.calibrate.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from .calibration_inputs import COLLECTIVES, TimingPlan
from .timing import median_s, time_call

Record = dict[str, object]
Progress = Callable[[str], None]


def group_sizes(world: int) -> list[int]:
    """Powers of two from 2 up to the world size, and the world size itself."""
    sizes, g = [], 2
    while g <= world:
        sizes.append(g)
        g *= 2
    if world >= 2 and sizes[-1:] != [world]:
        sizes.append(world)
    return sizes


def local_pairs(world: int) -> list[tuple[int, int]]:
    """(0, 1), (2, 3), ...: every rank busy (an odd last rank idles)."""
    return [(r, r + 1) for r in range(0, world - 1, 2)]


def _ping_pong(rank: int, peer: int, buf: torch.Tensor) -> Callable[[], None]:
    if rank < peer:

        def fn() -> None:
            dist.send(buf, peer)
            dist.recv(buf, peer)
    else:

        def fn() -> None:
            dist.recv(buf, peer)
            dist.send(buf, peer)

    return fn


def bench_p2p(
    rank: int, pairs: Sequence[tuple[int, int]], level: str, sizes: Sequence[int], plan: TimingPlan, progress: Progress
) -> list[Record]:
    """One-way time of a message of each size between the given pairs, all pairs at once."""
    partner = {a: b for a, b in pairs} | {b: a for a, b in pairs}
    out: list[Record] = []
    for i, size in enumerate(sizes):
        progress(f"p2p {level} ({len(pairs)} pair(s) at once) {i + 1}/{len(sizes)}: {size} B")
        buf = torch.zeros(size, dtype=torch.uint8)
        fn = _ping_pong(rank, partner[rank], buf) if rank in partner else (lambda: None)
        t = median_s(time_call(fn, plan, collective=True)) / 2
        if rank in partner:
            out.append({"bench": "p2p", "level": level, "pairs": len(pairs), "bytes": size, "time_s": t})
    return out


def _groups(world: int, size: int) -> list[list[int]]:
    return [list(range(start, start + size)) for start in range(0, world - size + 1, size)]


def make_groups(world: int) -> dict[int, list[tuple[list[int], object]]]:
    """For each group size, the disjoint groups and their process groups (every rank creates all)."""
    out: dict[int, list[tuple[list[int], object]]] = {}
    for size in group_sizes(world):
        out[size] = [(ranks, None if size == world else dist.new_group(ranks)) for ranks in _groups(world, size)]
    return out


def bench_collectives(
    rank: int,
    world: int,
    sizes: Sequence[int],
    plan: TimingPlan,
    progress: Progress,
    level: str = "local",
    names: Sequence[str] = COLLECTIVES,
) -> list[Record]:
    """all_to_all_single (size = bytes each rank sends in all, split evenly), all_reduce (size = bytes of the
    reduced float32 buffer), all_gather_into_tensor and reduce_scatter_tensor (size = bytes of the whole float32
    buffer: the gathered output, the scattered input; each member's shard is 1 / group size of it) in disjoint
    groups of each group size, all groups at once. names: which of COLLECTIVES, in that order."""
    out: list[Record] = []
    for group_size, groups in make_groups(world).items():
        mine = next(((ranks, pg) for ranks, pg in groups if rank in ranks), None)
        for name in (n for n in COLLECTIVES if n in names):
            for i, size in enumerate(sizes):
                progress(f"{name} groups of {group_size} {i + 1}/{len(sizes)}: {size} B per rank")
                fn, nbytes = _collective(name, size, group_size, mine)
                t = median_s(time_call(fn, plan, collective=True))
                if mine is not None:
                    out.append(
                        {
                            "bench": name,
                            "level": level,
                            "group_size": group_size,
                            "groups": len(groups),
                            "bytes": nbytes,
                            "time_s": t,
                        }
                    )
    return out


def _collective(
    name: str, size: int, group_size: int, mine: tuple[list[int], object] | None
) -> tuple[Callable[[], object], int]:
    if mine is None:
        return (lambda: None), size
    pg = mine[1]
    if name == "all_to_all":
        per_peer = max(1, size // group_size)
        send = torch.zeros(per_peer * group_size, dtype=torch.uint8)
        recv = torch.empty_like(send)
        return (lambda: dist.all_to_all_single(recv, send, group=pg)), send.numel()
    if name == "all_reduce":
        buf = torch.zeros(max(1, size // 4), dtype=torch.float32)
        return (lambda: dist.all_reduce(buf, group=pg)), buf.numel() * 4
    shard = torch.zeros(max(1, size // 4 // group_size), dtype=torch.float32)
    whole = torch.zeros(shard.numel() * group_size, dtype=torch.float32)
    if name == "all_gather":
        return (lambda: dist.all_gather_into_tensor(whole, shard, group=pg)), whole.numel() * 4
    return (lambda: dist.reduce_scatter_tensor(shard, whole, group=pg)), whole.numel() * 4


def run_comm(
    rank: int,
    world: int,
    sizes: Sequence[int],
    plan: TimingPlan,
    progress: Progress,
    levels: dict[str, list[tuple[int, int]]] | None = None,
    collective_level: str = "local",
    benches: Sequence[str] | None = None,
) -> list[Record]:
    """The communication benchmarks (benches: some of plan.COMM_BENCHES; None: all). levels: topology level -> rank
    pairs (default: one level, 'local'); collectives span the groups of consecutive ranks and are recorded under
    collective_level."""
    if world < 2:
        return []
    levels = levels or {"local": local_pairs(world)}
    out: list[Record] = []
    for level, pairs in levels.items() if benches is None or "p2p" in benches else ():
        if len(pairs) > 1:
            out += bench_p2p(rank, pairs[:1], level, sizes, plan, progress)
        out += bench_p2p(rank, pairs, level, sizes, plan, progress)
    return out + bench_collectives(
        rank, world, sizes, plan, progress, level=collective_level, names=COLLECTIVES if benches is None else benches
    )
