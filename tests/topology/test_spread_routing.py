"""Mean-field dragonfly detours in the training simulator (topology parameter valiant: spread): each GPU pair's
Valiant share spread over every detour as sub-flows of weight 1/K (piper_sim.topology.spread). The engine's
weighted flows are held to the all-to-all study's own vectorized route table and runner (independent code that
routes the same mean field), and the topology's weighted paths to its byte shares."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from piper_sim.collectives.algorithms import ALL_TO_ALL
from piper_sim.config import load_config
from piper_sim.errors import ConfigError
from piper_sim.network import CollectiveRunner, FlowNetwork
from piper_sim.simulator import simulate
from piper_sim.studies.reduced_collective import prepare
from piper_sim.studies.reduced_collective import simulate as study_simulate
from piper_sim.studies.routes import RouteTable
from piper_sim.topology.load import load_topology

SPREAD = {"valiant": "spread", "routing": "adaptive", "adaptive_minimal_fraction": "auto"}
TOPOLOGIES = [
    {"preset": "frontier", "params": {"valiant": "spread"}},
    {"preset": "dragonfly", "params": {"num_groups": 3, **SPREAD}},
]


def engine_time(phases, topo) -> float:
    env = simpy.Environment()
    env.run(CollectiveRunner(env, FlowNetwork(env, topo.capacity_bytes_per_s), topo).run(phases, tuple(topo.gpus), 0))
    return env.now


@pytest.mark.parametrize("spec", TOPOLOGIES)
def test_weighted_paths_carry_the_byte_shares_of_paths(spec):
    topo = load_topology(spec, 48)
    rng = np.random.default_rng(0)
    pairs = [(int(a), int(b)) for a, b in rng.integers(0, topo.num_gpus, (200, 2)) if a != b]
    detours = 0
    for s, d in pairs:
        weighted = topo.weighted_paths(topo.gpus[s], topo.gpus[d])
        assert sum(f * w for f, w, _ in weighted) == pytest.approx(1.0, rel=1e-12)
        assert [(f * w, links) for f, w, links in weighted] == list(topo.paths(topo.gpus[s], topo.gpus[d]))
        detours += sum(w < 1 for _, w, _ in weighted)
    assert detours > 0  # the sample crosses switches, so the mean field shows


@pytest.mark.parametrize("spec", TOPOLOGIES)
def test_engine_weighted_paths_match_the_study_route_table(spec):
    topo = load_topology(spec, 48)
    src, dst = np.nonzero(~np.eye(topo.num_gpus, dtype=bool))
    sf = RouteTable(topo, topo.gpus, spread=True).sub_flows(src, dst)
    got: dict[int, list] = {}
    for k in range(sf.pair.size):
        links = tuple(sf.entry_link[sf.entry_flow == k].tolist())
        got.setdefault(int(sf.pair[k]), []).append(
            (round(float(sf.fraction[k]), 12), round(float(sf.weight[k]), 12), links)
        )
    for p in range(0, src.size, 7):
        expect = [
            (round(f, 12), round(w, 12), links)
            for f, w, links in topo.weighted_paths(topo.gpus[src[p]], topo.gpus[dst[p]])
        ]
        assert sorted(got[p]) == sorted(expect)


@pytest.mark.parametrize("spec", TOPOLOGIES)
@pytest.mark.parametrize("matrix", ["uniform", "uneven"])
def test_engine_all_to_all_with_spread_detours_equals_the_study(spec, matrix):
    topo = load_topology(spec, 48)
    n = topo.num_gpus
    m = (
        np.full((n, n), 2.0**20)
        if matrix == "uniform"
        else np.random.default_rng(0).exponential(1e6, (n, n)) * (np.random.default_rng(1).random((n, n)) < 0.5)
    )
    phases = ALL_TO_ALL.get("flat")(m, topo.gpus, topo)
    study = study_simulate(prepare(phases, topo.gpus, topo, spread=True, lump_flows=False), topo).time_s
    assert engine_time(phases, topo) == pytest.approx(study, rel=1e-9)


def test_spread_detours_load_every_detour_alike_and_count_each_flow_once():
    base = {
        "model": {"preset": "small-moe", "num_experts": 16},
        "collectives": {"all_to_all": "flat"},
        "parallel": {"pp": 1, "ep": 16, "dp": 2, "num_microbatches": 2},
    }
    runs = {
        v: simulate(load_config({**base, "topology": {"preset": "frontier", "params": {"valiant": v}}}))
        for v in ("hashed", "spread")
    }
    # the 4 nodes' NICs sit on switches 0-3 of group 0; a detour from switch a enters one of the 28 others
    into_idle = {}
    for valiant, run in runs.items():
        links = run.links.set_index("link")["bytes"]
        into_idle[valiant] = np.array([[links.get(f"g0.sw{a}->g0.sw{m}", 0.0) for m in range(4, 32)] for a in range(4)])
    spread, hashed = into_idle["spread"], into_idle["hashed"]
    assert spread.min() > 0
    np.testing.assert_allclose(spread, np.repeat(spread[:, :1], 28, axis=1), rtol=1e-9)  # alike per source
    assert (hashed.max(axis=1) > 2 * hashed.mean(axis=1)).all()  # each pair picks one detour, unevenly
    # every detour crosses two local links in both models, a minimal path one: the same local bytes in all
    local = {v: run.links.loc[run.links.link_kind == "local", "bytes"].sum() for v, run in runs.items()}
    assert local["spread"] == pytest.approx(local["hashed"], rel=1e-9)
    np.testing.assert_allclose(
        runs["spread"].links.set_index("link")["bytes"].filter(like="nic").sort_index(),
        runs["hashed"].links.set_index("link")["bytes"].filter(like="nic").sort_index(),
        rtol=1e-9,
    )  # the same bytes leave and enter every NIC
    # a flow is counted once however many detours carry it (weights sum to one Valiant flow per pair)
    assert runs["spread"].stats["num_flows"] == runs["hashed"].stats["num_flows"]


def test_an_unknown_valiant_mode_is_refused_by_name():
    with pytest.raises(ConfigError, match="valiant") as err:
        load_topology({"preset": "frontier", "params": {"valiant": "random"}}, 16)
    assert "hashed" in str(err.value) and "spread" in str(err.value)
