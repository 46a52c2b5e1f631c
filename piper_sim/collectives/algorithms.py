"""The collective algorithms by name: ALL_TO_ALL and ALL_REDUCE with every algorithm registered.

Owns nothing of its own: the registries, Phase and the single-level algorithms are phases.py, the
topology-aware ones hierarchical.py (2dh, bruck; tree, hierarchical) and halo.py, the vendor libraries'
all-to-all (rccl, nccl) vendor.py. Importing this module imports all of them, so the registries it exports
are complete; the simulator and the studies look algorithms up here.
Pure numpy; no simpy or torch.
"""

from __future__ import annotations

from piper_sim.collectives import halo, hierarchical, vendor
from piper_sim.collectives.phases import (
    ALL_REDUCE,
    ALL_TO_ALL,
    Phase,
    data_phases,
    matrix_phase,
    split_exchange,
    split_phases,
)

__all__ = ["ALL_REDUCE", "ALL_TO_ALL", "Phase", "data_phases", "halo", "hierarchical", "matrix_phase",
           "split_exchange", "split_phases", "vendor"]
