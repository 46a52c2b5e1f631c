"""Across tapered dragonfly groups, HALO beats flat when messages are small: the reason is message count.

Each source posts its messages one after another (the topology's per-message overhead, 2 us in the
dragonfly preset). Flat posts 63 messages per GPU on 64 GPUs; HALO at most 7 per phase. With 4 KiB per
pair the transfers are short, so posting dominates flat's time; with 1 MiB per pair the saturated global
links dominate both and HALO is no faster (tests/studies/test_study_all_to_all.py).
"""

from __future__ import annotations

import numpy as np
import simpy

from piper_sim.collectives.algorithms import ALL_TO_ALL
from piper_sim.network import CollectiveRunner, FlowNetwork
from piper_sim.topology.load import load_topology


def run(algorithm: str, bytes_per_pair: float, topo) -> tuple[float, np.ndarray]:
    env = simpy.Environment()
    net = FlowNetwork(env, topo.capacity_bytes_per_s)
    phases = ALL_TO_ALL.get(algorithm)(np.full((64, 64), bytes_per_pair), topo.gpus, topo)
    env.run(CollectiveRunner(env, net, topo).run(phases, tuple(topo.gpus), algorithm))
    return env.now, net.link_bytes


def test_halo_beats_flat_across_groups_with_small_messages():
    topo = load_topology({"preset": "dragonfly"}, 64)
    flat_t, flat_bytes = run("flat", 4096.0, topo)
    halo_t, halo_bytes = run("halo", 4096.0, topo)
    assert halo_t < 0.5 * flat_t
    overhead = topo.params.message_overhead_s
    assert flat_t > 63 * overhead  # flat's time is mostly its GPUs posting 63 messages each
    # the reason is not the links: both move the same bytes over the global links
    global_links = [i for i, kind in enumerate(topo.link_kinds) if kind == "global"]
    assert np.isclose(flat_bytes[global_links].sum(), halo_bytes[global_links].sum(), rtol=1e-9)
