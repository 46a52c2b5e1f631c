"""A machine built for a job is not larger than the job needs by orders of magnitude: a size parameter that would
build far more links than the job's GPUs need (or more than this machine's memory holds) is refused before anything is
built, naming the parameter; a large machine is built once per command. The floor is monkeypatched small here."""

from __future__ import annotations

import pytest

from piper_sim.errors import ConfigError
from piper_sim.topology import load, size
from piper_sim.topology.load import load_topology


@pytest.fixture
def small_floor(monkeypatch):
    monkeypatch.setattr(size, "MACHINE_LINKS_FLOOR", 5_000)


@pytest.mark.parametrize(
    ("spec", "key"),
    [
        ({"preset": "uniform", "params": {"num_nodes": 128}}, "topology.params.num_nodes"),
        ({"preset": "uniform", "params": {"gpus_per_node": 1024}}, "topology.params.gpus_per_node"),
        ({"preset": "fat-tree", "params": {"num_spines": 4096}}, "topology.params.num_spines"),
        ({"preset": "dgx-h100-superpod", "params": {"gpus_per_node": 128}}, "topology.params.gpus_per_node"),
        ({"preset": "dragonfly", "params": {"switches_per_group": 128}}, "topology.params.switches_per_group"),
        ({"preset": "dragonfly", "params": {"gpus_per_node": 128}}, "topology.params.gpus_per_node"),
    ],
)
def test_a_machine_far_larger_than_an_8_gpu_job_names_its_parameter(small_floor, spec, key):
    with pytest.raises(ConfigError) as err:
        load_topology(spec, 8)
    assert err.value.key == key


def test_a_dgx_spine_layer_is_one_bundle_per_leaf_whatever_its_spines(small_floor):
    topo = load_topology({"preset": "dgx-h100-superpod", "params": {"num_spines": 512}}, 8)
    assert topo.graph.has_edge("su0.leaf0", "spines")  # build_dgx.RailFatTree: the spines cost no links


@pytest.mark.parametrize("preset", ["uniform", "fat-tree", "dgx-h100-superpod", "frontier", "dragonfly", "gb200-nvl72"])
def test_a_machine_of_just_the_job_is_built_whatever_its_size(small_floor, preset):
    topo = load_topology(preset, 512)  # past the floor: allowed by the job's GPUs
    assert topo.num_gpus >= 512


def test_the_estimate_counts_the_links_built(monkeypatch):
    seen = {}
    real = size.check_machine_size

    def spy(name, terms, num_gpus, values, where="topology.params."):
        seen[name] = sum(terms.values())
        real(name, terms, num_gpus, values, where)

    for module in ("builders", "build_dgx", "build_dragonfly"):
        monkeypatch.setattr(f"piper_sim.topology.{module}.check_machine_size", spy)
    for preset, name, gpus_per_node in (
        ("uniform", "uniform", 0),
        ("fat-tree", "fat-tree", 0),
        ("dgx-h100-superpod", "dgx-superpod", 8),
        ("dragonfly", "dragonfly", 4),
    ):
        topo = load_topology(preset, 256)
        # the node model's GPU-pair paths are counted with the links
        assert seen[name] - gpus_per_node**2 == pytest.approx(topo.graph.number_of_edges(), rel=0.05)


def test_a_machine_that_does_not_fit_in_memory_is_refused(monkeypatch):
    monkeypatch.setattr(size, "available_memory_bytes", lambda: size.MARGIN_BYTES + 1_000_000)
    with pytest.raises(ConfigError) as err:
        load_topology({"preset": "uniform", "params": {"num_nodes": 1024}}, 8)
    assert err.value.key == "topology.params.num_nodes"


def test_a_large_machine_is_built_once_for_the_same_request(monkeypatch):
    monkeypatch.setattr(load, "KEEP_LINKS", 100)
    monkeypatch.setattr(load, "_LAST", [])
    assert load_topology("uniform", 64) is load_topology("uniform", 64)
    assert load_topology("uniform", 128) is not load_topology("uniform", 64)
    monkeypatch.setattr(load, "KEEP_LINKS", 10**9)
    monkeypatch.setattr(load, "_LAST", [])
    assert load_topology("uniform", 64) is not load_topology("uniform", 64)
