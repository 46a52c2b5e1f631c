"""A profile that extends another, and a framework's measured MoE path (gate, token gather and scatter) pricing
the router and moe_out ops (DeviceProfile.moe_path)."""

from __future__ import annotations

import pytest

from piper_sim.errors import ConfigError
from piper_sim.workload.cost import TaskCoster
from piper_sim.workload.presets import load_model
from piper_sim.workload.profile_load import load_profile

PATH = {"gate_us": 1500, "gather_GBps": 400, "scatter_GBps": 100}


def test_an_extending_profile_takes_the_others_keys_and_replaces_its_own():
    base, xmoe = load_profile("mi250x"), load_profile("mi250x-xmoe")
    assert base.moe_path is None and xmoe.moe_path is not None
    assert xmoe.name == "mi250x-xmoe" and xmoe.peak_flops_per_s == base.peak_flops_per_s
    assert xmoe.attention_efficiency == base.attention_efficiency
    assert xmoe.gemm_shape_factor == base.gemm_shape_factor
    assert xmoe.gemm_efficiency(4096) == pytest.approx(0.60) and base.gemm_efficiency(4096) > 0.7


def test_the_moe_path_prices_the_gate_and_the_permutation_of_the_routed_buffer():
    model = load_model("x-moe-small")
    tokens = 8192
    xmoe = load_profile({"extends": "mi250x", "name": "x", "device": "x", "moe_path": PATH})
    coster = TaskCoster(model, xmoe, tokens)
    buffer_bytes = tokens * model.top_k * model.d_model * model.dtype_bytes
    gather_s, scatter_s = buffer_bytes / 400e9, buffer_bytes / 100e9
    assert coster.cost("forward", ("router:0",))[0] == pytest.approx(1.5e-3 + gather_s)
    assert coster.cost("forward", ("moe_out:0",))[0] == pytest.approx(scatter_s)
    assert coster.cost("backward", ("moe_out:0",))[0] == pytest.approx(gather_s)  # a scatter's backward gathers
    gate_gemms_s = coster.cost("backward_weight", ("router:0",))[0]
    assert 0 < gate_gemms_s < 1e-4  # the gate's small linear: its weight gradient alone in a split backward
    assert coster.cost("backward", ("router:0",))[0] == pytest.approx(2 * gate_gemms_s + scatter_s)
    assert coster.cost("backward_weight", ("moe_out:0",))[0] == 0.0
    # the FLOPs are the model's, whatever prices the time
    plain = TaskCoster(model, load_profile("mi250x"), tokens)
    assert coster.cost("forward", ("router:0",))[1] == plain.cost("forward", ("router:0",))[1]
    assert coster.cost("forward", ("router:0",))[0] > 3 * plain.cost("forward", ("router:0",))[0]


@pytest.mark.parametrize(
    "raw, key",
    [
        ({"gate_us": 1500, "gather_GBps": 0, "scatter_GBps": 100}, "moe_path.gather_GBps"),
        ({"gate_us": 1500, "gather_GBps": 400}, "moe_path.scatter_GBps"),
        ({"gate_us": 1500, "gather_GBps": 400, "scatter_GBps": 100, "others_us": 2400}, "moe_path.others_us"),
        ("fast", "moe_path"),
    ],
)
def test_a_malformed_moe_path_names_its_key(raw, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_profile({"extends": "mi250x", "name": "x", "device": "x", "moe_path": raw})


def test_a_profile_extends_only_a_named_profile_that_extends_none(tmp_path):
    with pytest.raises(ConfigError, match="cost.profile.extends"):
        load_profile({"extends": "mi250x-xmoe", "name": "x", "device": "x"})
    with pytest.raises(ConfigError, match="cost.profile"):
        load_profile({"extends": "no-such-profile", "name": "x", "device": "x"})
