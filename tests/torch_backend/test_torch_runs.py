"""Real runs: a killed rank ends the run with a clear error; HALO on the testbed equals flat byte for byte."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from piper_sim.config import load_config
from piper_sim.errors import PiperError
from piper_sim.schedule.build import build_schedule
from piper_sim.torch_backend.a2a_algorithms import all_to_all, prepare_groups
from piper_sim.torch_backend.training_run import launch

ROOT = Path(__file__).resolve().parents[2]
needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None,
    reason="the testbed needs root, iproute2 (ip) and tc",
)


@pytest.mark.slow
def test_killed_rank_ends_the_run_with_an_error_naming_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPER_SIM_KILL_RANK", "1")
    cfg = load_config("examples/tiny-moe.yaml", ["sim.steps=1"])
    start = time.monotonic()
    with pytest.raises(PiperError, match="rank 1"):
        launch(cfg, build_schedule(cfg), tmp_path, timeout_s=120, corpus_bytes=100_000)
    assert time.monotonic() - start < 120


def a2a_check(rank: int, world: int, out_dir: str, seed: int) -> None:
    """Flat and HALO on random uneven splits (one rank receives nothing): identical bytes; timings."""
    group = list(range(world))
    node_of = {r: r // 2 for r in group}
    prepare_groups(group, node_of)
    gen = torch.Generator().manual_seed(seed)
    timings = {}
    for rows_per_pair in (0, 256, 4096):
        splits = torch.randint(0, 2 * rows_per_pair + 1, (world, world), generator=gen)
        splits[:, world - 1] = 0  # the last rank receives nothing
        mine = splits[rank].tolist()
        data = torch.randn(sum(mine), 64, generator=torch.Generator().manual_seed(seed * 100 + rank))
        outputs = {}
        for algorithm in ("flat", "halo"):
            dist.barrier()
            t0 = time.perf_counter()
            outputs[algorithm] = all_to_all(data, mine, group, node_of, algorithm)
            timings[f"{algorithm}:{rows_per_pair}"] = time.perf_counter() - t0
        (flat_rows, flat_splits), (halo_rows, halo_splits) = outputs["flat"], outputs["halo"]
        if flat_splits != halo_splits or not torch.equal(flat_rows, halo_rows):
            raise AssertionError(f"rank {rank}: halo differs from flat at {rows_per_pair} rows per pair")
    Path(out_dir, f"a2a{rank}.json").write_text(json.dumps(timings))


@needs_root
@pytest.mark.slow
def test_halo_on_the_testbed_equals_flat(tmp_path, monkeypatch):
    from piper_sim.testbed import down, up
    from piper_sim.torch_backend.process_launch import launch_processes

    monkeypatch.chdir(ROOT)  # the ranks import this test module from the repository root
    prefix = "pstq"
    bed = up(ROOT / "topologies" / "testbed-2g.yaml", prefix=prefix)
    try:
        rank_map = bed.rank_map()
        launch_processes(
            "tests.torch_backend.test_torch_runs:a2a_check",
            (str(tmp_path), 7),
            len(rank_map),
            tmp_path,
            rank_env={r: {"GLOO_SOCKET_IFNAME": "eth0"} for r in rank_map},
            rank_prefix={r: ["ip", "netns", "exec", ns] for r, (ns, _) in rank_map.items()},
            master_addr=rank_map[0][1],
            timeout_s=180,
        )
    finally:
        removed = down(prefix)
    assert len(list(tmp_path.glob("a2a*.json"))) == len(rank_map)
    assert removed["namespaces"]
