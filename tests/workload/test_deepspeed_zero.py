"""DeepSpeed's ZeRO-1/2 gradient reduction (workload/deepspeed_zero.py): the cut of a rank's gradients into the
all-reduce calls of its reduce buckets, the bucket size read from DeepSpeed's source (traces/collectives/
deepspeed-zero.yaml), and `optimizer.gradient_reduce` checked at load."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from piper_sim.config import load_config
from piper_sim.errors import ConfigError
from piper_sim.workload.deepspeed_zero import BUCKET_ORDER, REDUCE_BUCKET_ELEMENTS, reduce_buckets

DATA = Path(__file__).resolve().parents[2] / "traces" / "collectives" / "deepspeed-zero.yaml"
MOE = "small-moe"


def test_buckets_cut_the_classes_laid_end_to_end():
    """Dense 7 then experts 6 (x 1e8) in buckets of 5: the dense fill bucket 0 and 2 of bucket 1, the experts the
    other 3 of bucket 1 and 3 of bucket 2: two calls each, one per bucket a class is in."""
    pieces = reduce_buckets({"dense": 7e8, "replicated": 0.0, "expert": 6e8}, bucket_elements=5e8)
    assert pieces == {"dense": (5e8, 2e8), "replicated": (), "expert": (3e8, 3e8)}
    # one class filling exactly a bucket makes one call, and the next class starts a bucket of its own
    assert reduce_buckets({"dense": 5e8, "expert": 1e8}, bucket_elements=5e8) == {
        "dense": (5e8,),
        "replicated": (),
        "expert": (1e8,),
    }


def test_the_calls_hold_every_gradient_once_and_no_bucket_overflows():
    params = {"dense": 576_716_800.0, "replicated": 3.2e6, "expert": 1_291_845_632.0}
    pieces = reduce_buckets(params)
    assert {kind: sum(pieces[kind]) for kind in BUCKET_ORDER} == pytest.approx(params, rel=1e-12)
    assert all(0 < p <= REDUCE_BUCKET_ELEMENTS for kind in BUCKET_ORDER for p in pieces[kind])
    calls = sum(len(pieces[kind]) for kind in BUCKET_ORDER)
    buckets = -(-sum(params.values()) // REDUCE_BUCKET_ELEMENTS)
    assert calls == buckets + 2  # bucket 1 holds the end of the dense, the replicated and the start of the experts


def test_the_bucket_and_the_defaults_are_deepspeeds():
    data = yaml.safe_load(DATA.read_text())
    assert data["version"]["value"] == "0.15.5"
    defaults = data["defaults"]
    assert defaults["reduce_bucket_size"]["value"] == REDUCE_BUCKET_ELEMENTS
    # the behaviour the model encodes: one all-reduce per group and bucket, not overlapped with the backward
    assert defaults["use_multi_rank_bucket_allreduce"]["value"] is True
    assert defaults["overlap_comm"]["value"] is False
    assert all("b0283d5c" in d["source"] or "2afa1c7f" in d["source"] for d in defaults.values())


@pytest.mark.parametrize("value,zero", [("deepspeed", 0), ("deepspeed", 3), ("deepspeed-reduce", 1), (True, 1)])
def test_a_bad_gradient_reduce_names_the_key(value, zero):
    sets = [f"optimizer.zero={zero}", "parallel.dp=2", f"optimizer.gradient_reduce={value}"]
    with pytest.raises(ConfigError) as err:
        load_config(MOE, sets)
    assert err.value.key == "optimizer.gradient_reduce"
    assert "reduce-scatter" in err.value.allowed


@pytest.mark.parametrize("zero", [1, 2])
def test_deepspeed_is_taken_with_zero_1_or_2_and_left_out_is_reduce_scatter(zero):
    sets = [f"optimizer.zero={zero}", "parallel.dp=2"]
    assert load_config(MOE, [*sets, "optimizer.gradient_reduce=deepspeed"]).gradient_reduce == "deepspeed"
    assert load_config(MOE, sets).gradient_reduce == "reduce-scatter"
