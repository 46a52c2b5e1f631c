"""The collective algorithms by name: ALL_TO_ALL, ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER and BROADCAST with every
algorithm registered.

Owns nothing of its own: the registries, Phase and the single-level algorithms are phases.py (all-to-all,
all-reduce), sharded.py (reduce-scatter, all-gather) and broadcast.py, the topology-aware ones hierarchical.py (2dh,
bruck; tree, hierarchical) and halo.py, the vendor libraries' models (rccl, nccl: all-to-all, rings, broadcast)
vendor.py, DeepEP's (deepep; it takes the model's fanout: bind_fanout) deepep.py.
Importing this module imports all of them, so the registries it exports are complete; the simulator and the
studies look algorithms up here, a config's `collectives` section is checked against them when it is loaded
(CollectiveChoice, collective_choice), and a machine's parameters of every algorithm are read here when a run starts
(check_collective_params).
Pure numpy; no simpy or torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from piper_sim.collectives import deepep, halo, hierarchical, vendor
from piper_sim.collectives.broadcast import BROADCAST
from piper_sim.collectives.deepep import Fanout, bind_fanout
from piper_sim.collectives.params import SCHEMAS, algorithm_params
from piper_sim.collectives.phases import (
    ALL_REDUCE,
    ALL_TO_ALL,
    Phase,
    data_phases,
    matrix_phase,
    split_exchange,
    split_phases,
)
from piper_sim.collectives.sharded import ALL_GATHER, REDUCE_SCATTER
from piper_sim.errors import ConfigError, one_of
from piper_sim.topology.graph import Topology

__all__ = [
    "ALL_GATHER",
    "ALL_REDUCE",
    "ALL_TO_ALL",
    "BROADCAST",
    "MEASURED_ALGORITHMS",
    "REDUCE_SCATTER",
    "REAL_RUN_REVISION",
    "CollectiveChoice",
    "Fanout",
    "Phase",
    "bind_fanout",
    "check_collective_params",
    "collective_choice",
    "data_phases",
    "deepep",
    "halo",
    "hierarchical",
    "matrix_phase",
    "split_exchange",
    "split_phases",
    "vendor",
]

# Algorithms whose parameters are a machine's measurements (topology.collectives.<name>): a machine without them
# cannot run them (the planner's --fix says so before the first plan).
MEASURED_ALGORITHMS = (*vendor.LIBRARIES, "deepep")

# What a real run of an algorithm moves changed at these revisions (the torch backend's implementation); a measured
# validation case records the revision it ran (validation.cases.case_digest), so a run of an earlier one is not
# scored against the present algorithm. halo 2: the torch backend runs halo_plan's phases (before: a node leader
# gathered, sent and scattered the node's rows).
REAL_RUN_REVISION = {"halo": 2}


def check_collective_params(topo: Topology) -> None:
    """Read every algorithm entry the machine gives (its `collectives` section), so that a bad value is refused
    whether or not the run reaches the algorithm; an algorithm no module registered parameters for is named."""
    for algorithm in topo.collectives:
        if algorithm not in SCHEMAS:
            raise ConfigError(f"topology.collectives.{algorithm}", topo.collectives[algorithm], one_of(SCHEMAS))
        algorithm_params(topo, algorithm)


@dataclass(frozen=True)
class CollectiveChoice:
    """A config's `collectives` section: the all-to-all and all-reduce algorithms by name, each one of its
    registry's (collective_choice checks them), and whether the MoE all-to-alls overlap the compute of a paired
    pass (schedule/lower_overlap.py; config.check_overlap says with which plans)."""

    all_to_all: str = "flat"
    all_reduce: str = "ring"
    overlap_all_to_all: bool = False


def collective_choice(section: dict) -> CollectiveChoice:
    """The `collectives` section, its names checked against ALL_TO_ALL and ALL_REDUCE: a name neither registry
    holds is a ConfigError naming collectives.all_to_all or collectives.all_reduce."""
    overlap = section.get("overlap_all_to_all", False)
    if not isinstance(overlap, bool):
        raise ConfigError("collectives.overlap_all_to_all", overlap, "true or false")
    choice = CollectiveChoice(
        all_to_all=str(section["all_to_all"]), all_reduce=str(section["all_reduce"]), overlap_all_to_all=overlap
    )
    ALL_TO_ALL.get(choice.all_to_all, "collectives.all_to_all")
    ALL_REDUCE.get(choice.all_reduce, "collectives.all_reduce")
    return choice
