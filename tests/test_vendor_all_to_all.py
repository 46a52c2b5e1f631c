"""The vendor all-to-all models (rccl, nccl): their decomposition, their costs, and their parameters' sources."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from piper_sim.collectives.algorithms import ALL_TO_ALL, split_phases
from piper_sim.errors import ConfigError
from piper_sim.studies.runner import run_collective
from piper_sim.topology.load import load_topology, read_topology_mapping

DATA = Path(__file__).resolve().parents[1] / "traces" / "collectives"
PARAMS = {"peers_in_flight": 4, "per_peer_us": 3.0, "per_chunk_us": 1.0, "net_chunk_MiB": 0.125,
          "intra_chunk_MiB": 0.5}


def uniform(num_gpus: int, library: str = "rccl") -> object:
    return load_topology({"builder": "uniform", "params": {
        "gpus_per_node": 4, "intra_bandwidth_GBps": 100, "nic_bandwidth_GBps": 10, "message_overhead_us": 2.0},
        "collectives": {library: PARAMS}}, num_gpus)


@pytest.mark.parametrize("library", ["rccl", "nccl"])
def test_one_phase_of_every_pair_priced_by_the_library(library):
    """16 GPUs on 4 nodes, 1 MiB per pair: every pair's flow in one phase; before it, 15 peers x 3 us, the
    busiest rank's chunks (12 remote peers x 8 chunks of 128 KiB + 3 local peers x 2 of 512 KiB) x 1 us,
    and one latency per round of 4 peers (4 rounds); the topology's 2 us per message is not charged."""
    topo = uniform(16, library)
    m = np.full((16, 16), 2.0**20)
    meta, (data,) = split_phases(ALL_TO_ALL.get(library)(m, topo.gpus, topo))
    assert data.src.size == 16 * 15 and data.overhead_s == 0.0
    assert data.delay_s == pytest.approx(15 * 3e-6 + (12 * 8 + 3 * 2) * 1e-6)
    assert data.messages == math.ceil(15 / 4)
    assert [p.name for p in meta] == ["splits:p2p"]  # the counts go by the library itself, no node gather
    flat = run_collective(split_phases(ALL_TO_ALL.get("flat")(m, topo.gpus, topo))[1], topo.gpus, topo)[1]
    vendor = run_collective([data], topo.gpus, topo)[1]
    latency = topo.path_latency_s(topo.route(topo.gpus[0], topo.gpus[4]))
    transfer = flat.time_s - 15 * 2e-6 - latency  # the same bytes on the same links
    assert vendor.time_s == pytest.approx(data.delay_s + 4 * latency + transfer, rel=1e-9)
    np.testing.assert_allclose(vendor.link_bytes, flat.link_bytes)


def test_missing_library_parameters_name_the_key():
    topo = load_topology("uniform", 8)
    with pytest.raises(ConfigError, match="topology.collectives.nccl.peers_in_flight"):
        ALL_TO_ALL.get("nccl")(np.ones((8, 8)), topo.gpus, topo)
    topo.collectives = {"nccl": {**PARAMS, "peers_in_flight": 0}}
    with pytest.raises(ConfigError, match="peers_in_flight"):
        ALL_TO_ALL.get("nccl")(np.ones((8, 8)), topo.gpus, topo)


def test_rccl_frontier_parameters_come_from_the_cited_measurement():
    """per_peer_us and per_chunk_us of topologies/frontier.yaml are the derivations in
    traces/collectives/rccl-frontier.yaml, recomputed from the measured points stored there."""
    data = yaml.safe_load((DATA / "rccl-frontier.yaml").read_text())
    params = read_topology_mapping("frontier")["collectives"]["rccl"]
    (gather,) = data["measured"]
    small, large = gather["points"]
    ranks, nodes, nics, nic_bw = 32, 4, 4, 25e9
    per_peer_us = small["time_us"] / (ranks - 1)
    node_rate = (nodes - 1) / nodes * large["bytes"] / (large["time_us"] * 1e-6)
    per_nic = node_rate / nics
    per_chunk_us = (2 / per_nic - 1 / (nic_bw / 2)) * params["net_chunk_MiB"] * 2**20 * 1e6
    assert params["per_peer_us"] == pytest.approx(per_peer_us, rel=0.02)
    assert params["per_chunk_us"] == pytest.approx(per_chunk_us, rel=0.02)
    for key, entry in data["parameters"].items():
        assert params[key] == entry["value"], key
    assert read_topology_mapping("lumi")["collectives"]["rccl"] | {"source": None} == params | {"source": None}
