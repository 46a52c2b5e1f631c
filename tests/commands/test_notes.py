"""The defaults a command chose without being told are said (piper_sim.notes), and only those."""

from __future__ import annotations

from piper_sim.cli import main
from piper_sim.config import load_config
from piper_sim.notes import config_notes, placement_notes
from piper_sim.topology.load import load_topology
from piper_sim.topology.placement import place

BARE = {"model": "tiny-moe", "parallel": {"pp": 2, "ep": 2}}
EXPLICIT = {
    **BARE,
    "model": {"preset": "tiny-moe", "seq_len": 64},
    "cost": "mi250x",
    "topology": "uniform",
    "routing": {"kind": "uniform"},
}


def test_each_left_out_key_is_said_once_and_given_ones_are_not():
    notes = config_notes(load_config(BARE))
    assert [n.split(" ", 1)[0] for n in notes] == ["tiny-moe", "cost.profile", "topology", "routing"]
    assert "64 tokens" in notes[0] and "not given: mi250x" in notes[1] and "not given: kind uniform" in notes[3]
    assert config_notes(load_config(EXPLICIT)) == []  # cost: NAME stands for cost.profile
    assert config_notes(load_config(BARE, ["model.seq_len=64", "cost.profile=h100"]), ("seq_len", "cost.profile")) == []


def test_placement_is_said_only_where_the_default_chose_among_nodes():
    def notes(raw, topology_params):
        cfg = load_config({**raw, "topology": {"preset": "uniform", "params": topology_params}})
        topo = load_topology(cfg.topology, cfg.parallel.num_gpus)
        return placement_notes(cfg, topo, place(topo, cfg.parallel.num_gpus, cfg.placement))

    two_nodes = {**BARE, "parallel": {"pp": 2, "ep": 8}}  # 16 GPUs on 8-GPU nodes
    assert "machine's first 2 nodes" in notes(two_nodes, {"num_nodes": 4})[0]
    assert notes({**two_nodes, "placement": "contiguous"}, {"num_nodes": 4}) == []
    assert notes(two_nodes, {}) == []  # a machine of just the job's nodes: nothing was chosen
    assert notes(BARE, {"num_nodes": 4}) == []  # 4 GPUs inside one node
    inside = notes({**BARE, "placement": "scattered"}, {"num_nodes": 4})  # given, but inside one node
    assert len(inside) == 1 and "'scattered' cannot change the result" in inside[0]


def test_a_fat_tree_sized_by_the_job_says_so():
    assert "only the job's 2 node(s) exist" in load_topology("fat-tree", 16).notes[0]
    assert load_topology({"preset": "fat-tree", "params": {"num_nodes": 8}}, 16).notes == []


def test_simulate_prints_the_notes(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text(
        "model: tiny-moe\nparallel: {pp: 2, ep: 8, num_microbatches: 2}\n"
        "topology: {preset: fat-tree, params: {num_nodes: 4}}\n"
    )
    assert main(["simulate", str(config), "--out", str(tmp_path / "o")]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("piper-sim: note: ")]
    assert [n.split()[2] for n in notes] == ["tiny-moe", "cost.profile", "routing", "placement"], notes
