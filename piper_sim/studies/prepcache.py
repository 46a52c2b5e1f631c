"""Prepared collectives of one machine, reused for collectives of the same structure.

Owns PreparedCache: the all-to-all study prepares (routes, reduces, lumps: studies.reduced_collective.prepare) a
collective once per structure and simulates on it every collective that moves bytes between the same GPU
pairs, phase by phase, with sizes that differ from the prepared ones by one factor per phase and per kind
of pair (staying on a node or crossing hosts): flat's split-size exchange on flat's data; rccl's flows,
which are flat's with the library's link efficiencies; one algorithm's sizes that change nothing but the
bytes. That is exact: a factor per (phase, kind) keeps every size constant on the lumped classes (each
holds one kind of pair, or the factors agree) and on the host-symmetry orbits (automorphisms keep a pair on
its node or off it), so the reduction stays equitable for the new sizes. What prepare does not read (the
phases' order, dependencies, messages and library costs) is the new phases' own. Must not import torch.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace

import numpy as np

from piper_sim.collectives.phases import Phase
from piper_sim.studies.reduced_collective import Prepared, prepare
from piper_sim.topology.graph import Topology

KINDS = 2  # 0: both ends on one host, 1: crossing hosts


def _digest(*arrays: np.ndarray) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for a in arrays:
        h.update(np.ascontiguousarray(a).view(np.uint8))
        h.update(str(a.shape).encode())
    return h.digest()


def _relative(sizes: np.ndarray) -> tuple[bytes, float]:
    """(digest of the sizes over their largest, the largest); equal sizes are recognized without hashing them."""
    peak = float(sizes.max(initial=0.0))
    if sizes.size == 0 or peak <= 0:
        return b"empty" if sizes.size == 0 else _digest(sizes), peak
    if float(sizes.min()) == peak:
        return f"equal:{sizes.size}".encode(), peak
    return _digest(np.round(sizes / peak, 12)), peak


def structure(phases: list[Phase], host: np.ndarray) -> tuple[tuple, np.ndarray]:
    """(key: every phase's GPU pairs in order and its sizes relative to the largest of each kind of pair;
    the largest size per phase and kind, shape (phases, KINDS))."""
    n = int(host.size)
    code_type = np.int32 if n * n < 2**31 else np.int64
    key, largest = [], np.zeros((len(phases), KINDS))
    for k, ph in enumerate(phases):
        pairs = ph.src.astype(code_type) * code_type(n) + ph.dst.astype(code_type)
        remote = host[ph.src] != host[ph.dst]
        parts = []
        for kind in range(KINDS):
            rel, peak = _relative(ph.sizes[remote == bool(kind)])
            parts.append(rel)
            largest[k, kind] = peak
        key.append((_digest(pairs), *parts))
    return tuple(key), largest


def light(phases: list[Phase]) -> list[Phase]:
    """The phases with what simulate reads kept (order, dependencies, costs, the busiest source's flow count)
    and their flow arrays dropped: a prepared collective holds these instead of its full phases."""
    out = []
    for ph in phases:
        posted = int(np.bincount(ph.src).max()) if ph.src.size else 0
        stub = np.zeros(posted, dtype=np.int64)
        out.append(replace(ph, src=stub, dst=stub, sizes=np.zeros(posted)))
    return out


def rescaled(prep: Prepared, factors: np.ndarray) -> Prepared | None:
    """The prepared collective with each class's sizes times its (phase, kind) factor, or None where a class
    holding both kinds of pair would need two factors."""
    lp = prep.lumped
    kind = prep.class_remote
    mixed = kind < 0
    per_class = factors[prep.class_phase, np.maximum(kind, 0)]
    if mixed.any() and not np.allclose(
        factors[prep.class_phase[mixed], 0], factors[prep.class_phase[mixed], 1], rtol=1e-9, atol=0.0
    ):
        return None
    return replace(prep, lumped=replace(lp, sizes=lp.sizes * per_class))


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
        self._host = np.array([self.topo.host_of(g) for g in self.gpus])

    def get(self, phases: list[Phase], symmetric: bool) -> Prepared:
        """The prepared collective for these phases (its class sizes those of these phases)."""
        key, largest = structure(phases, self._host)
        hit = self._entries.get((key, symmetric))
        if hit is not None:
            prep, base = hit
            factors = np.divide(largest, base, out=np.ones_like(largest), where=base > 0)
            reused = rescaled(prep, factors)
            if reused is not None:
                return replace(reused, phases=light(phases), prepare_s=0.0)
        prep = prepare(
            phases,
            self.gpus,
            self.topo,
            symmetric=symmetric,
            lump_flows=self.lump_flows,
            spread=self.spread,
            max_sub_flows=self.max_sub_flows,
        )
        prep = replace(prep, phases=light(phases))
        self._entries[(key, symmetric)] = (prep, largest)
        return prep
