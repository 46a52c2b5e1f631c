"""The `deepep` all-to-all: DeepEP's routing of tokens (RDMA once per node on the sender's rail, NVLink forwarding),
its deduplication of a token's copies, and its parameters held to DeepEP's published H800 table."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from piper_sim.collectives.algorithms import ALL_TO_ALL, Fanout, bind_fanout, data_phases, split_phases
from piper_sim.collectives.deepep import adjacent_hits, hit_probability
from piper_sim.errors import ConfigError
from piper_sim.studies.all_to_all import StudySpec, run_study
from piper_sim.studies.reduced_collective import run_collective
from piper_sim.topology.load import load_topology, read_topology_mapping

ROOT = Path(__file__).resolve().parents[2]
DATA = yaml.safe_load((ROOT / "traces" / "collectives" / "deepep-h800.yaml").read_text())
PARAMS = {"nvl_efficiency": 0.5, "rdma_efficiency": 0.8}


def uniform(num_gpus: int, params: dict | None = None):
    return load_topology(
        {
            "builder": "uniform",
            "params": {
                "gpus_per_node": 4,
                "intra_bandwidth_GBps": 100,
                "nic_bandwidth_GBps": 10,
                "message_overhead_us": 2.0,
            },
            "collectives": {"deepep": params or PARAMS},
        },
        num_gpus,
    )


# ---- the published table ------------------------------------------------------------------------
TOKENS, TOP_K, EXPERTS, HIDDEN = 4096, 8, 256, 7168
TOKEN_BYTES = {"dispatch": HIDDEN + HIDDEN // 128 * 4, "combine": HIDDEN * 2}  # FP8 with its scales; BF16


def test_parameters_are_the_derivations_from_the_table():
    """nvl_efficiency: the intranode row's NVLink share (7/8 of the logical bytes cross NVLink) over H800's 200 GB/s;
    rdma_efficiency: the EP 32 and 64 rows' NIC share ((H-1)/H of the logical bytes) over 50 GB/s."""
    points = {p["ep"]: p for p in DATA["table"]["points"]}
    line = DATA["h800_machine"]["nvlink_bandwidth_GBps"]["value"]
    nic = DATA["h800_machine"]["nic_bandwidth_GBps"]["value"]
    nvl = np.mean([points[8][k] * 7 / 8 for k in ("dispatch_GBps", "combine_GBps")]) / line
    rdma = (
        np.mean(
            [
                points[ep][k] * (nodes - 1) / nodes
                for ep, nodes in ((32, 4), (64, 8))
                for k in ("dispatch_GBps", "combine_GBps")
            ]
        )
        / nic
    )
    params = read_topology_mapping("dgx-h100-superpod")["collectives"]["deepep"]
    assert DATA["parameters"]["nvl_efficiency"]["value"] == params["nvl_efficiency"] == pytest.approx(nvl, abs=5e-4)
    assert DATA["parameters"]["rdma_efficiency"]["value"] == params["rdma_efficiency"] == pytest.approx(rdma, abs=5e-4)


def table_bandwidths() -> dict[tuple[int, str], float]:
    """The study's logical bandwidth (GB/s) per (EP, role) in DeepEP's convention: tokens x distinct nodes (one node:
    distinct GPUs) they reach, own included, x bytes per token / the data phases' time."""
    line = DATA["h800_machine"]["nvlink_bandwidth_GBps"]["value"]
    sizes = {role: f"{TOKENS * TOP_K * b}B" for role, b in TOKEN_BYTES.items()}
    spec = StudySpec(
        topology="dgx-h100-superpod",
        nodes=(1, 2, 4, 8),
        sizes=tuple(sizes.values()),
        algorithms=("deepep",),
        topology_params={"nvlink_bandwidth_GBps": line},
        fanout=(TOP_K, EXPERTS),
    )
    out = {}
    for row, _ in run_study(spec, log=lambda s: None):
        role = next(r for r, s in sizes.items() if s == row["size"])
        reach = 8 if row["nodes"] == 1 else row["nodes"]  # the GPUs of one node, else the nodes
        logical = TOKENS * reach * hit_probability(1 / reach, TOP_K, EXPERTS) * TOKEN_BYTES[role]
        out[(8 * row["nodes"], role)] = logical / (row["time_s"] - row["split_exchange_s"]) / 1e9
    return out


def test_the_study_of_the_tables_configuration_gives_the_tables_bandwidths():
    """Every entry of DeepEP's 'normal kernels' table within the stated tolerance, through the all-to-all study (the
    H800 machine: DGX H100 with its 200 GB/s NVLink); the held-out EP 16 pair included."""
    tolerance = DATA["held_to_table"]["tolerance"]
    model = table_bandwidths()
    for point in DATA["table"]["points"]:
        for role in ("dispatch", "combine"):
            measured = point[f"{role}_GBps"]
            assert model[(point["ep"], role)] == pytest.approx(measured, rel=tolerance), (point, role)
    assert model[(32, "dispatch")] == pytest.approx(58, rel=0.03)  # a fitted row stays close
    assert model[(16, "dispatch")] == pytest.approx(47.5, rel=0.01)  # the held-out row: as stated in the data file


# ---- deduplication -------------------------------------------------------------------------------
@pytest.mark.parametrize(("holders", "experts", "top_k"), [(32, 128, 8), (4, 128, 8), (8, 256, 8), (16, 64, 6)])
def test_hit_probability_is_sampled_uniform_routings(holders, experts, top_k):
    """Tokens choosing top_k distinct experts uniformly among experts spread evenly over holders: the share of tokens
    that reach a holder is the hypergeometric hit probability (20,000 sampled tokens, 4 standard errors)."""
    rng = np.random.default_rng(0)
    choice = np.argsort(rng.random((20_000, experts)), axis=1)[:, :top_k] // (experts // holders)
    reached = np.mean([np.unique(row).size for row in choice]) / holders
    p = hit_probability(1 / holders, top_k, experts)
    assert reached == pytest.approx(p, abs=4 * np.sqrt(p * (1 - p) / 20_000 / holders))


def test_fanout_sends_each_token_once_per_node_and_gpu():
    """16 GPUs on 4 nodes, uniform routing of top-8 among 64 experts: the RDMA phase carries each source's tokens
    once per other node, the forward phase once per GPU (each byte over its efficiency); no fanout: the copies."""
    topo = uniform(16)
    m = np.full((16, 16), 8.0 * 1000 / 16)  # 1000 tokens a source, 8 copies each, spread evenly
    for fanout, per_node, per_gpu in (
        (None, 4 * 8000 / 16, 8000 / 16),
        (Fanout(8, 64), 1000 * hit_probability(1 / 4, 8, 64), 1000 * hit_probability(1 / 16, 8, 64)),
    ):
        rdma, forward = data_phases(bind_fanout(ALL_TO_ALL.get("deepep"), fanout), m, topo.gpus, topo)
        assert (rdma.name, forward.name) == ("rdma", "forward") and rdma.after == forward.after == ()
        assert rdma.sizes.sum() == pytest.approx(16 * 3 * per_node / 0.8)
        assert forward.sizes.sum() == pytest.approx(16 * 12 * per_gpu / 0.5)  # 12 of 16 sources relay via another GPU
        assert rdma.overhead_s == forward.overhead_s == 0.0


def _round_robin_reach(tokens: int, top_k: int, experts: int, host: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Token by token, as a round-robin gate routes a micro-batch: token t's experts are (t top_k + j) mod E; the
    share of tokens reaching each member (experts placed contiguously) and each node."""
    members, nodes = host.size, int(host.max()) + 1
    owner = np.arange(experts) // (experts // members)
    reach_member, reach_node = np.zeros(members), np.zeros(nodes)
    for t in range(tokens):
        held = owner[(t * top_k + np.arange(top_k)) % experts]
        reach_member[np.unique(held)] += 1
        reach_node[np.unique(host[held])] += 1
    return reach_member / tokens, reach_node / tokens


@pytest.mark.parametrize(
    ("top_k", "experts", "members", "per_node"),
    [(8, 256, 64, 8), (8, 384, 32, 8), (8, 128, 8, 8), (6, 64, 16, 4), (3, 40, 8, 2)],
)
def test_adjacent_experts_reach_what_a_round_robin_gate_reaches(top_k, experts, members, per_node):
    """A micro-batch of 4,096 tokens routed token by token: each member and node is reached by the share of tokens
    adjacent_hits counts (DeepSeek-V3 at EP 64: 2 GPUs of one node; Kimi K2 at EP 32: 4/3 GPUs; blocks that straddle
    members and nodes when top_k does not divide their experts)."""
    host = np.arange(members) // per_node
    member, node = adjacent_hits(top_k, experts, host)
    cycle = experts // np.gcd(top_k, experts)
    want_member, want_node = _round_robin_reach(cycle * (4096 // cycle), top_k, experts, host)
    np.testing.assert_allclose(member, want_member, rtol=1e-12)
    np.testing.assert_allclose(node, want_node, rtol=1e-12)
    if (top_k, experts, members) == (8, 256, 64):
        assert member.sum() == pytest.approx(2.0) and node.sum() == pytest.approx(1.0)


def test_adjacent_fanout_sends_each_token_to_the_gpus_and_nodes_it_reaches():
    """16 GPUs on 4 nodes, top-8 of 64 experts (4 a GPU) by a round-robin gate: each token reaches 2 GPUs of one
    node; the RDMA phase carries a source's tokens to the 3 other nodes a quarter of them each, the forward phase
    every GPU an eighth of them."""
    topo = uniform(16)
    m = np.full((16, 16), 8.0 * 1000 / 16)
    rdma, forward = data_phases(bind_fanout(ALL_TO_ALL.get("deepep"), Fanout(8, 64, adjacent=True)), m, topo.gpus, topo)
    assert rdma.sizes.sum() * 0.8 == pytest.approx(16 * 3 * 1000 / 4)
    assert forward.sizes.sum() * 0.5 == pytest.approx(16 * 12 * 1000 / 8)
    combine = data_phases(
        bind_fanout(ALL_TO_ALL.get("deepep"), Fanout(8, 64, combine=True, adjacent=True)), m.T.copy(), topo.gpus, topo
    )
    for d, c in zip((rdma, forward), combine, strict=True):
        np.testing.assert_array_equal(d.src, c.dst)
        np.testing.assert_allclose(d.sizes, c.sizes)


def test_adjacent_experts_need_ep_to_divide_the_experts():
    with pytest.raises(ConfigError, match="parallel.ep"):
        adjacent_hits(8, 100, np.zeros(8, dtype=int))


def test_rdma_goes_to_the_senders_rail_and_nvlink_stays_in_the_node():
    topo = uniform(16)
    rng = np.random.default_rng(1)
    m = rng.random((16, 16)) * 1e6
    rdma, forward = data_phases(ALL_TO_ALL.get("deepep"), m, topo.gpus, topo)
    host = np.arange(16) // 4
    assert np.all(host[rdma.src] != host[rdma.dst]) and np.all(rdma.src % 4 == rdma.dst % 4)
    assert np.all(host[forward.src] == host[forward.dst])
    # every byte reaches its node once over RDMA (rows' off-node sums) and its GPU once over NVLink unless its relay
    off_node = np.where(host[:, None] != host[None, :], m, 0.0).sum()
    assert rdma.sizes.sum() * 0.8 == pytest.approx(off_node)
    via_relay = np.where(np.arange(16)[:, None] % 4 != np.arange(16)[None, :] % 4, m, 0.0).sum()
    assert forward.sizes.sum() * 0.5 == pytest.approx(via_relay)


def test_combine_runs_the_dispatch_backwards():
    topo = uniform(16)
    m = np.random.default_rng(2).random((16, 16)) * 1e6
    dispatch = data_phases(bind_fanout(ALL_TO_ALL.get("deepep"), Fanout(8, 64)), m, topo.gpus, topo)
    combine = data_phases(
        bind_fanout(ALL_TO_ALL.get("deepep"), Fanout(8, 64, combine=True)), m.T.copy(), topo.gpus, topo
    )
    for d, c in zip(dispatch, combine, strict=True):
        np.testing.assert_array_equal(d.src, c.dst)
        np.testing.assert_array_equal(d.dst, c.src)
        np.testing.assert_allclose(d.sizes, c.sizes)


def test_one_node_is_one_nvlink_phase():
    topo = uniform(4)
    m = np.full((4, 4), 1e6)
    (phase,) = data_phases(ALL_TO_ALL.get("deepep"), m, topo.gpus, topo)
    assert phase.name == "nvl" and phase.src.size == 12
    np.testing.assert_allclose(phase.sizes, 1e6 / 0.5)


def test_deepep_on_dgx_h100_uses_fewer_nic_bytes_than_flat():
    """Qwen3-235B's EP 32 layer (128 experts, top-8) on 4 DGX H100 nodes: the NICs carry each token once per other
    node it reaches (3.61 x 3/4 copies, over 0.873) in place of flat's 8 x 3/4."""
    topo = load_topology("dgx-h100-superpod", 32)
    gpus = topo.gpus[:32]
    m = np.full((32, 32), 4096 * 8 * 8192 / 32)
    runs = {}
    for name in ("flat", "deepep"):
        algorithm = bind_fanout(ALL_TO_ALL.get(name), Fanout(8, 128))
        runs[name] = run_collective(split_phases(algorithm(m, gpus, topo))[1], gpus, topo)[1]
    nic = np.array([kind == "nic" for kind in topo.link_kinds])
    ratio = runs["deepep"].link_bytes[nic].sum() / runs["flat"].link_bytes[nic].sum()
    expected = 4 * hit_probability(1 / 4, 8, 128) * 3 / 4 / 0.873 / (8 * 3 / 4)
    assert ratio == pytest.approx(expected, rel=1e-6)
    assert runs["deepep"].time_s < runs["flat"].time_s


def test_missing_or_bad_parameters_name_the_key():
    topo = load_topology("uniform", 8)
    with pytest.raises(ConfigError, match="topology.collectives.deepep.nvl_efficiency"):
        ALL_TO_ALL.get("deepep")(np.ones((8, 8)), topo.gpus, topo)
    topo = uniform(8, {**PARAMS, "rdma_efficiency": 1.5})
    with pytest.raises(ConfigError, match="rdma_efficiency"):
        ALL_TO_ALL.get("deepep")(np.ones((8, 8)), topo.gpus, topo)


# ---- where it is used ----------------------------------------------------------------------------
def test_published_runs_that_ran_deepep_price_it():
    """Every published run whose source names DeepEP is priced with deepep, and says so in its notes."""
    found = 0
    for path in sorted((ROOT / "validation" / "published").glob("*.yaml")):
        run = yaml.safe_load(path.read_text())
        if "deepep" in yaml.safe_dump(run["source"]).lower():
            found += 1
            assert run["config"]["collectives"]["all_to_all"] == "deepep", path.name
            assert any("all_to_all deepep" in note for note in run["notes"]), path.name
    assert found == 8


def test_plan_fix_deepep_needs_the_machines_parameters():
    from piper_sim.planning.cli import check_libraries
    from piper_sim.planning.planner import PlanRequest

    request = PlanRequest(model="qwen3-30b-a3b", num_gpus=16, global_batch=64, fixed={"all_to_all": ("deepep",)})
    check_libraries(request, load_topology("dgx-h100-superpod", 16))  # DGX H100 has them
    with pytest.raises(ConfigError, match="--fix collectives.all_to_all"):
        check_libraries(request, load_topology("frontier", 16))


def _round_robin_config(kind: str):
    from piper_sim.config import load_config

    return load_config(
        {
            "model": {"preset": "small-moe", "num_experts": 64, "top_k": 8, "d_model": 1024, "seq_len": 1024},
            "parallel": {"pp": 1, "ep": 16, "dp": 16, "tp": 1, "num_microbatches": 2, "micro_batch_size": 2},
            "schedule": "1f1b",
            "topology": "dgx-h100-superpod",
            "collectives": {"all_to_all": "deepep", "all_reduce": "ring"},
            "routing": {"kind": kind},
            "cost": {"profile": "h100"},
        }
    )


def test_both_tiers_send_a_round_robin_gates_tokens_to_fewer_nodes():
    """EP 16 over two DGX H100 nodes: a round-robin gate's token reaches one node (the other half the time), a random
    top-8 of 64 both nearly always; the simulator and the estimator bind the adjacent fanout alike."""
    from piper_sim.planning.estimate import estimate_config
    from piper_sim.simulator import simulate

    steps = {}
    for kind in ("uniform", "round_robin"):
        cfg = _round_robin_config(kind)
        steps[kind] = (simulate(cfg).report.step_time_s, estimate_config(cfg)[0].step_time_s)
        assert steps[kind][0] == pytest.approx(steps[kind][1], rel=1e-4)
    assert steps["round_robin"][0] < 0.95 * steps["uniform"][0]
