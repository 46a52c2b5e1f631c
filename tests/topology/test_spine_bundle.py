"""A rail-optimized fat-tree's spine layer as one bundle per leaf: the same run as every spine with ECMP's split."""

from __future__ import annotations

import pytest

from piper_sim.config import load_config
from piper_sim.machine import build_machine, place_machine
from piper_sim.simulator import simulate
from piper_sim.topology.build_dgx import build_dgx_superpod
from piper_sim.topology.load import load_topology, read_topology_mapping

PARAMS = {"nodes_per_su": 2, "num_spines": 4, "uplinks_per_leaf": 2}  # 4 nodes in 2 SUs: traffic crosses spines
CASES = {
    "interleaved-tp-ep-nccl": {
        "parallel": {"pp": 2, "vpp": 2, "tp": 2, "sp": True, "ep": 8, "dp": 8, "num_microbatches": 4},
        "schedule": "interleaved-1f1b",
        "collectives": {"all_to_all": "nccl"},
    },
    "1f1b-ep-flat": {
        "parallel": {"pp": 2, "ep": 16, "dp": 16, "num_microbatches": 4},
        "collectives": {"all_to_all": "flat"},
    },
}


def per_spine_machine(cfg):
    """The config's machine with every spine and ECMP path kept (the builder's bundled_spines False)."""
    raw = read_topology_mapping(cfg.topology)
    topo = build_dgx_superpod(raw["params"], cfg.parallel.num_gpus, bundled_spines=False)
    topo.name, topo.collectives = raw["name"], {k: dict(v) for k, v in raw["collectives"].items()}
    return place_machine(topo, cfg.parallel.num_gpus, cfg.placement, cfg.cost_profile)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_bundled_spines_run_as_every_spine(case):
    cfg = load_config(
        {
            "model": {"preset": "qwen3-30b-a3b", "num_layers": 4, "seq_len": 1024},
            "topology": {"preset": "dgx-h100-superpod", "params": PARAMS},
            **CASES[case],
        }
    )
    bundled = simulate(cfg, machine=build_machine(cfg))
    each = simulate(cfg, machine=per_spine_machine(cfg))
    assert len(bundled.links) < len(each.links)  # the per-spine run loads every spine
    assert bundled.report.step_time_s == pytest.approx(each.report.step_time_s, rel=1e-12)
    assert bundled.report.exposed_comm_fraction == pytest.approx(each.report.exposed_comm_fraction, rel=1e-9)
    spine = {r.link: r.bytes for r in each.links.itertuples() if "spine" in r.link}
    assert spine, "no traffic crossed a spine"
    for r in bundled.links.itertuples():
        if "spines" in r.link:  # a leaf's bundle: the bytes of its links to every spine, at their utilization
            leaf, up = (r.link.split("->")[0], True) if r.link.endswith("spines") else (r.link.split("->")[1], False)
            members = [b for name, b in spine.items() if (name.startswith(leaf + "->") if up else name.endswith(leaf))]
            assert len(members) == PARAMS["num_spines"]
            assert r.bytes == pytest.approx(sum(members), rel=1e-9)
        else:
            assert r.bytes == pytest.approx(each.links.set_index("link").loc[r.link, "bytes"], rel=1e-9)


def test_a_bundle_has_every_uplinks_capacity():
    g = load_topology({"preset": "dgx-h100-superpod", "params": PARAMS}, 32).graph
    assert g.edges["su0.leaf3", "spines"]["bandwidth_bytes_per_s"] == 2 * 50e9  # 2 uplinks of 50 GB/s
    assert not any(n.startswith("spine") and n != "spines" for n in g.nodes)
