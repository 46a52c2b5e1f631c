"""The ranks of a calibration: what each runs, how they are started, the progress line and the records.

Owns the job each rank runs (compute benchmarks, the core-sharing and blocking-wait benchmarks on CPU
hosts, then communication), the progress line on stderr, collecting the per-rank records, the optional
communication run inside a testbed, and the library versions a profile records. Ranks are spawned with
torch_backend.local_launch.run_local, each with cores // N intra-op threads as `piper-sim run` gives
them. The entry points piper_sim.calibrate calls: run_local_job, run_testbed_job, library_versions.
Imports torch; must not import piper_sim.calibrate.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy
import torch
import torch.distributed as dist

from piper_sim.errors import PiperError
from piper_sim.progress import BAR_FORMAT
from piper_sim.progress import bar as progress_bar
from piper_sim.testbed import load as load_testbed
from piper_sim.torch_backend.local_launch import run_local
from piper_sim.torch_backend.process_launch import launch_in_namespaces
from piper_sim.version import __version__ as piper_version

from .calibration_inputs import COLLECTIVES, CalibrationJob
from .comm import group_sizes, run_comm
from .compute import run_compute
from .sharing import bench_core_sharing
from .sharing import num_items as core_sharing_items
from .timing import pick_device
from .wake import bench_blocking_wait
from .wake import num_items as blocking_wait_items

TESTBED_MAX_MESSAGE_BYTES = 1 << 20  # 1 MiB takes ~0.1 s over a 100 Mbit/s emulated NIC


class Progress:
    """Progress of rank 0 on stderr: the shared progress line (piper_sim.progress: items done of the total, an
    ETA, the item under way: 'calibrate: 12/143 items [00:41<07:30], gemm 12/143: rows 64, k 256, n 512'); where
    that line is off (stderr not a terminal, PIPER_SIM_PROGRESS=0), a log line '[calibrate  42%] gemm ...'
    when the benchmark kind changes or at most once a second."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.enabled, self.done = max(total, 1), enabled, 0
        self.line = progress_bar(
            self.total, "calibrate", "items", show=enabled, delay_s=0, bar_format=BAR_FORMAT + "{postfix}"
        )
        self.last_print, self.last_kind = 0.0, ""

    def __call__(self, what: str) -> None:
        if not self.enabled:
            return
        self.done += 1
        if not self.line.disable:
            self.line.set_postfix_str(what, refresh=False)
            self.line.update(1)
            return
        kind = what.split(" ", 1)[0]
        now = time.monotonic()
        if kind != self.last_kind or now - self.last_print >= 1.0:
            print(f"[calibrate {min(100, 100 * self.done // self.total):3d}%] {what}", file=sys.stderr, flush=True)
            self.last_print = now
        self.last_kind = kind

    def close(self) -> None:
        self.line.close()


def _num_comm_items(world: int, sizes: int, levels: dict | None, benches: tuple[str, ...] | None) -> int:
    if world < 2:
        return 0
    pair_lists = (levels or {"local": [(0, 1)] * (world // 2)}).values()
    p2p = sum(2 if len(p) > 1 else 1 for p in pair_lists) * sizes if benches is None or "p2p" in benches else 0
    collectives = len([c for c in COLLECTIVES if benches is None or c in benches])
    return p2p + collectives * len(group_sizes(world)) * sizes


def machine_facts(rank: int, world: int) -> dict:
    device = pick_device(rank)
    facts = {
        "platform": platform.platform(),
        "processor": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "ranks": world,
        "threads_per_rank": torch.get_num_threads(),
        "dtype": device.dtype_name,
        "memory_GiB": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 2),
    }
    if device.is_cuda:
        props = torch.cuda.get_device_properties(device.torch_device)
        facts.update(
            accelerator=props.name,
            accelerator_memory_GiB=round(props.total_memory / 2**30, 2),
            accelerator_count=torch.cuda.device_count(),
        )
    return facts


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def worker(rank: int, world: int, job: CalibrationJob) -> None:
    """One rank: the benchmarks in the same order as every other rank; records to records_dir."""
    device = pick_device(rank)
    sweep = job.sweep(device.is_cuda)
    sizes = [s for s in sweep.message_bytes if job.max_message_bytes is None or s <= job.max_message_bytes]
    sharing = job.compute and not device.is_cuda  # a property of CPU hosts whose ranks share cores
    # the blocking wait is priced net of the all-to-all fit, which needs the local comm benchmarks
    blocking = sharing and job.comm and job.levels is None and world >= 2
    sharing_items = core_sharing_items(job.quick) + (blocking_wait_items(job.quick) if blocking else 0)
    total = (
        (sweep.num_compute_items() + 1 if job.compute else 0)
        + (sharing_items if sharing else 0)
        + (_num_comm_items(world, len(sizes), job.levels, job.benches) if job.comm else 0)
    )
    progress = Progress(total, enabled=rank == 0)
    records: list[dict] = []
    wall0, cpu0 = time.perf_counter(), time.process_time()
    if job.compute:
        records += run_compute(device, sweep, progress)
    cpu_share = (time.process_time() - cpu0) / max(time.perf_counter() - wall0, 1e-9)
    if sharing:  # rank 0 runs them alone: the other ranks wait, blocked
        if rank == 0:
            records += bench_core_sharing(job.presets[0], job.quick, progress)
            if blocking:
                records += bench_blocking_wait(job.presets[0], job.quick, progress)
        if dist.is_initialized():
            dist.barrier()
    if job.comm:
        records += [
            dict(r, where=job.tag)
            for r in run_comm(
                rank,
                world,
                sizes,
                sweep.comm_timing,
                progress,
                job.levels,
                collective_level=job.tag,
                benches=job.benches,
            )
        ]
    progress.close()
    payload = {"rank": rank, "machine": machine_facts(rank, world), "records": records, "compute_cpu_share": cpu_share}
    Path(job.records_dir, f"{job.tag}-rank{rank}.json").write_text(json.dumps(payload))


def read_records(records_dir: Path, tag: str, world: int) -> list[list[dict]]:
    out = []
    for rank in range(world):
        path = records_dir / f"{tag}-rank{rank}.json"
        if not path.exists():
            raise PiperError(f"calibrate: rank {rank} wrote no results ({path.name})")
        out.append(json.loads(path.read_text()))
    return out


def threads_per_rank(world: int, threads: int | None = None) -> int:
    """Intra-op threads of each rank: as given, else cores // ranks (what `piper-sim run` uses)."""
    return threads if threads else max(1, (os.cpu_count() or 1) // world)


def run_local_job(job: CalibrationJob, world: int, timeout_s: float, threads: int | None = None) -> list[dict]:
    """The job on `world` local ranks at once; each rank's records."""
    try:
        run_local(worker, world, job, timeout_s=timeout_s, num_threads=threads_per_rank(world, threads))
    except TimeoutError:
        raise PiperError(f"calibrate: the {world} ranks did not finish within {timeout_s:.0f} s") from None
    return read_records(Path(job.records_dir), job.tag, world)


def run_testbed_job(job: CalibrationJob, prefix: str, timeout_s: float) -> list[dict]:
    """Communication benchmarks with each rank in its testbed node's namespace; levels 'intra-node'
    (pairs on one node) and 'inter-node' (pairs on different nodes)."""
    bed = load_testbed(prefix)
    if bed is None:
        raise PiperError(f"--testbed {prefix}: no testbed with that prefix is up (run `piper-sim testbed up` first)")
    rank_map = bed.rank_map()
    world = len(rank_map)
    hosts = {r: bed.rank(r).host for r in range(world)}
    job = dataclasses.replace(
        job,
        compute=False,
        comm=True,
        levels=testbed_levels(hosts),
        tag="testbed",
        max_message_bytes=TESTBED_MAX_MESSAGE_BYTES,
    )
    launch_in_namespaces(
        "piper_sim.torch_backend.bench.runner:worker",
        (job,),
        rank_map,
        Path(job.records_dir) / "testbed-logs",
        timeout_s=timeout_s,
        env={"OMP_NUM_THREADS": str(threads_per_rank(world))},
    )
    return read_records(Path(job.records_dir), job.tag, world)


def testbed_levels(hosts: dict[int, int]) -> dict[str, list[tuple[int, int]]]:
    """Disjoint rank pairs per level: 'intra-node' (pairs on the same node, every node at once), then for
    each other node h 'node0-node{h}' (the ranks of node 0 paired with those of node h): one level per
    route class out of node 0 (same switch, same group, across the global link ...)."""
    by_host: dict[int, list[int]] = {}
    for rank in sorted(hosts):
        by_host.setdefault(hosts[rank], []).append(rank)
    levels: dict[str, list[tuple[int, int]]] = {}
    intra = [(ranks[i], ranks[i + 1]) for ranks in by_host.values() for i in range(0, len(ranks) - 1, 2)]
    if intra:
        levels["intra-node"] = intra
    first, *others = sorted(by_host)
    for host in others:
        levels[f"node{first}-node{host}"] = list(zip(by_host[first], by_host[host], strict=False))
    return levels


def library_versions() -> dict[str, str]:
    return {
        "piper_sim": str(piper_version),
        "torch": str(torch.__version__),
        "python": platform.python_version(),
        "numpy": numpy.__version__,
    }
