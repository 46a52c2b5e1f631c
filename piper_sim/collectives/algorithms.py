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

__all__ = ["ALL_REDUCE", "ALL_TO_ALL", "REAL_RUN_REVISION", "Phase", "data_phases", "halo", "hierarchical",
           "matrix_phase", "split_exchange", "split_phases", "vendor"]

# What a real run of an algorithm moves changed at these revisions (the torch backend's implementation); a measured
# validation case records the revision it ran (validation.cases.case_digest), so a run of an earlier one is not
# scored against the present algorithm. halo 2: the torch backend runs halo_plan's phases (before: a node leader
# gathered, sent and scattered the node's rows).
REAL_RUN_REVISION = {"halo": 2}
