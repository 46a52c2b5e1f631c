"""Published breakdowns of part of a run's time beside the prediction of the same pieces (validation/breakdown.py)."""

from __future__ import annotations

import pytest

from piper_sim.config import load_config
from piper_sim.errors import ConfigError
from piper_sim.paths import data_dir
from piper_sim.planning.estimate import config_estimator
from piper_sim.validation.breakdown import predicted_breakdown
from piper_sim.validation.published import breakdown_table, find_published

ROOT = data_dir("validation") / "published"


def test_the_shipped_breakdowns_are_priced_term_by_term():
    runs = find_published(["xmoe2025-small-frontier-256gcd", "korthikanti2022-22b-selective-sp"], ROOT)
    table = breakdown_table(runs).set_index(["name", "term"])
    xmoe = table.loc["xmoe2025-small-frontier-256gcd"]
    # the gate, dispatch and combine bars are the profile's measured MoE path: equal by construction (rates rounded)
    assert xmoe.loc["router_forward", "predicted_s"] == pytest.approx(2.0e-3, rel=1e-3)
    assert xmoe.loc["moe_out_forward", "predicted_s"] == pytest.approx(2.0e-3, rel=1e-3)
    assert xmoe.loc["unmodelled", "predicted_s"] == 0.0 and xmoe.loc["unmodelled", "published_s"] == 2.4e-3
    assert xmoe.loc["experts_forward", "predicted_s"] > 0 and xmoe.loc["all_to_all_forward", "predicted_s"] > 0
    dense = table.loc["korthikanti2022-22b-selective-sp"]
    assert dense.loc["layer_backward", "predicted_s"] > dense.loc["layer_forward", "predicted_s"] > 0


def test_a_layer_is_its_ops_and_collectives_and_the_setting_overrides_apply():
    config = {
        "model": "x-moe-small",
        "topology": "frontier",
        "parallel": {"pp": 1, "ep": 8, "num_microbatches": 2},
        "recompute": "full",
    }
    rows = {
        r["term"]: r["predicted_s"]
        for r in predicted_breakdown(
            config,
            {
                "set": ["recompute=none"],
                "terms_ms": dict.fromkeys(
                    ("layer_forward", "router_forward", "experts_forward", "moe_out_forward", "all_to_all_forward"), 1.0
                ),
            },
            "case",
        )
    }
    estimator, point = config_estimator(load_config(config, ["recompute=none"]))
    coster = estimator.coster(point.micro_batch_size * 2048, point.parallel.split)
    attn = coster.op_s("attn:0")[0]
    parts = attn + rows["router_forward"] + rows["experts_forward"] + rows["moe_out_forward"]
    assert rows["layer_forward"] == pytest.approx(parts + rows["all_to_all_forward"], rel=1e-9)


def test_an_unknown_term_is_refused_by_its_run():
    with pytest.raises(ConfigError) as err:
        predicted_breakdown({"model": "small-moe"}, {"terms_ms": {"softmax": 1.0}}, "mine")
    assert err.value.key == "mine: breakdown.terms_ms"
