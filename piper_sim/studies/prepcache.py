"""Prepared collectives of one machine, reused for collectives of the same structure.

Owns PreparedCache: the all-to-all study prepares (routes, reduces, lumps: studies.runner.prepare) a
collective once per structure and simulates every collective with the same flows and proportional sizes
on it (flat's split-size exchange on flat's data; rccl's flows, which are flat's; one algorithm's sizes
that change nothing but the bytes). A collective alone on idle links takes a time linear in its bytes for
a fixed structure, so scaling the prepared sizes is the same run (simulate's `scale`); the delays are the
new phases' own (library costs that depend on the sizes). Must not import torch.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace

import numpy as np

from piper_sim.collectives.phases import Phase
from piper_sim.studies.runner import Prepared, prepare
from piper_sim.topology.graph import Topology


def _digest(*arrays: np.ndarray) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for a in arrays:
        h.update(np.ascontiguousarray(a).view(np.uint8))
        h.update(str(a.shape).encode())
    return h.digest()


def structure(phases: list[Phase]) -> tuple[tuple, np.ndarray]:
    """(key of the flows, their order and their relative sizes; the largest flow of every phase)."""
    key, largest = [], []
    for ph in phases:
        peak = float(ph.sizes.max(initial=0.0))
        rel = np.round(ph.sizes / peak, 12) if peak > 0 else ph.sizes
        key.append((_digest(ph.src, ph.dst, rel), ph.after, ph.messages))
        largest.append(peak)
    return tuple(key), np.array(largest)


def light(phases: list[Phase]) -> list[Phase]:
    """The phases with what simulate reads kept (order, dependencies, costs, the busiest source's flow count)
    and their flow arrays dropped: a prepared collective holds these instead of its full phases."""
    out = []
    for ph in phases:
        posted = int(np.bincount(ph.src).max()) if ph.src.size else 0
        stub = np.zeros(posted, dtype=np.int64)
        out.append(replace(ph, src=stub, dst=stub, sizes=np.zeros(posted)))
    return out


@dataclass
class PreparedCache:
    """Prepared collectives of one topology and member list, keyed by flow structure."""

    gpus: list[str]
    topo: Topology
    lump_flows: bool = True
    spread: bool = False
    max_sub_flows: int | None = None

    def __post_init__(self) -> None:
        self._entries: dict[tuple, tuple[Prepared, np.ndarray]] = {}

    def get(self, phases: list[Phase], symmetric: bool) -> tuple[Prepared, float]:
        """(prepared collective for these phases, factor to scale its sizes by)."""
        key, largest = structure(phases)
        hit = self._entries.get((key, symmetric))
        if hit is not None:
            prep, base = hit
            nonzero = base > 0
            factors = largest[nonzero] / base[nonzero]
            if factors.size == 0 or np.allclose(factors, factors[0], rtol=1e-9, atol=0.0):
                reused = replace(prep, phases=light(phases), prepare_s=0.0)
                return reused, float(factors[0]) if factors.size else 1.0
        prep = prepare(phases, self.gpus, self.topo, symmetric=symmetric, lump_flows=self.lump_flows,
                       spread=self.spread, max_sub_flows=self.max_sub_flows)
        prep = replace(prep, phases=light(phases))
        self._entries[(key, symmetric)] = (prep, largest)
        return prep, 1.0
