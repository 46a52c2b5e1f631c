"""The vendor libraries' all-to-all, RCCL and NCCL, as ncclAllToAll runs it: grouped point-to-point.

Owns the `rccl` and `nccl` all-to-all models (registered in piper_sim.collectives.phases' registry;
algorithms.py imports this module). Their parameters are data: the topology's `collectives.rccl` /
`collectives.nccl` entry, one set per library and machine, each value's source in the data file the
entry names (traces/collectives/). Pure numpy; no simpy or torch.

What the libraries do (ROCm/rccl src/collectives.cc ncclAllToAll; NVIDIA/nccl the same): a group of one
ncclSend and one ncclRecv per rank, the rank itself included (RCCL calls this a fan-out: everyone sends
to and receives from everyone). The group is scheduled as point-to-point operations per peer, a rank's
peers taken in rounds (src/enqueue.cc, the p2p schedule); a bounded number of peers is in flight at once
(`peers_in_flight`: the p2p channels over the channels each peer uses, times the operations a channel
runs at once); each peer's bytes move in chunks (`net_chunk_MiB`: NCCL_P2P_NET_CHUNKSIZE across the
network, `intra_chunk_MiB`: NCCL_P2P_NVL_CHUNKSIZE over NVLink / xGMI), each chunk one operation of the
rank's proxy; each GPU sends through the NIC the library picks for it, which is the topology's route
(Frontier: the GCD's nearest NIC; DGX H100: PXN, the NIC of the destination's rail).

The model: one phase with every pair's flow (the max-min network takes them together, as the rounds of a
well-spread schedule load the same links on average: the peer schedule's fluid mean), which pays before its
flows
- `per_peer_us` for each of the rank's n - 1 peers, posted one after another (a send and a receive), and
- `per_chunk_us` for each chunk the busiest rank's proxy handles (its bytes to each peer over the
  chunk size, rounded up), and
- one path latency per round of peers: ceil((n - 1) / peers_in_flight) rounds.
The topology's generic per-message overhead is not charged again (the phase's overhead_s is 0). A
collective alone on the network therefore takes what the rounds would: the same bytes on the same links,
plus the library's costs, which are what separate it from the ideal `flat`.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from piper_sim.collectives.params import algorithm_params
from piper_sim.collectives.phases import ALL_TO_ALL, Phase, matrix_phase, split_exchange
from piper_sim.topology.graph import Topology

VENDOR_SCHEMA: dict[str, object] = {
    "peers_in_flight": ..., "per_peer_us": ..., "per_chunk_us": ...,
    "net_chunk_MiB": 0.125, "intra_chunk_MiB": 0.5,
}
LIBRARIES = ("rccl", "nccl")


def vendor_costs(src: np.ndarray, dst: np.ndarray, sizes: np.ndarray, members: list[str], topo: Topology,
                 library: str) -> tuple[float, int]:
    """(host-side cost before the flows, rounds of peers) of the library's all-to-all of these flows."""
    p = algorithm_params(topo, library, VENDOR_SCHEMA, integers=("peers_in_flight",))
    n = len(members)
    host = np.array([topo.host_of(m) for m in members])
    chunk = np.where(host[src] != host[dst], float(p["net_chunk_bytes"]), float(p["intra_chunk_bytes"]))
    chunks = np.ceil(sizes / chunk)
    busiest = float(np.bincount(src, weights=chunks, minlength=n).max(initial=0.0))
    peers = n - 1
    rounds = math.ceil(peers / int(p["peers_in_flight"])) if peers else 0
    return peers * float(p["per_peer_s"]) + busiest * float(p["per_chunk_s"]), rounds


def vendor_all_to_all(library: str):
    """The registered model of one library (the same decomposition; the parameters are the library's)."""

    def model(matrix: np.ndarray, members: list[str], topo: Topology) -> list[Phase]:
        flows = matrix_phase(matrix, "p2p")
        delay, rounds = vendor_costs(flows.src, flows.dst, flows.sizes, members, topo, library)
        return [replace(flows, overhead_s=0.0, delay_s=delay, messages=max(rounds, 1))]

    model.__name__ = model.__qualname__ = f"a2a_{library}"
    model.__doc__ = f"{library.upper()}'s all-to-all: grouped point-to-point per peer (module docstring)."
    return model


for _library in LIBRARIES:
    ALL_TO_ALL.register(_library)(split_exchange(node_gather=False)(vendor_all_to_all(_library)))
