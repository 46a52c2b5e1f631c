"""The estimator's MoE all-to-all: every EP group of a stage dispatches the same layer at the same moment (as the
simulator runs them), so it is priced with all the stage's groups' flows on the links they share: on 256 Frontier
GCDs, eight groups of four nodes each cross the same switch links of their dragonfly group."""

from __future__ import annotations

import numpy as np
import pytest

from piper_sim.analysis.task_arrays import TaskArrays
from piper_sim.collectives.algorithms import ALL_TO_ALL, Fanout, bind_fanout
from piper_sim.config import load_config
from piper_sim.planning.estimate import config_estimator
from piper_sim.simulator import simulate

TWO_GROUPS = {
    "model": {"preset": "x-moe-small", "num_layers": 2},
    "parallel": {"convention": "megatron", "pp": 1, "ep": 32, "dp": 256, "num_microbatches": 1, "micro_batch_size": 1},
    "schedule": "1f1b",
    "topology": "frontier",
    "collectives": {"all_to_all": "flat"},
    "cost": {"profile": "mi250x"},
}


def _alone_s(est, point, tokens: int) -> float:
    """The first EP group's dispatch priced by itself."""
    m = est.model
    per_pair = tokens * m.top_k / point.ep * m.d_model * m.dtype_bytes
    algorithm = bind_fanout(ALL_TO_ALL.get("flat", "collectives.all_to_all"), Fanout(m.top_k, m.num_experts))
    gpus = est.gpus[: point.ep]
    return est.phases_s(algorithm(np.full((point.ep, point.ep), per_pair), list(gpus), est.topo), tuple(gpus))


def test_the_all_to_all_is_priced_with_every_ep_group_of_the_stage():
    cfg = load_config(TWO_GROUPS)
    est, point = config_estimator(cfg)
    tokens = point.parallel.tokens_per_microbatch(cfg.model.seq_len)
    estimated = est._all_to_all_s(point, tokens)
    assert estimated > 1.25 * _alone_s(est, point, tokens)  # one group alone: 3.15 ms, all eight at once 4.11
    result = simulate(cfg)
    assert isinstance(result.tasks, TaskArrays)
    rows = result.tasks.rank_rows(0)
    dispatch = rows[(rows.kind == "all_to_all") & (rows.role == "dispatch")]
    assert (dispatch.end_s - dispatch.start_s).to_numpy() == pytest.approx(estimated, rel=0.01)
