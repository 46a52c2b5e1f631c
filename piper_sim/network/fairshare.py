"""Max-min fair shares on a flow set, and the timeline of a flow set alone on its links.

Owns the progressive-filling solve (max_min_rates, fill_rates, Filling), the joined incidence of flow sets solved
together (Structure) and those kept for the components last solved (StructureCache), the isolated run of one flow
set (isolated_timeline) and the Timeline record; their inner loops are compiled (kernels.py). The flow network
(flows.py) and the collective recorder (recording.py) use it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from piper_sim.network import kernels
from piper_sim.network.lumping import Classes, structural_classes

EPS_BYTES = 1e-3


def compact_ids(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sorted distinct non-negative ids, position of every id among them), without sorting all ids."""
    if ids.size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return kernels.compact(np.asarray(ids, dtype=np.int64))


def max_min_rates(
    entry_flow: np.ndarray, entry_link: np.ndarray, weight: np.ndarray, capacity: np.ndarray
) -> np.ndarray:
    """Max-min fair rate per flow (bytes/s) by progressive filling.

    entry_flow/entry_link list the (flow, link) incidences; weight[f] is how many identical flows
    flow f stands for (each gets the returned rate). Flows with no link get an infinite rate.
    """
    if not entry_flow.size:
        return np.full(weight.shape[0], np.inf)
    links, local_link = compact_ids(entry_link)
    return fill_rates(entry_flow, local_link, weight, capacity[links])


def fill_rates(entry_flow: np.ndarray, local_link: np.ndarray, weight: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """max_min_rates with links already numbered 0..L-1 (capacity[L]); links no entry uses are ignored."""
    return Filling(entry_flow, local_link, weight, capacity).solve(np.ones(weight.shape[0], dtype=bool))


class Filling:
    """Progressive filling over one incidence structure (links numbered 0..L-1), solved again as flows leave.

    solve(live) gives the max-min fair rates of the live flows (flow f stands for weight[f] identical flows; a
    live flow that crosses no link gets an infinite rate, the others 0). The structure is built once; a solve after
    flows only left refills the flows at or above the lowest leaver's rate (kernels.refill), any other fills from
    zero.
    """

    def __init__(
        self, entry_flow: np.ndarray, local_link: np.ndarray, weight: np.ndarray, capacity: np.ndarray
    ) -> None:
        self.incidence = kernels.Incidence(entry_flow, local_link, weight.shape[0], capacity.shape[0])
        self.weight, self.capacity = weight.astype(float), capacity.astype(float)
        # the last solve: rates, live flows, frozen rates per link (a solve after flows only left resumes from it)
        self.state = (np.zeros(weight.shape[0]), np.zeros(weight.shape[0], dtype=np.bool_), np.zeros(capacity.shape[0]))

    def solve(self, live: np.ndarray) -> np.ndarray:
        kernels.refill(self.incidence, self.weight, self.capacity, np.asarray(live, dtype=np.bool_), self.state)
        rate = self.state[0].copy()
        free = live & ~self.incidence.has_link
        return np.where(free, np.inf, rate) if free.any() else rate


class LumpedFilling:
    """Filling's solve(live) on a component's quotient (lumping.Classes): a flow's rate is its class's. Live flows
    that split a class are solved on the component's own flows (unlumped, built then)."""

    __slots__ = ("classes", "quotient", "_unlumped", "_full")

    def __init__(self, classes: Classes, unlumped: Callable[[], Filling]) -> None:
        self.classes = classes
        self.quotient = Filling(classes.entry_flow, classes.entry_link, classes.weight, classes.capacity)
        self._unlumped = unlumped
        self._full: Filling | None = None

    def solve(self, live: np.ndarray) -> np.ndarray:
        if self._full is None:
            live_class = self.classes.live_classes(live)
            if live_class is not None:
                return self.classes.spread(self.quotient.solve(live_class))
            self._full = self._unlumped()
        return self._full.solve(live)


class Structure:
    """Flow sets' incidences joined, in the order of their start (seq), for solving them together (the joined
    arrays built when first asked for: a component solved on its quotient needs none)."""

    __slots__ = ("index", "offsets", "num_flows", "num_entries", "_parts", "_arrays", "filling")

    def __init__(
        self,
        sets: list,
        capacity: np.ndarray,
        filled: bool,
        classes_of: Callable[[list, Structure, np.ndarray], Classes | None] | None = None,
    ) -> None:
        """filled: build the progressive filling's compressed incidence (fixed capacities), else keep the arrays.
        classes_of: the component's equitable partition (PartitionMemo.classes), to solve on its quotient where
        the sets' live flows and bytes still to send respect it."""
        self.index = {fs.seq: i for i, fs in enumerate(sets)}
        self.offsets = np.cumsum([0] + [fs.remaining.shape[0] for fs in sets])
        self.num_flows = int(self.offsets[-1])
        self._parts = [(fs.entry_flow, fs.entry_link, fs.weight) for fs in sets]
        self.num_entries = sum(fs.entry_link.shape[0] for fs in sets)
        self._arrays: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self.filling = self._filling(sets, capacity, classes_of) if filled else None

    @property
    def entry_flow(self) -> np.ndarray:
        return self._joined()[0]

    @property
    def entry_link(self) -> np.ndarray:
        return self._joined()[1]

    @property
    def weight(self) -> np.ndarray:
        return self._joined()[2]

    def _joined(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._arrays is None:
            self._arrays = _joined(self._parts, self.offsets)
        return self._arrays

    def _filling(self, sets: list, capacity: np.ndarray, classes_of) -> Filling | LumpedFilling:
        """On the component's quotient where its partition holds now (lumping.Classes.holds), else on its flows. The
        fallback is a partial over the sets' arrays, not a closure over self: a cycle would keep structures of
        millions of entries alive until the cyclic collector runs."""
        found = classes_of(sets, self, capacity) if classes_of is not None else None
        if found is not None:
            remaining = np.concatenate([fs.remaining for fs in sets])
            weight = np.concatenate([fs.weight for fs in sets])
            if found.holds(remaining > EPS_BYTES, remaining, weight):
                return LumpedFilling(found, functools.partial(_unlumped, self._parts, self.offsets, capacity))
        return _unlumped(self._parts, self.offsets, capacity, self._joined())


def _joined(parts: list, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sets' (entry_flow, entry_link, weight) joined, their flows numbered from their offsets."""
    flows, links, weights = zip(*parts, strict=True)
    return (
        np.concatenate([f + off for f, off in zip(flows, offsets, strict=False)]),
        np.concatenate(links),
        np.concatenate(weights),
    )


def _unlumped(parts: list, offsets: np.ndarray, capacity: np.ndarray, joined=None) -> Filling:
    """The filling of sets' joined flows themselves (joined: their arrays, where already built)."""
    entry_flow, entry_link, weight = _joined(parts, offsets) if joined is None else joined
    links, local = compact_ids(entry_link)
    return Filling(entry_flow, local, weight, capacity[links])


MAX_STRUCTURES = 64  # components whose joined incidence is kept (StructureCache) ...
STRUCTURE_ENTRIES = 1 << 23  # ... and the (flow, link) incidences they hold together at most (a component of mean-field
# detours' sub-flows holds millions)
PARTITION_BYTES = 1 << 29  # what a PartitionMemo holds at most
SEEN_KEYS = 1 << 14  # components a PartitionMemo remembers meeting once


class PartitionMemo:
    """The equitable partitions of the components met again (lumping.structural_classes), by their sets' keys (the
    same routes) and flow counts: the same collectives contend again micro-batch after micro-batch, in the main
    network and in the private networks a recorder runs collectives in (which share one memo). A component met for
    the first time is solved on its flows (a partition costs a few solves' worth; many components are met once);
    one met again is partitioned and kept, PARTITION_BYTES at most, the least recently used going first. Valid for one
    capacity array (a topology's links)."""

    def __init__(self) -> None:
        self._partitions: dict[tuple, Classes | None] = {}
        self._bytes = 0
        self._seen: dict[tuple, None] = {}  # components met once (SEEN_KEYS at most)

    def clear(self) -> None:
        self._partitions.clear()
        self._bytes = 0
        self._seen.clear()

    def classes(self, sets: list, st: Structure, capacity: np.ndarray) -> Classes | None:
        """The partition of the component of these sets (None for sets without keys, at a first sighting, and where
        the component has little symmetry)."""
        if any(fs.key is None for fs in sets):
            return None
        key = tuple((fs.key, fs.remaining.shape[0]) for fs in sets)
        if key in self._partitions:
            found = self._partitions.pop(key)
            self._partitions[key] = found  # the most recently used last
            return found
        if key not in self._seen:  # a first sighting: many components are never met again (their timing is unique)
            self._seen[key] = None
            if len(self._seen) > SEEN_KEYS:
                del self._seen[next(iter(self._seen))]
            return None
        del self._seen[key]
        links, local = compact_ids(st.entry_link)
        flow_set = np.repeat(np.arange(len(sets)), np.diff(st.offsets))
        found = structural_classes(st.entry_flow, local, st.weight, capacity[links], flow_set)
        self._partitions[key] = found
        self._bytes += 0 if found is None else found.nbytes
        while len(self._partitions) > 1 and self._bytes > PARTITION_BYTES:
            gone = self._partitions.pop(next(iter(self._partitions)))
            self._bytes -= 0 if gone is None else gone.nbytes
        return found


class StructureCache:
    """The joined incidences of the components a flow network last solved (at most MAX_STRUCTURES, holding
    STRUCTURE_ENTRIES incidences together; the oldest go first); partitions: where their equitable partitions are
    kept."""

    def __init__(self, partitions: PartitionMemo) -> None:
        self._structures: dict[tuple[int, ...], Structure] = {}
        self._structure_entries = 0  # incidences the kept structures hold
        self.partitions = partitions

    def clear(self) -> None:
        self._structures.clear()
        self._structure_entries = 0

    def of(self, sets: list, capacity: np.ndarray, filled: bool) -> Structure:
        """The joined incidence of a component's sets, kept for the few components last solved: a component is
        solved again each time one of its flows ends, with the same sets. When sets leave a component (they end, or
        the component splits), the structure it was solved on still holds the rest: their solves use it, the
        flows of the sets no longer there not live. capacity, filled: as Structure's."""
        key = tuple(fs.seq for fs in sets)
        hit = self._structures.get(key)
        if hit is None:
            last = sets[0].structure
            if last is not None and all(fs.seq in last.index for fs in sets):
                hit = last
            else:
                hit = Structure(sets, capacity, filled=filled, classes_of=self.partitions.classes)
            self._structures[key] = hit
            self._structure_entries += hit.num_entries
            while len(self._structures) > 1 and (
                len(self._structures) > MAX_STRUCTURES or self._structure_entries > STRUCTURE_ENTRIES
            ):
                self._structure_entries -= self._structures.pop(next(iter(self._structures))).num_entries
        for fs in sets:
            fs.structure = hit
        return hit


LATENCY_ONLY_S = 5e-8  # a flow set that holds each link it crosses at most this long alone runs outside the sharing


def latency_only(
    entry_flow: np.ndarray,
    entry_link: np.ndarray,
    weight: np.ndarray,
    sizes: np.ndarray,
    capacity: np.ndarray,
    limit_s: float,
    fastest_bytes_per_s: float,
    compacted: tuple[np.ndarray, np.ndarray] | None = None,
) -> bool:
    """Whether a flow set's bytes on each link it crosses take that link at most limit_s (LATENCY_ONLY_S, less
    than one switch hop's latency on the machines modelled). Such a set (the split sizes an all-to-all exchanges
    first: 8 bytes a pair) is priced by the overhead and latency its phase pays before its flows enter; its bytes
    would hold links for less than that, and as a flow set of its own it would join the component of the flows
    on its links and cost two solves of it, so its flows end as they enter. The bound is a busiest-link time:
    the same on a network of merged links (bytes and capacity both summed) as on the links it stands for.
    fastest_bytes_per_s: the largest capacity (a flow larger than the fastest link carries in limit_s settles it).
    compacted: compact_ids(entry_link) where the caller has it."""
    if not entry_link.size:
        return True
    flow_bytes = sizes * weight
    if float(flow_bytes.max()) > limit_s * fastest_bytes_per_s:
        return False
    links, local = compact_ids(entry_link) if compacted is None else compacted
    load = np.bincount(local, weights=flow_bytes[entry_flow], minlength=links.size)
    return bool((load <= limit_s * capacity[links]).all())


def isolated_timeline(
    entry_flow: np.ndarray,
    entry_link: np.ndarray,
    weight: np.ndarray,
    sizes: np.ndarray,
    capacity: np.ndarray,
    keep_rates: bool = True,
) -> Timeline:
    """A flow set's run alone on its links: solve the fair shares, run until the next flows end, repeat
    (kernels.timeline). keep_rates: False when only its finish times and duration are wanted (no segments)."""
    links, local = compact_ids(entry_link)
    incidence = kernels.Incidence(entry_flow, local, sizes.shape[0], links.size)
    end_s, rates, finish = kernels.timeline(incidence, weight, sizes, capacity[links], EPS_BYTES, keep_rates)
    return Timeline(end_s, rates if keep_rates else None, finish)


class Timeline:
    """A flow set's run on otherwise idle links: the end offset of each wave, the rates in it [wave, flow] (None
    when they were not kept) and each flow's finish offset."""

    __slots__ = ("end_s", "rates", "finish_offset_s")

    def __init__(self, end_s: np.ndarray, rates: np.ndarray | None, finish_offset_s: np.ndarray) -> None:
        self.end_s, self.rates, self.finish_offset_s = end_s, rates, finish_offset_s

    @property
    def segments(self) -> list[tuple[float, np.ndarray]]:
        """[(end offset, rates)] of each wave."""
        if self.rates is None:
            raise ValueError("this timeline kept no rates (isolated_timeline keep_rates=False)")
        return list(zip(self.end_s.tolist(), self.rates, strict=True))

    @property
    def num_waves(self) -> int:
        return self.end_s.shape[0]

    @property
    def duration_s(self) -> float:
        return float(self.end_s[-1]) if self.end_s.size else 0.0
