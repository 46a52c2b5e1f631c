"""Flow sets that start at one instant, taken together: which of them share links, and one set made of several.

Owns `overlapping` (link sets grouped by shared links) and `Parts`: flow sets that start at the same instant on
links they share (the data-parallel rings of a stage's groups, which start together) enter the flow network
(piper_sim.network.flows) as one flow set whose parts keep their own ends: each part's event fires when its own
flows have ended, with their finish times, as its own flow set's would. The max-min solve is over the same flows
either way (a flow set is bookkeeping: the rates are the component's), so a union costs one set in the
component's solves instead of one per part. Pure numpy bookkeeping; the network calls it.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np
import simpy


def overlapping(links: list[np.ndarray]) -> list[list[int]]:
    """Indices of link sets grouped by shared links (transitively), each group in index order, the groups by their
    first index: the sets sorted by link together, and those next to each other on one link joined (union-find),
    so the cost grows with the links, not with the pairs of sets."""
    parent = list(range(len(links)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    if len(links) > 1:
        owner = np.repeat(np.arange(len(links)), [len(own) for own in links])
        order = np.argsort(np.concatenate(links), kind="stable")
        flat = np.concatenate(links)[order]
        shared = np.flatnonzero(flat[1:] == flat[:-1])  # the sets next to each other on one link
        for a, b in set(zip(owner[order][shared].tolist(), owner[order][shared + 1].tolist(), strict=True)):
            ra, rb = root(a), root(b)
            if ra != rb:
                parent[max(ra, rb)] = min(ra, rb)
    groups: dict[int, list[int]] = {}
    for i in range(len(links)):
        groups.setdefault(root(i), []).append(i)
    return list(groups.values())


@dataclass(slots=True)
class Pending:
    """A flow set asked to start at this instant (FlowNetwork.start's arguments, sizes of at most EPS_BYTES
    zeroed), and the event its end fires."""

    entry_flow: np.ndarray
    entry_link: np.ndarray
    weight: np.ndarray
    sizes: np.ndarray
    links: np.ndarray  # its distinct links
    key: Hashable | None
    done: simpy.Event


class Parts:
    """The parts of a union flow set: flows offsets[p]:offsets[p + 1] are part p's; each part's event fires once,
    when its flows have all ended (a finish time each)."""

    __slots__ = ("offsets", "events", "fired")

    def __init__(self, sizes: list[int], events: list[simpy.Event]) -> None:
        self.offsets = np.cumsum([0] + sizes)
        self.events = events
        self.fired = np.zeros(len(events), dtype=bool)

    def ends_s(self, finish_offset_s: np.ndarray) -> np.ndarray:
        """Each part's end in a timeline of the union (the last of its flows' finish offsets)."""
        return np.maximum.reduceat(finish_offset_s, self.offsets[:-1])

    def fire(self, finish_s: np.ndarray, only: np.ndarray | None = None) -> None:
        """Fire the events of the parts (or of `only` among them) whose flows have all ended (finish_s: NaN for a
        flow still under way), in part order, each with its flows' finish times."""
        ended = np.add.reduceat(~np.isnan(finish_s), self.offsets[:-1]) == np.diff(self.offsets)
        ready = ended & ~self.fired
        if only is not None:
            ready &= np.isin(np.arange(ready.size), only)
        for p in np.flatnonzero(ready).tolist():
            self.fired[p] = True
            self.events[p].succeed(finish_s[self.offsets[p] : self.offsets[p + 1]].copy())


def union(pending: list[Pending]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, Hashable | None, Parts]:
    """One flow set of several that start together: (entry_flow, entry_link, weight, sizes, key, parts); key: the
    parts' keys (None if one has none)."""
    offsets = np.cumsum([0] + [p.sizes.shape[0] for p in pending])
    entry_flow = np.concatenate([p.entry_flow + off for p, off in zip(pending, offsets, strict=False)])
    keys = tuple(p.key for p in pending)
    return (
        entry_flow,
        np.concatenate([p.entry_link for p in pending]),
        np.concatenate([p.weight for p in pending]),
        np.concatenate([p.sizes for p in pending]),
        None if any(k is None for k in keys) else keys,
        Parts([p.sizes.shape[0] for p in pending], [p.done for p in pending]),
    )
