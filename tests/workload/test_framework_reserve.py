"""The framework reserve: the config's, else the profile's (cited: by communicator the plan opens, or fixed), else 10%
of HBM; shown in report.json."""

from __future__ import annotations

import pytest
import yaml

from piper_sim.config import load_config
from piper_sim.errors import ConfigError
from piper_sim.paths import data_dir
from piper_sim.schedule.build import build_schedule
from piper_sim.schedule.communicators import communicator_kinds, config_reserve_bytes
from piper_sim.simulator import simulate
from piper_sim.workload.memory import FRAMEWORK_RESERVE_FRACTION, reserve_bytes
from piper_sim.workload.profile_load import load_profile

GIB, MIB = 2**30, 2**20
SMALL = {"model": "small-moe", "topology": "uniform", "parallel": {"pp": 2, "ep": 2, "num_microbatches": 2}}
# LUMI-AI-Guide issue 111 (MI250X, RCCL): the context with the first communicator, each further one
CONTEXT, FIRST, FURTHER = 0, 1024 * MIB, 665.6 * MIB  # LUMI-AI-Guide issue 111: ~1 GiB, then ~0.65 GiB each


def test_the_reserve_is_the_configs_then_the_profiles_then_a_fraction_of_hbm():
    mi250x, h100, cpu = load_profile("mi250x"), load_profile("h100"), load_profile("cpu-dev")
    assert mi250x.hbm_bytes == pytest.approx(68_702_699_520, rel=1e-4)  # a GCD as ROCm reports it
    assert reserve_bytes(mi250x, communicators=3) == CONTEXT + FIRST + 2 * FURTHER
    assert reserve_bytes(mi250x, communicators=0) == CONTEXT
    assert reserve_bytes(mi250x, 2 * GIB, communicators=3) == 2 * GIB
    for n in (0, 1, 7):  # a profile with only an aggregate figure: the same whatever the plan opens
        assert reserve_bytes(h100, communicators=n) == pytest.approx(6e9, rel=1e-3)
    assert cpu.framework_reserve_bytes is None and cpu.framework_reserve is None
    assert reserve_bytes(cpu, communicators=4) == pytest.approx(FRAMEWORK_RESERVE_FRACTION * cpu.hbm_bytes)


DENSE = {
    "name": "dense",
    "num_layers": 4,
    "d_model": 256,
    "num_heads": 4,
    "vocab_size": 1024,
    "seq_len": 256,
    "expert_ffn_dim": 1024,
    "num_experts": 1,
    "top_k": 1,
    "num_dense_layers": 4,
    "dense_ffn_dim": 1024,
}
PLANS = [  # (model, parallel, schedule, the kinds of groups the plan opens)
    ("small-moe", {"pp": 2, "ep": 2, "num_microbatches": 2}, "1f1b", ("pp", "ep", "ep_dp")),
    ("small-moe", {"pp": 1, "ep": 2, "dp": 2, "tp": 2, "etp": 1}, "1f1b", ("tp", "ep", "ep_dp", "dp", "stage")),
    (
        "small-moe",
        {"pp": 2, "ep": 2, "dp": 2, "num_microbatches": 4, "vpp": 2},
        "dualpipe",
        ("pp", "ep", "ep_dp", "dp", "mirror"),
    ),
    ("small-moe", {"pp": 1, "ep": 1, "dp": 1}, "1f1b", ()),
    (DENSE, {"pp": 2, "dp": 2, "num_microbatches": 2}, "1f1b", ("pp", "ep_dp")),
]


@pytest.mark.parametrize(("model", "parallel", "schedule", "kinds"), PLANS)
def test_the_plans_communicators_in_closed_form_and_as_the_lowered_schedule_uses_them(model, parallel, schedule, kinds):
    cfg = load_config(
        {
            "model": model,
            "topology": "uniform",
            "parallel": parallel,
            "schedule": schedule,
            "cost": {"profile": "mi250x"},
        }
    )
    assert communicator_kinds(cfg.parallel, cfg.model, cfg.schedule) == kinds
    assert config_reserve_bytes(cfg, load_profile("mi250x")) == (
        CONTEXT + (FIRST + (len(kinds) - 1) * FURTHER if kinds else 0)
    )
    lowered = build_schedule(cfg)  # the group axes (and p2p) its tasks run on, of more than one rank
    moe = bool(cfg.model.moe_layer_indices)
    used = {
        "pp" if t.kind in ("send", "recv") else t.group_axis
        for program in lowered.stage_programs
        for t in program
        if (t.kind in ("send", "recv") or (t.group_axis and len(lowered.mesh.group(0, t.group_axis)) > 1))
        and (moe or not t.role.endswith("_expert"))
    }  # a dense model's expert class holds nothing
    assert used == set(kinds)


def test_a_config_overrides_the_reserve_by_communicator():
    cfg = load_config({**SMALL, "cost": {"profile": "mi250x", "framework_reserve_GiB": 1.25}})
    assert config_reserve_bytes(cfg, load_profile("mi250x")) == 1.25 * GIB


def test_the_profiles_reserve_sources_are_cited():
    sources = _sources("mi250x")
    entry = sources["framework_reserve"]
    assert "LUMI-AI-Guide/issues/111" in str(entry["source"]["url"]) and entry["status"] == "measured"
    assert {k: entry[k]["value"] for k in ("context_MiB", "first_communicator_MiB", "per_communicator_MiB")} == {
        "context_MiB": 0,
        "first_communicator_MiB": 1024,
        "per_communicator_MiB": 665.6,
    }
    for name in ("a100", "h100"):  # the aggregate NCCL figure stays fixed, cited to nccl#864
        assert "NVIDIA/nccl issue 864" in _sources(name)["framework_reserve_GiB"]["note"]


def _sources(profile: str) -> dict:
    return yaml.safe_load((data_dir("traces/profiles/sources") / f"{profile}.yaml").read_text())


def test_a_profile_gives_one_form_of_the_reserve():
    with pytest.raises(ConfigError) as err:
        load_profile(
            {
                "extends": "h100",
                "framework_reserve_GiB": 5,
                "framework_reserve": {"context_MiB": 90, "first_communicator_MiB": 950, "per_communicator_MiB": 640},
            }
        )
    assert err.value.key == "cost.profile.framework_reserve"
    fixed = load_profile({"extends": "mi250x", "framework_reserve_GiB": 3})  # replaces the base's by-communicator
    assert fixed.framework_reserve is None and reserve_bytes(fixed, communicators=5) == 3 * GIB
    with pytest.raises(ConfigError) as err:
        load_profile(
            {
                "extends": "mi250x",
                "framework_reserve": {"context_MiB": 90, "first_communicator_MiB": -1, "per_communicator_MiB": 640},
            }
        )
    assert err.value.key.startswith("cost.profile.framework_reserve.")


def test_a_config_sets_the_reserve_and_the_report_carries_it():
    report = simulate(load_config({**SMALL, "cost": {"profile": "mi250x", "framework_reserve_GiB": 1.5}})).report
    assert report.framework_reserve_bytes == 1.5 * GIB
    assert report.memory_headroom_bytes[0] == pytest.approx(report.hbm_bytes - 1.5 * GIB - report.peak_memory_bytes[0])
    default = simulate(load_config({**SMALL, "cost": {"profile": "mi250x"}})).report
    # pp p2p, the EP all-to-alls and the dense gradients over the stage's 2 ranks
    assert default.framework_reserve_bytes == CONTEXT + FIRST + 2 * FURTHER
    for bad in (-1, "lots", True, 1e9):
        with pytest.raises(ConfigError) as err:
            load_config({**SMALL, "cost": {"profile": "mi250x", "framework_reserve_GiB": bad}})
        assert err.value.key == "cost.framework_reserve_GiB"


def test_a_profiles_reserve_must_leave_hbm():
    profile = {"extends": "mi250x", "framework_reserve_GiB": 70}
    with pytest.raises(ConfigError) as err:
        load_profile(profile)
    assert err.value.key == "cost.profile.framework_reserve_GiB"
