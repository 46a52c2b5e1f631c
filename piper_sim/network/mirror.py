"""Timelines of flow sets alone, found again for the same flows relabelled: listed in another order, or mirrored.

A flow set alone on its links runs a timeline (fairshare.isolated_timeline) that depends only on which links each
flow crosses, the flows' weights and sizes and the links' capacities. Two flow sets whose flows pair up one to one,
with equal weights and sizes, and whose link sets a capacity-preserving map of links carries one onto the other,
are the same max-min problem: they run the same timeline, flow for flow. Two maps are tried: the identity (the
same flows listed in another order) and the reversal (each link to the link back, Topology.reverse_link). An
all-to-all's combine moves its dispatch's matrix transposed, so where the routes back retrace the routes out its
timeline is its dispatch's: under skewed routing, where every matrix differs, that halves the timelines solved.

A match is found by a key (each flow's link set, weight and size hashed into one number, the numbers sorted) and
checked exactly (the paired flows' link sets, weights and sizes compared) before it is used; a hash collision only
costs a solve.
Must not import simpy or torch.
"""

from __future__ import annotations

import numpy as np

from piper_sim.network.fairshare import Timeline, isolated_timeline

KEPT_TIMELINES = 512  # timelines kept for a later relabelled flow set, the oldest dropped first
MIN_FLOWS = 32  # smaller flow sets are solved (their solve costs about what their key does)
_MIX = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F))  # odd multipliers mixing a flow's hash parts


class _Kept:
    __slots__ = ("timeline", "order", "entry_flow", "entry_link", "weight", "sizes")

    def __init__(
        self,
        timeline: Timeline,
        order: np.ndarray,
        entry_flow: np.ndarray,
        entry_link: np.ndarray,
        weight: np.ndarray,
        sizes: np.ndarray,
    ):
        self.timeline, self.order, self.entry_flow, self.entry_link = timeline, order, entry_flow, entry_link
        self.weight, self.sizes = weight, sizes


class TimelineMemo:
    """isolated_timeline (finish times and wave ends, no rates) of flow sets on one machine's links, reused for
    a flow set that is a relabelling of one solved before. capacity: the links' (bytes/s); reverse_link: per
    link, its link back of equal capacity or -1 (None: no mirror images are looked for)."""

    def __init__(self, capacity: np.ndarray, reverse_link: np.ndarray | None = None) -> None:
        self.capacity = capacity
        self._code = (
            np.random.default_rng(0x5EED)
            .integers(1, np.iinfo(np.int64).max, size=int(capacity.shape[0]), dtype=np.int64)
            .astype(np.uint64)
        )
        self._reverse = reverse_link
        self._kept: dict[bytes, _Kept] = {}
        self.num_solved = self.num_reordered = self.num_mirrored = 0

    def timeline(
        self, entry_flow: np.ndarray, entry_link: np.ndarray, weight: np.ndarray, sizes: np.ndarray
    ) -> Timeline:
        key = None
        if sizes.shape[0] >= MIN_FLOWS:
            weight = np.ascontiguousarray(weight, dtype=np.float64)
            sizes = np.ascontiguousarray(sizes, dtype=np.float64)
            key, order = self._key(entry_flow, self._code[entry_link], weight, sizes)
            found = self._found(key, order, entry_flow, entry_link, weight, sizes)
            if found is not None:
                return found
        self.num_solved += 1
        timeline = isolated_timeline(entry_flow, entry_link, weight, sizes, self.capacity, keep_rates=False)
        if key is not None:
            if len(self._kept) >= KEPT_TIMELINES:
                self._kept.pop(next(iter(self._kept)))
            self._kept[key] = _Kept(timeline, order, entry_flow, entry_link, weight, sizes)
        return timeline

    def _found(
        self,
        key: bytes,
        order: np.ndarray,
        entry_flow: np.ndarray,
        entry_link: np.ndarray,
        weight: np.ndarray,
        sizes: np.ndarray,
    ) -> Timeline | None:
        """A kept timeline of these flows listed in another order, or of their mirror image; None when none is."""
        found = self._match(key, order, entry_flow, entry_link, weight, sizes)
        if found is not None:
            self.num_reordered += 1
            return found
        if self._reverse is None:
            return None
        back = self._reverse[entry_link]
        if not back.size or back.min() < 0:
            return None
        mirror_key, mirror_order = self._key(entry_flow, self._code[back], weight, sizes)
        found = self._match(mirror_key, mirror_order, entry_flow, back, weight, sizes)
        if found is not None:
            self.num_mirrored += 1
        return found

    @staticmethod
    def _key(
        entry_flow: np.ndarray, link_code: np.ndarray, weight: np.ndarray, sizes: np.ndarray
    ) -> tuple[bytes, np.ndarray]:
        """The flows' hashes (of the link set, weight and size) sorted, as bytes, and the order that sorts them."""
        flow_hash = _wrapped_sums(entry_flow, link_code, sizes.shape[0])  # the same for the links in any order
        flow_hash = flow_hash * _MIX[0] + weight.view(np.uint64) * _MIX[1] + sizes.view(np.uint64)  # wraps
        order = np.argsort(flow_hash, kind="stable")
        return flow_hash[order].tobytes(), order

    def _match(
        self,
        key: bytes,
        order: np.ndarray,
        entry_flow: np.ndarray,
        mapped_link: np.ndarray,
        weight: np.ndarray,
        sizes: np.ndarray,
    ) -> Timeline | None:
        """The kept timeline whose flows pair with these (the i-th in sorted order with the i-th), when each pair
        has equal weights and sizes and crosses the same links (these mapped), permuted to these flows' order; None
        when there is none."""
        kept = self._kept.get(key)
        if kept is None or kept.entry_link.shape[0] != mapped_link.shape[0]:
            return None
        pair = np.empty(order.shape[0], dtype=np.int64)
        pair[order] = kept.order  # this set's flow -> the kept set's flow
        if not (np.array_equal(kept.sizes[pair], sizes) and np.array_equal(kept.weight[pair], weight)):
            return None
        num_links = self.capacity.shape[0]
        ours = np.sort(pair[entry_flow] * num_links + mapped_link)
        theirs = np.sort(kept.entry_flow * num_links + kept.entry_link)
        if not np.array_equal(ours, theirs):
            return None
        solved = kept.timeline
        return Timeline(solved.end_s, None, solved.finish_offset_s[pair])


def _wrapped_sums(group: np.ndarray, values: np.ndarray, num_groups: int) -> np.ndarray:
    """uint64 sums of values by group, modulo 2^64 (the same for the values in any order): each 32-bit half summed
    exactly in float64 (a group of fewer than 2^21 values), then joined."""
    low = np.bincount(group, weights=(values & np.uint64(0xFFFFFFFF)).astype(np.float64), minlength=num_groups)
    high = np.bincount(group, weights=(values >> np.uint64(32)).astype(np.float64), minlength=num_groups)
    return (high.astype(np.uint64) << np.uint64(32)) + low.astype(np.uint64)
