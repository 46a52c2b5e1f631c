"""The cost profile follows the machine (piper_sim.profile_choice): a topology's device_profile is taken where the
config gives none, a given profile of another device is refused unless asked for, a real run on CPU takes a CPU
profile; every command that builds a machine goes through it."""

from __future__ import annotations

import shutil

import pytest
import yaml

from piper_sim.config import for_devices, load_config
from piper_sim.errors import ConfigError
from piper_sim.notes import config_notes
from piper_sim.paths import data_dir
from piper_sim.planning.plan_fixes import parse_fixes
from piper_sim.planning.planner import PlanRequest, screen
from piper_sim.simulator import simulate
from piper_sim.studies.config_sweep import sweep_points
from piper_sim.validation.cases import case_digest, load_case
from piper_sim.workload.profile_load import load_profile

TINY = {"model": "tiny-moe", "parallel": {"pp": 2, "ep": 2}}


@pytest.mark.parametrize(
    ("topology", "profile"),
    [
        ("dgx-h100-superpod", "h100"),
        ("dgx-a100-superpod", "a100"),
        ("frontier", "mi250x"),
        ("lumi", "mi250x"),
        ("dgx-h200-superpod", "h200"),
        ("dgx-b200-superpod", "b200"),
        ("gb200-nvl72", "gb200"),
        ("mi300x-cluster", "mi300x"),
        ("testbed-2g", "cpu-2rank"),
        ("testbed-flat", "cpu-2rank"),
        ("uniform", "mi250x"),
        ("fat-tree", "mi250x"),
        ("dragonfly", "mi250x"),  # generic: the global default
    ],
)
def test_a_config_without_a_profile_takes_its_topologys(topology, profile):
    cfg = load_config({**TINY, "topology": topology})
    assert cfg.cost_profile == profile and cfg.raw["cost"]["profile"] == profile  # config.yaml records it
    assert [n for n in config_notes(cfg) if n.startswith("cost.profile")]  # and the note says it was chosen


def test_a_simulation_of_h100s_is_priced_as_h100s():
    result = simulate(
        load_config(
            {
                "model": "small-moe",
                "parallel": {"pp": 2, "ep": 4, "num_microbatches": 4},
                "topology": "dgx-h100-superpod",
            }
        )
    )
    h100 = load_profile("h100")
    assert result.report.hbm_bytes == h100.hbm_bytes != load_profile("mi250x").hbm_bytes
    peak = result.report.model_flops_per_step / (result.report.step_time_s * 8 * result.report.mfu)
    assert peak == pytest.approx(h100.peak_flops_per_s, rel=1e-9)


def test_plan_prices_the_topologys_gpus():
    # issue 40's case: Qwen3-30B-A3B on 16 H100s was screened against MI250X memory
    request = PlanRequest(
        model="qwen3-30b-a3b",
        num_gpus=16,
        global_batch=256,
        seq_len=4096,
        topology="dgx-h100-superpod",
        fixed=parse_fixes(["parallel.ep=16"]),
        domain="any",
        top_k=0,
    )
    _, table, hbm_bytes, _ = screen(request)
    assert hbm_bytes == load_profile("h100").hbm_bytes
    assert request.config(_point(table))["cost"]["profile"] == "h100"  # what the refined plans simulate
    with pytest.raises(ConfigError) as err:
        screen(PlanRequest(**{**request.__dict__, "profile": "mi250x"}))
    assert (err.value.key, err.value.value) == ("--profile", "mi250x") and "h100" in err.value.allowed
    _, _, hbm_bytes, _ = screen(PlanRequest(**{**request.__dict__, "profile": "mi250x", "allow_device_mismatch": True}))
    assert hbm_bytes == load_profile("mi250x").hbm_bytes


def _point(table):
    from piper_sim.planning.plan_point import PlanPoint
    from piper_sim.planning.planner import _py

    row = table.iloc[0]
    return PlanPoint(**{k: _py(row[k]) for k in PlanPoint.__dataclass_fields__})


@pytest.mark.parametrize(
    ("topology", "profile"),
    [
        ("frontier", "h100"),
        ("dgx-h100-superpod", "mi250x"),
        ("dgx-a100-superpod", "h100"),
        ("testbed-2g", "mi250x"),
        ("frontier", "cpu-dev"),
    ],
)
def test_a_profile_of_another_device_is_refused_unless_asked_for(topology, profile):
    with pytest.raises(ConfigError) as err:
        load_config({**TINY, "topology": topology, "cost": {"profile": profile}})
    assert (err.value.key, err.value.value) == ("cost.profile", profile)
    own = yaml.safe_load((data_dir("topologies") / f"{topology}.yaml").read_text())["device_profile"]
    assert own in err.value.allowed and "cost.allow_device_mismatch" in err.value.allowed
    cfg = load_config({**TINY, "topology": topology, "cost": {"profile": profile, "allow_device_mismatch": True}})
    assert cfg.cost_profile == profile


@pytest.mark.parametrize(
    ("topology", "profile"),
    [
        ("frontier", "mi250x-xmoe"),  # extends mi250x: the same device
        ("testbed-2g", "cpu-8rank"),
        ("testbed-flat", "cpu-dev"),  # another calibration of the same CPUs
        ("uniform", "h100"),  # a generic machine takes any device
    ],
)
def test_a_profile_of_the_same_device_is_taken(topology, profile):
    assert load_config({**TINY, "topology": topology, "cost": profile}).cost_profile == profile


def test_an_inline_profile_without_a_device_kind_cannot_match_a_named_machine():
    from conftest import EXACT_PROFILE

    with pytest.raises(ConfigError, match="no device_kind"):
        load_config({**TINY, "topology": "frontier", "cost": {"profile": EXACT_PROFILE}})
    assert load_config({**TINY, "cost": {"profile": EXACT_PROFILE}}).cost_profile == EXACT_PROFILE  # uniform
    named = {**EXACT_PROFILE, "device_kind": "mi250x"}
    assert load_config({**TINY, "topology": "frontier", "cost": {"profile": named}}).cost_profile == named


def test_a_real_run_on_cpu_takes_a_cpu_profile():
    assert load_config(TINY, devices="cpu").cost_profile == "cpu-dev"  # uniform names no device
    assert load_config({**TINY, "topology": "frontier"}, devices="cpu").cost_profile == "cpu-dev"
    assert load_config({**TINY, "topology": "testbed-2g"}, devices="cpu").cost_profile == "cpu-2rank"
    assert load_config({**TINY, "topology": "frontier", "cost": "cpu-8rank"}, devices="cpu").cost_profile == "cpu-8rank"
    with pytest.raises(ConfigError) as err:
        load_config({**TINY, "cost": "mi250x"}, devices="cpu")
    assert (err.value.key, err.value.value) == ("cost.profile", "mi250x") and "cpu-dev" in err.value.allowed
    # a config resolved for the topology, then run: re-priced for the CPU ranks (measure does this)
    assert for_devices(load_config({**TINY, "topology": "frontier"}), "cpu").cost_profile == "cpu-dev"
    assert for_devices(load_config(TINY), None).cost_profile == "mi250x"  # on GPUs: the topology's


def test_a_sweep_prices_each_points_topology():
    points = sweep_points(
        {**TINY, "parallel": {"pp": 2, "ep": 2}}, [("topology", ["frontier", "dgx-h100-superpod", "uniform"])]
    )
    assert [resolved["cost"]["profile"] for _, resolved in points] == ["mi250x", "h100", "mi250x"]


@pytest.mark.parametrize(
    "path",
    sorted((data_dir("validation") / "published").glob("*.yaml")) + sorted(data_dir("examples").glob("*.yaml")),
    ids=lambda p: p.stem,
)
def test_published_and_example_configs_stay_valid(path):
    raw = yaml.safe_load(path.read_text())
    config = raw.get("config", raw)
    if isinstance(config.get("topology"), str) and config["topology"].endswith(".yaml"):
        config["topology"] = str((path.parent / config["topology"]).resolve())
    load_config(config)


def test_the_device_profile_line_does_not_change_a_cases_digest(tmp_path):
    case_dir = data_dir("validation") / "cases" / "2g-1f1b-pp2ep4-flat"
    root = tmp_path / "validation" / "cases"
    shutil.copytree(case_dir, root / case_dir.name)
    (tmp_path / "topologies").mkdir()
    topology = tmp_path / "topologies" / "testbed-2g.yaml"
    text = (data_dir("topologies") / "testbed-2g.yaml").read_text()
    topology.write_text(text)
    digest = case_digest(load_case(root / case_dir.name))
    assert digest == yaml.safe_load((case_dir / "measured" / "measured.json").read_text())["case_digest"]
    topology.write_text(text.replace("device_profile: cpu-2rank", "device_profile: cpu-8rank"))
    assert case_digest(load_case(root / case_dir.name)) == digest  # prices predictions only
    topology.write_text(text.replace("nic_bandwidth_Mbps: 100", "nic_bandwidth_Mbps: 200"))
    assert case_digest(load_case(root / case_dir.name)) != digest  # what the real run depends on


def test_a_topology_names_its_profile_by_name():
    with pytest.raises(ConfigError) as err:
        load_config({**TINY, "topology": {"preset": "frontier", "device_profile": ["mi250x"]}})
    assert err.value.key == "topology.device_profile"


def test_validate_refuses_a_profile_of_another_device_before_measuring(capsys):
    from piper_sim.cli import main

    assert main(["validate", "2g-1f1b-pp2ep4-flat", "--profile", "mi250x", "--remeasure"]) == 2  # nothing measured
    err = capsys.readouterr().err
    assert "--profile cost.profile: got 'mi250x'" in err and "cpu-2rank" in err
