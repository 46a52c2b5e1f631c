"""The current machines: H200 (DGX H200), B200 (DGX B200), GB200 NVL72 and MI300X profiles and topologies.

Each profile's numbers are the ones its sources file cites (traces/profiles/sources/NAME.yaml); the vendor figures,
roofline bounds and link rates are restated here from the datasheets, not imported from the files. Each topology
builds with its GPU count, link rates and routes, names its own profile, and a simulation on it is priced with it.
"""

from __future__ import annotations

import pytest
import yaml

from piper_sim.config import load_config
from piper_sim.errors import ConfigError
from piper_sim.paths import data_dir
from piper_sim.simulator import simulate
from piper_sim.topology.graph import Topology
from piper_sim.topology.load import load_topology, topology_device_profile
from piper_sim.workload.flops import Gemm
from piper_sim.workload.profile_load import load_profile
from piper_sim.workload.roofline import gemm_time_s

GB = 1e9
# name: (dense bf16 TFLOPS, HBM GB/s, HBM GiB as the driver reports it): vendor datasheets, nvidia-smi / rocm-smi
DEVICES = {
    "h200": (989, 4800, 143771 / 1024),
    "b200": (2250, 8000, 183359 / 1024),
    "gb200": (2500, 8000, 189471 / 1024),
    "mi300x": (1307.4, 5300, 205822885888 / 2**30),
}
# topology: (profile, GPUs per node, intra-node GB/s per direction (to the switch, or per GPU pair on a mesh))
MACHINES = {
    "dgx-h200-superpod": ("h200", 8, 450),
    "dgx-b200-superpod": ("b200", 8, 900),
    "gb200-nvl72": ("gb200", 72, 900),
    "mi300x-cluster": ("mi300x", 8, 64),
}


def _sources(name: str) -> dict:
    return yaml.safe_load((data_dir("traces/profiles") / "sources" / f"{name}.yaml").read_text())


@pytest.mark.parametrize("name", sorted(DEVICES))
def test_each_profile_carries_its_cited_vendor_numbers(name):
    peak_tflops, hbm_gbps, hbm_gib = DEVICES[name]
    p, cited = load_profile(name), _sources(name)
    assert p.peak_flops_per_s == pytest.approx(peak_tflops * 1e12, rel=1e-12)
    assert p.hbm_bytes_per_s == pytest.approx(hbm_gbps * GB, rel=1e-12)
    assert p.hbm_bytes / 2**30 == pytest.approx(hbm_gib, abs=0.005)
    for key, value in (("peak_bf16_TFLOPS", peak_tflops), ("hbm_bandwidth_GBps", hbm_gbps), ("hbm_GiB", hbm_gib)):
        entry = cited[key]
        assert entry["value"] == pytest.approx(value, abs=0.005) and entry["status"] == "measured" and entry["source"]


@pytest.mark.parametrize("name", sorted(DEVICES))
def test_small_rows_are_the_hbm_roofline_and_attention_points_are_listed(name):
    """Rows 1-64 are rows x bandwidth x 0.8 / peak (the derivation the sources file states); every attention point
    is in the sources file with its value and status (assumed where no measurement was found)."""
    peak_tflops, hbm_gbps, _ = DEVICES[name]
    p, cited = load_profile(name), _sources(name)
    curve = dict(zip(p.gemm_efficiency.x, p.gemm_efficiency.efficiency, strict=True))
    for rows in (1, 16, 64):
        assert curve[rows] == pytest.approx(rows * hbm_gbps * 0.8 / (peak_tflops * 1e3), rel=2e-3)
    listed = {pt["seq_len"]: pt for pt in cited["attention_efficiency"]["points"]}
    for seq, eff in zip(p.attention_efficiency.x, p.attention_efficiency.efficiency, strict=True):
        assert listed[seq]["value"] == pytest.approx(eff, abs=5e-4)
        assert listed[seq]["status"] in ("measured", "derived", "assumed")


@pytest.mark.parametrize(
    ("name", "table"), [("b200", "b200"), ("mi300x", "mi300x"), ("h200", "h100"), ("gb200", "b200")]
)
def test_shape_factor_is_the_cited_table(name, table):
    """b200 and mi300x carry the factors their sources list; h200 and gb200 take those of the same compute die."""
    factor = load_profile(name).gemm_shape_factor
    if table == name:
        points = _sources(name)["gemm_shape_factor"]["points"]
        assert factor.rows == tuple(float(pt["rows"]) for pt in points)
        assert factor.factor == tuple(tuple(pt["factor"]) for pt in points)
    else:
        assert factor == load_profile(table).gemm_shape_factor


def test_h200_computes_as_an_h100_and_gb200_as_a_b200():
    """Same die and clock: the H200's compute-bound points are the H100's; the GB200 takes the B200's FLOP/s at
    its own peak (rows 256 and beyond)."""
    h100, h200 = load_profile("h100").gemm_efficiency, load_profile("h200").gemm_efficiency
    assert h200.x == h100.x and h200.efficiency[3:] == h100.efficiency[3:]
    assert load_profile("h200").attention_efficiency == load_profile("h100").attention_efficiency
    b200, gb200 = load_profile("b200").gemm_efficiency, load_profile("gb200").gemm_efficiency
    assert gb200.x == b200.x
    for b, g in zip(b200.efficiency[3:], gb200.efficiency[3:], strict=True):
        assert g * 2500 == pytest.approx(b * 2250, abs=0.5)  # TFLOP/s, to the files' rounding


@pytest.mark.parametrize(
    ("name", "mnk", "priced_tflops", "mamf_tflops"),
    [
        ("h200", (2048, 2048, 13312), 794.2, 794.5),  # the H100 row, "H200 is the same"
        ("mi300x", (10240, 15360, 8192), 668.3, 668.4),
        ("b200", (1792, 16128, 3072), 1317.8, 1745.0),  # wide GEMMs at the width-4096 rate (sources/b200.yaml caveat)
        ("gb200", (4096, 9728, 2048), 1416.8, 1822.0),
    ],
)
def test_mamf_best_shapes_are_priced_as_the_sources_say(name, mnk, priced_tflops, mamf_tflops):
    """The profile's rate at Bekman's best shape: MAMF's measurement where the curve holds it (H200, MI300X); on
    Blackwell the price the sources' caveat states, below MAMF's measurement."""
    m, n, k = mnk
    gemm = Gemm(m, k, n)
    tflops = gemm.flops / gemm_time_s(load_profile(name), gemm, 2) / 1e12
    assert tflops == pytest.approx(priced_tflops, abs=0.1)
    assert tflops <= mamf_tflops


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_each_topology_names_its_profile_and_builds_its_gpus(name):
    profile, per_node, intra_gbps = MACHINES[name]
    assert topology_device_profile(name) == (name, profile)
    assert load_profile(profile).name == profile
    topo = load_topology(name, 2 * per_node)
    g = topo.graph
    assert topo.num_gpus == 2 * per_node and len({topo.host_of(x) for x in topo.gpus}) == 2
    nics = [n for n, d in g.nodes(data=True) if d["kind"] == "nic"]
    assert len(nics) == 2 * per_node  # one NIC per GPU
    assert {g.edges[x, f"su0.leaf{g.nodes[x]['local_index']}"]["bandwidth_bytes_per_s"] for x in nics} == {50 * GB}
    assert {d["bandwidth_bytes_per_s"] for _, _, d in g.edges(data=True) if d["link_kind"] == "gpu_nic"} == {64 * GB}
    kind = "xgmi" if name == "mi300x-cluster" else "nvlink"
    assert {d["bandwidth_bytes_per_s"] for _, _, d in g.edges(data=True) if d["link_kind"] == kind} == {intra_gbps * GB}


def test_gb200_rack_is_one_nvlink_domain_of_72_gpus():
    topo = load_topology("gb200-nvl72", 144)
    g = topo.graph
    assert [topo.host_of(f"n1.g{i}") for i in (0, 71)] == [1, 1]
    for dst in ("n0.g1", "n0.g40", "n0.g71"):  # every GPU of the rack: over the NVLink switch, one path
        ((frac, links),) = topo.paths("n0.g0", dst)
        assert frac == 1.0 and [topo.link_kinds[x] for x in links] == ["nvlink", "nvlink"]
        assert _bottleneck(topo, links) == 900 * GB
    ((frac, links),) = topo.paths("n0.g5", "n1.g5")  # same index, next rack: the NICs and one leaf
    assert [topo.link_kinds[x] for x in links] == ["gpu_nic", "nic", "nic", "gpu_nic"]
    assert _bottleneck(topo, links) == 50 * GB
    ((frac, links),) = topo.paths("n0.g5", "n1.g6")  # another index: ECMP over the 8 spines (50 GB/s each), a bundle
    assert frac == 1.0 and g.edges["su0.leaf5", "spines"]["bandwidth_bytes_per_s"] == 8 * 50 * GB


def test_mi300x_node_is_a_full_mesh_of_xgmi_links():
    topo = load_topology("mi300x-cluster", 16)
    g = topo.graph
    xgmi = [(a, b) for a, b, d in g.edges(data=True) if d["link_kind"] == "xgmi" and a.startswith("n0.")]
    assert len(xgmi) == 8 * 7  # 7 links per GPU, each direction a link of its own
    assert not any(d["kind"] == "switch" and d.get("host") == 0 for _, d in g.nodes(data=True))
    for i in range(8):
        for j in range(8):
            if i != j:
                ((frac, links),) = topo.paths(f"n0.g{i}", f"n0.g{j}")
                assert [topo.link_kinds[x] for x in links] == ["xgmi"] and _bottleneck(topo, links) == 64 * GB
    ((frac, links),) = topo.paths("n0.g2", "n1.g2")  # rail 2: its own NICs and leaf
    assert [topo.link_kinds[x] for x in links] == ["gpu_nic", "nic", "nic", "gpu_nic"]
    pxn = load_topology({"preset": "mi300x-cluster", "params": {"cross_rail": "pxn"}}, 16)
    ((frac, links),) = pxn.paths("n0.g2", "n1.g6")  # PXN: over xGMI to GPU 6, then rail 6
    assert [pxn.link_kinds[x] for x in links] == ["xgmi", "gpu_nic", "nic", "nic", "gpu_nic"]


def test_a_bad_node_fabric_names_the_field():
    with pytest.raises(ConfigError) as err:
        load_topology({"preset": "mi300x-cluster", "params": {"node_fabric": "torus"}}, 8)
    assert (err.value.key, err.value.value) == ("topology.params.node_fabric", "torus")
    assert "mesh" in err.value.allowed and "nvswitch" in err.value.allowed


def test_presets_lists_the_current_machines(capsys):
    from piper_sim.cli import main

    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    topologies = next(line for line in out.splitlines() if line.startswith("topologies:"))
    profiles = next(line for line in out.splitlines() if line.startswith("cost profiles:"))
    assert all(name in topologies for name in MACHINES)
    assert all(name in profiles for name in DEVICES)


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_a_small_moe_on_each_machine_is_priced_with_its_profile(name):
    profile = load_profile(MACHINES[name][0])
    result = simulate(
        load_config({"model": "small-moe", "parallel": {"pp": 2, "ep": 4, "num_microbatches": 4}, "topology": name})
    )
    report = result.report
    assert report.step_time_s > 0 and report.hbm_bytes == profile.hbm_bytes
    peak = report.model_flops_per_step / (report.step_time_s * 8 * report.mfu)
    assert peak == pytest.approx(profile.peak_flops_per_s, rel=1e-9)


def _bottleneck(topo: Topology, links: tuple[int, ...]) -> float:
    return float(min(topo.capacity_bytes_per_s[x] for x in links))
