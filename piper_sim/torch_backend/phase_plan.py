"""Running a HaloPlan (collectives/halo.py) on torch.distributed: the simulator's phases, message by message.

Owns the execution of a plan's phases on one rank: every flow of a phase whose source is this rank is one
isend of the chunks the plan says it carries (`HaloPlan.carries`; slice s of each in a sliced phase), every
flow into it one irecv; a phase's messages go in one batch_isend_irecv call (one library call per phase), and
a phase is issued once the phases in its `after` have ended on this rank, so phases with nothing between them
(HALO's phase I and the first slice of phase II) are in flight together, and slice s + 1 of phase II goes out
with slice s of phase III. Flows move whole rows: a message whose slice holds no row is not sent (both ends
know its rows). `TRAFFIC` records what this process sends, for tests.
Only piper_sim.torch_backend may import torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from piper_sim.collectives.halo import HaloPlan, Key, slice_rows

Piece = tuple[Key, int]  # (chunk, slice)


@dataclass
class Traffic:
    """What this process does by plan while `on`: the messages it sends, (phase name, source rank, destination
    rank, bytes), and the order it issues and waits for phases, ("issue" or "wait", phase name)."""

    on: bool = False
    sent: list[tuple[str, int, int, int]] = field(default_factory=list)
    events: list[tuple[str, str]] = field(default_factory=list)

    def clear(self) -> None:
        self.sent.clear()
        self.events.clear()


TRAFFIC = Traffic()


def run_plan(
    plan: HaloPlan,
    me: int,
    ranks: tuple[int, ...],
    own: dict[Key, Tensor],
    rows: Callable[[Key], int],
    template: Tensor,
    prefix: str = "",
) -> dict[Piece, Tensor]:
    """Run the plan's phases as member `me` (an index into ranks, the call's global ranks).

    own: this member's chunks (me, d); rows(key): the rows of every chunk this member sends or receives;
    template: an empty (0, *row_shape) tensor. Returns every piece received, by (chunk, slice) (slice 0 for
    the unsliced phases). Phase names get `prefix` in TRAFFIC."""
    received: dict[Piece, Tensor] = {}
    shape = tuple(template.shape[1:])
    row_bytes = int(np.prod(shape, dtype=np.int64)) * template.element_size()

    def bounds(p: int, key: Key) -> tuple[int, int]:
        if plan.kind[p] in ("direct", "intra"):
            return 0, rows(key)
        return slice_rows(rows(key), plan.slice[p], plan.slices)

    def piece(p: int, key: Key) -> Tensor:
        if key[0] == me:
            lo, hi = bounds(p, key)
            return own[key][lo:hi]
        return received.get((key, plan.slice[p]), template)

    def issue(p: int) -> Callable[[], None]:
        phase, ops, inbox = plan.phases[p], [], []
        for f in np.flatnonzero(phase.src == me).tolist():
            dst = int(phase.dst[f])
            parts = [piece(p, k) for k in plan.carries(p, me, dst)]
            count = sum(len(t) for t in parts)
            if count:
                ops.append(dist.P2POp(dist.isend, torch.cat(parts), ranks[dst], tag=p))
                if TRAFFIC.on:
                    TRAFFIC.sent.append((prefix + phase.name, ranks[me], ranks[dst], count * row_bytes))
        for f in np.flatnonzero(phase.dst == me).tolist():
            src = int(phase.src[f])
            keys = plan.carries(p, src, me)
            counts = [hi - lo for lo, hi in (bounds(p, k) for k in keys)]
            if sum(counts):
                buffer = template.new_empty((sum(counts), *shape))
                ops.append(dist.P2POp(dist.irecv, buffer, ranks[src], tag=p))
                inbox.append((keys, counts, buffer))
        works = dist.batch_isend_irecv(ops) if ops else []
        if TRAFFIC.on:
            TRAFFIC.events.append(("issue", prefix + phase.name))

        def finish() -> None:
            if TRAFFIC.on:
                TRAFFIC.events.append(("wait", prefix + phase.name))
            for work in works:
                work.wait()
            for keys, counts, buffer in inbox:
                for key, chunk in zip(keys, torch.split(buffer, counts), strict=True):
                    received[(key, plan.slice[p])] = chunk

        return finish

    pending: dict[int, Callable[[], None]] = {}
    done: set[int] = set()
    total = len(plan.phases)
    while len(done) < total:
        for p in range(total):
            if p not in pending and p not in done and all(a in done for a in plan.phases[p].after):
                pending[p] = issue(p)
        needed = {a for q in range(total) if q not in pending and q not in done for a in plan.phases[q].after}
        p = min([q for q in pending if q in needed] or pending)  # first what later phases wait for
        pending.pop(p)()
        done.add(p)
    return received


def assemble(
    plan: HaloPlan, me: int, own: dict[Key, Tensor], received: dict[Piece, Tensor], template: Tensor
) -> list[Tensor]:
    """Every source's chunk for `me`, in member order: its own, or the pieces received, slice by slice."""
    out = []
    for s in range(plan.host.size):
        if s == me:
            out.append(own[(me, me)])
            continue
        slices = 1 if plan.host[s] == plan.host[me] or plan.kind[0] == "direct" else plan.slices
        parts = [received.get(((s, me), k), template) for k in range(slices)]
        out.append(parts[0] if len(parts) == 1 else torch.cat(parts))
    return out
