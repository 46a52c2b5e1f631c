"""`study collective`: every collective's time against its closed form on a switch, nccl-tests' bandwidths and sizes,
the broadcast algorithms, the command line (table, resume, refusals)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import yaml

from piper_sim.cli import main
from piper_sim.collectives.algorithms import BROADCAST
from piper_sim.collectives.vendor import ring_orders, vendor_params
from piper_sim.studies.all_to_all import StudySpec, run_study
from piper_sim.studies.collective import CollectiveSpec, run_collective_study
from piper_sim.studies.reduced_collective import run_collective
from piper_sim.topology.load import load_topology

B = 100e9  # each GPU's link to the node switch, bytes/s
ONE_NODE = {
    "builder": "uniform",
    "params": {
        "gpus_per_node": 8,
        "intra_bandwidth_GBps": B / 1e9,
        "nic_bandwidth_GBps": 25,
        "message_overhead_us": 2.0,
    },
}
S = 2.0**26


def row_of(collective: str, algorithm: str, gpus: int = 8, size: float = S, topology: object = ONE_NODE) -> dict:
    spec = CollectiveSpec(
        topology=topology, collective=collective, gpus=(gpus,), sizes=(f"{int(size)}B",), algorithms=(algorithm,)
    )
    ((row, _),) = list(run_collective_study(spec, log=lambda s: None))
    return row


# (collective, algorithm, messages each GPU posts in turn, peers it posts to at once, bytes on its link / S, factor)
CLOSED_FORMS = [
    ("all_reduce", "ring", 14, 1, 2 * 7 / 8, 2 * 7 / 8),
    ("all_gather", "ring", 7, 1, 7 / 8, 7 / 8),
    ("reduce_scatter", "ring", 7, 1, 7 / 8, 7 / 8),
    ("all_to_all", "flat", 1, 7, 7 / 8, 7 / 8),
    ("broadcast", "ring", 7, 1, 1.0, 1.0),
]


@pytest.mark.parametrize(("collective", "algorithm", "steps", "peers", "volume", "factor"), CLOSED_FORMS)
def test_each_collective_takes_its_closed_form_and_its_busbw_reaches_the_link_rate(
    collective, algorithm, steps, peers, volume, factor
):
    """8 GPUs on one switch, links of B: time = steps x (overhead x peers + latency) + volume x S / B, with S
    nccl-tests' size of the op, and busbw = S / time x nccl-tests' factor, which is B once the bytes dominate."""
    topo = load_topology(ONE_NODE, 8)
    latency = topo.path_latency_s(topo.route(topo.gpus[0], topo.gpus[1]))
    row = row_of(collective, algorithm)
    expected = steps * (2e-6 * peers + latency) + volume * S / B
    assert row["time_s"] == pytest.approx(expected, rel=1e-9)
    assert row["algbw_bytes_per_s"] == pytest.approx(S / expected, rel=1e-9)
    assert row["busbw_bytes_per_s"] == pytest.approx(S / expected * factor, rel=1e-9)
    big = row_of(collective, algorithm, size=2.0**40)
    assert big["busbw_bytes_per_s"] == pytest.approx(B, rel=1e-3)


def test_the_all_to_all_is_timed_without_the_split_size_exchange():
    """nccl-tests' alltoall moves fixed-size blocks: the collective study's time is the all-to-all study's less the
    split-size exchange that study adds for uneven MoE all-to-alls, for the same per-GPU buffer."""
    topo = {"builder": "uniform", "params": {**ONE_NODE["params"], "gpus_per_node": 4}}
    spec = StudySpec(topology=topo, nodes=(2,), sizes=(f"{int(S)}B",), algorithms=("flat",))
    ((study, _),) = list(run_study(spec, log=lambda s: None))
    row = row_of("all_to_all", "flat", gpus=8, topology=topo)
    assert study["split_exchange_s"] > 0
    assert row["time_s"] == pytest.approx(study["time_s"] - study["split_exchange_s"], rel=1e-9)


def test_the_ring_broadcast_is_a_chain_from_the_root():
    topo = load_topology(ONE_NODE, 8)
    (phase,) = BROADCAST.get("ring")(S, topo.gpus[:5], topo)
    assert phase.src.tolist() == [0, 1, 2, 3] and phase.dst.tolist() == [1, 2, 3, 4]
    assert phase.sizes.tolist() == [S] * 4 and phase.messages == 4


def test_rccl_broadcast_runs_chains_along_its_rings_on_their_own_links():
    """One Frontier node: RCCL's four rings as chains from GCD 0, each carrying a quarter of the buffer at RCCL's
    xGMI efficiency; each hop is a single xGMI link of one ring, so a large broadcast reaches 4 x 0.81 x 50 GB/s,
    against the textbook chain's one link (50 GB/s)."""
    topo = load_topology("frontier", 8)
    (phase,) = BROADCAST.get("rccl")(S, topo.gpus, topo)
    rings = ring_orders(topo.gpus, topo, vendor_params(topo, "rccl")["rings"])
    assert not (phase.dst == 0).any() and phase.messages == 7  # nothing flows back into the root
    hops = {
        (int(r[(i + k) % 8]), int(r[(i + k + 1) % 8]))
        for r in rings
        for i in [int(np.flatnonzero(r == 0)[0])]
        for k in range(7)
    }
    assert set(zip(phase.src.tolist(), phase.dst.tolist(), strict=True)) == hops  # rings from GCD 0, no closing hop
    assert phase.sizes[phase.src == 0].sum() == pytest.approx(S / 0.81)  # every chain leaves the root: 4 x S / 4
    gpus = topo.gpus
    busbw = {
        alg: 2.0**34 / run_collective(BROADCAST.get(alg)(2.0**34, gpus, topo), gpus, topo)[1].time_s / 1e9
        for alg in ("rccl", "ring")
    }
    assert busbw["rccl"] == pytest.approx(4 * 0.81 * 50, rel=0.01)
    assert busbw["ring"] == pytest.approx(50, rel=0.01)


def test_a_point_is_keyed_by_its_collective():
    specs = [
        CollectiveSpec(topology=ONE_NODE, collective=c, gpus=(8,), sizes=("1MiB",), algorithms=("ring",))
        for c in ("all_gather", "reduce_scatter")
    ]
    assert specs[0].keyed(8, "ring", "1MiB").digest != specs[1].keyed(8, "ring", "1MiB").digest


def test_the_cli_prints_nccl_tests_columns_names_the_size_and_resumes(tmp_path, capsys):
    machine = tmp_path / "machine.yaml"
    machine.write_text(yaml.safe_dump(ONE_NODE))
    argv = [
        "study",
        "collective",
        "--collective",
        "all_gather",
        "--topology",
        str(machine),
        "--gpus",
        "4,8",
        "--sizes",
        "1MiB,64MiB",
        "--out",
        str(tmp_path / "s"),
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "size: the gathered buffer per rank (B)" in out and "busbw = algbw x (n-1)/n (GB/s)" in out
    assert "time (us)" in out
    rows = pd.read_csv(tmp_path / "s" / "study.csv")
    assert sorted(rows["algorithm"].unique()) == ["ring"] and len(rows) == 4  # every algorithm the machine runs
    assert np.allclose(rows["busbw_bytes_per_s"], rows["algbw_bytes_per_s"] * (rows["gpus"] - 1) / rows["gpus"])
    described = yaml.safe_load((tmp_path / "s" / "study.yaml").read_text())
    assert described["size_meaning"] == "the gathered buffer per rank" and described["busbw"] == "algbw x (n-1)/n"
    assert (tmp_path / "s" / "bandwidth.png").exists()
    assert main(argv) == 0
    assert capsys.readouterr().err.count(": stored") == 4


@pytest.mark.parametrize(
    ("args", "key"),
    [
        (["--collective", "allreduce"], "--collective"),
        (["--collective", "all_reduce", "--gpus", "1"], "--gpus"),
        (["--collective", "all_gather", "--algorithms", "tree"], "--algorithms"),
        (["--collective", "all_reduce", "--algorithms", "nccl"], "--algorithms"),  # no NCCL parameters on this machine
        (["--collective", "broadcast", "--sizes", "0B"], "--sizes"),
    ],
)
def test_bad_options_are_refused_in_one_line_before_any_work(tmp_path, capsys, args, key):
    machine = tmp_path / "machine.yaml"
    machine.write_text(yaml.safe_dump(ONE_NODE))
    assert main(["study", "collective", *args, "--topology", str(machine), "--out", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err
    assert key in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "s").exists()
