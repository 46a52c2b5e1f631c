"""The estimator's pipeline hop: every rank of a stage sends its activations to its counterpart at once (as the
simulator's one flow set of the stage's transfers does), so on Frontier the two GCDs of a package share its NIC."""

from __future__ import annotations

import numpy as np
import pytest

from piper_sim.collectives.algorithms import Phase
from piper_sim.config import load_config
from piper_sim.planning.estimate import config_estimator

MOE = "examples/small-moe.yaml"


@pytest.mark.parametrize(("topology", "together"), [("frontier", 2.0), ("uniform", 1.0)])
def test_the_pipeline_hop_shares_the_nics_the_stage_sends_through(topology, together):
    cfg = load_config(MOE, [f"topology={topology}", "parallel.pp=2", "parallel.ep=1", "parallel.dp=8"])
    est, point = config_estimator(cfg)
    tokens = 1 << 24  # large activations: the links' time, not the per-message overhead, decides
    size = tokens * est.model.d_model * est.model.dtype_bytes * point.parallel.split.sequence_share
    one = Phase(src=np.array([0]), dst=np.array([1]), sizes=np.array([float(size)]), name="p2p")
    alone = est.phases_s([one], (est.gpus[0], est.gpus[8]))
    assert est._p2p_s(point, tokens) - est.profile.p2p_overhead_s == pytest.approx(together * alone, rel=0.01)
