"""`piper-sim calibrate`: run the micro-benchmarks on N ranks at once and write a cost profile.

Owns the job each rank runs (compute benchmarks, the core-sharing and blocking-wait benchmarks on CPU
hosts, then communication), the progress line on stderr, collecting the per-rank records, the optional
communication run inside a testbed, and writing the profile. Ranks are spawned with
torch_backend.local_launch.run_local, each with cores // N intra-op threads as `piper-sim run` gives
them. Imports torch.
"""

from __future__ import annotations

import gzip
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from piper_sim.calibrate.comm import group_sizes, run_comm
from piper_sim.calibrate.compute import run_compute
from piper_sim.calibrate.profile import build_profile, write_profile
from piper_sim.calibrate.sharing import bench_core_sharing
from piper_sim.calibrate.sharing import num_items as core_sharing_items
from piper_sim.calibrate.sweep import DEFAULT_PRESETS, make_sweep
from piper_sim.calibrate.timing import pick_device
from piper_sim.calibrate.wake import bench_blocking_wait
from piper_sim.calibrate.wake import num_items as blocking_wait_items
from piper_sim.errors import PiperError

TESTBED_MAX_MESSAGE_BYTES = 1 << 20  # 1 MiB takes ~0.1 s over a 100 Mbit/s emulated NIC


class Progress:
    """Progress of rank 0 on stderr: '[calibrate  42%] gemm 12/143: rows 64, k 256, n 512'.

    On a terminal the line is rewritten in place; otherwise a line is printed when the benchmark kind
    changes or at most once a second."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.enabled, self.done = max(total, 1), enabled, 0
        self.tty = sys.stderr.isatty()
        self.last_print, self.last_kind = 0.0, ""

    def __call__(self, what: str) -> None:
        if not self.enabled:
            return
        self.done += 1
        kind = what.split(" ", 1)[0]
        line = f"[calibrate {min(100, 100 * self.done // self.total):3d}%] {what}"
        now = time.monotonic()
        if self.tty:
            print(f"\r\033[K{line}", end="", file=sys.stderr, flush=True)
        elif kind != self.last_kind or now - self.last_print >= 1.0:
            print(line, file=sys.stderr, flush=True)
            self.last_print = now
        self.last_kind = kind

    def close(self) -> None:
        if self.enabled and self.tty:
            print(file=sys.stderr, flush=True)


@dataclass(frozen=True)
class CalibrationJob:
    """What each rank runs; picklable."""

    records_dir: str
    quick: bool
    presets: tuple[str, ...] = DEFAULT_PRESETS
    compute: bool = True
    comm: bool = True
    levels: dict[str, list[tuple[int, int]]] | None = None
    tag: str = "local"
    max_message_bytes: int | None = None  # emulated networks are slow: cap the message sizes


def _num_comm_items(world: int, sizes: int, levels: dict | None) -> int:
    if world < 2:
        return 0
    pair_lists = (levels or {"local": [(0, 1)] * (world // 2)}).values()
    p2p = sum(2 if len(p) > 1 else 1 for p in pair_lists) * sizes
    return p2p + 2 * len(group_sizes(world)) * sizes


def machine_facts(rank: int, world: int) -> dict:
    device = pick_device(rank)
    facts = {"platform": platform.platform(), "processor": _cpu_name(), "cpu_count": os.cpu_count(),
             "ranks": world, "threads_per_rank": torch.get_num_threads(), "dtype": device.dtype_name,
             "memory_GiB": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 2)}
    if device.is_cuda:
        props = torch.cuda.get_device_properties(device.torch_device)
        facts.update(accelerator=props.name, accelerator_memory_GiB=round(props.total_memory / 2**30, 2),
                     accelerator_count=torch.cuda.device_count())
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
    sweep = make_sweep(job.quick, job.presets, cuda=device.is_cuda)
    sizes = [s for s in sweep.message_bytes if job.max_message_bytes is None or s <= job.max_message_bytes]
    sharing = job.compute and not device.is_cuda  # a property of CPU hosts whose ranks share cores
    # the blocking wait is priced net of the all-to-all fit, which needs the local comm benchmarks
    blocking = sharing and job.comm and job.levels is None and world >= 2
    sharing_items = core_sharing_items(job.quick) + (blocking_wait_items(job.quick) if blocking else 0)
    total = ((sweep.num_compute_items() + 1 if job.compute else 0) + (sharing_items if sharing else 0)
             + (_num_comm_items(world, len(sizes), job.levels) if job.comm else 0))
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
        records += [dict(r, where=job.tag) for r in
                    run_comm(rank, world, sizes, sweep.comm_timing, progress, job.levels, collective_level=job.tag)]
    progress.close()
    payload = {"rank": rank, "machine": machine_facts(rank, world), "records": records,
               "compute_cpu_share": cpu_share}
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
    from piper_sim.torch_backend.local_launch import run_local

    try:
        run_local(worker, world, job, timeout_s=timeout_s, num_threads=threads_per_rank(world, threads))
    except TimeoutError:
        raise PiperError(f"calibrate: the {world} ranks did not finish within {timeout_s:.0f} s") from None
    return read_records(Path(job.records_dir), job.tag, world)


def run_testbed_job(job: CalibrationJob, prefix: str, timeout_s: float) -> list[dict]:
    """Communication benchmarks with each rank in its testbed node's namespace; levels 'intra-node'
    (pairs on one node) and 'inter-node' (pairs on different nodes)."""
    from piper_sim.testbed import load
    from piper_sim.torch_backend.process_launch import launch_in_namespaces

    bed = load(prefix)
    if bed is None:
        raise PiperError(f"--testbed {prefix}: no testbed with that prefix is up (run `piper-sim testbed up` first)")
    rank_map = bed.rank_map()
    world = len(rank_map)
    hosts = {r: bed.rank(r).host for r in range(world)}
    job = CalibrationJob(records_dir=job.records_dir, quick=job.quick, presets=job.presets, compute=False,
                         comm=True, levels=testbed_levels(hosts), tag="testbed",
                         max_message_bytes=TESTBED_MAX_MESSAGE_BYTES)
    launch_in_namespaces("piper_sim.calibrate.runner:worker", (job,), rank_map, Path(job.records_dir) / "testbed-logs",
                         timeout_s=timeout_s, env={"OMP_NUM_THREADS": str(threads_per_rank(world))})
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


def _busy_core_s() -> float | None:
    """Core-seconds the whole machine spent busy so far (/proc/stat), None where unavailable."""
    try:
        fields = [float(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _own_core_s() -> float:
    self_, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return self_.ru_utime + self_.ru_stime + children.ru_utime + children.ru_stime


def foreign_cpu_share(busy0: float | None, own0: float, wall_s: float) -> float | None:
    """Fraction of the machine's cores that other processes used while we measured (0 on a quiet machine)."""
    busy1 = _busy_core_s()
    if busy0 is None or busy1 is None or wall_s <= 0:
        return None
    foreign = (busy1 - busy0) - (_own_core_s() - own0)
    return max(0.0, foreign) / (wall_s * (os.cpu_count() or 1))


def calibrate(out: Path, *, ranks: int, quick: bool, testbed: str | None = None,
              presets: tuple[str, ...] = DEFAULT_PRESETS, command: str = "", timeout_s: float | None = None,
              records_out: Path | None = None, threads: int | None = None) -> dict:
    """Run the benchmarks and write the profile to `out`; returns the profile mapping.

    records_out: also save the raw per-rank records (JSON) there, for refitting (refit_profile)."""
    if ranks < 1:
        raise PiperError(f"--ranks {ranks}: a positive number of ranks")
    timeout = timeout_s or (600.0 if quick else 7200.0)
    started, busy0, own0 = time.perf_counter(), _busy_core_s(), _own_core_s()
    load_before = [round(x, 2) for x in os.getloadavg()]
    time.sleep(0.5)
    busy_now = foreign_cpu_share(busy0, own0, time.perf_counter() - started)
    if busy_now is not None and busy_now > 0.2:
        print(f"calibrate: warning: the machine is busy ({100 * busy_now:.0f}% of the cores in use by other "
              "processes); their work will be measured as contention", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="piper-calibrate-") as tmp:
        job = CalibrationJob(records_dir=tmp, quick=quick, presets=presets)
        per_rank = run_local_job(job, ranks, timeout, threads)
        testbed_ranks = run_testbed_job(job, testbed, timeout) if testbed else None
    wall = time.perf_counter() - started
    foreign = foreign_cpu_share(busy0, own0, wall)
    if foreign is not None and foreign > 0.05:
        print(f"calibrate: warning: other processes used {100 * foreign:.0f}% of the cores during the measurement",
              file=sys.stderr)
    raw = {"per_rank": per_rank, "testbed_per_rank": testbed_ranks, "quick": quick, "command": command,
           "versions": _versions(), "wall_s": wall, "load_average_before": load_before, "foreign_cpu_share": foreign}
    if records_out is not None:
        records_out.parent.mkdir(parents=True, exist_ok=True)
        records_out.write_text(json.dumps(raw))
    profile = build_profile(name=out.stem, **raw)
    write_profile(out, profile)
    return profile


def refit_profile(records_paths: Path | list[Path], out: Path) -> dict:
    """Rebuild a profile from raw records saved by calibrate(records_out=...), without measuring again. With
    several files (calibrations of the same sweep and ranks, e.g. one before and one after a measurement),
    every measured number is their median (merge_calibrations). Files ending in .gz are read gzipped."""
    paths = [records_paths] if isinstance(records_paths, Path | str) else list(records_paths)
    raws = []
    for path in paths:
        try:
            text = gzip.decompress(Path(path).read_bytes()) if str(path).endswith(".gz") else Path(path).read_text()
            raws.append(json.loads(text))
        except (OSError, ValueError) as err:
            raise PiperError(f"--refit {path}: cannot read calibrate's records ({err})") from None
    try:
        raw = raws[0] if len(raws) == 1 else merge_calibrations(raws, [str(p) for p in paths])
        profile = build_profile(name=out.stem, **raw)
    except (KeyError, TypeError, AttributeError) as err:
        raise PiperError(f"--refit {' '.join(map(str, paths))}: not the records calibrate --records writes "
                         f"({type(err).__name__}: {err})") from None
    write_profile(out, profile)
    return profile


def merge_calibrations(raws: list[dict], names: list[str]) -> dict:
    """One set of raw records from several calibrations of the same sweep (each rank's records match by
    position): every float a record measured is the median over the calibrations, lists of rounds
    (window_means_s) are joined, counts and labels come from the first. The machine drifts by tens of
    percent over minutes (validation/README.md), so one calibration is a snapshot; calibrations that
    bracket a measurement describe the machine it ran on."""
    first = raws[0]

    def merge_ranks(key: str) -> list[dict] | None:
        per_calibration = [raw.get(key) for raw in raws]
        if any(p is None for p in per_calibration):
            return None
        if len({len(p) for p in per_calibration}) != 1:
            raise PiperError(f"--refit: {', '.join(names)} ran different numbers of ranks; merge calibrations of "
                             "the same --ranks and sweep")
        return [dict(ranks[0], records=_merge_records([r["records"] for r in ranks], names),
                     compute_cpu_share=statistics.median(r.get("compute_cpu_share", 0.0) for r in ranks))
                for ranks in zip(*per_calibration, strict=True)]

    return dict(first, per_rank=merge_ranks("per_rank"), testbed_per_rank=merge_ranks("testbed_per_rank"),
                command=f"median of {len(raws)} calibrations: " + " | ".join(str(r.get("command", "")) for r in raws),
                wall_s=sum(float(r.get("wall_s") or 0.0) for r in raws),
                foreign_cpu_share=max((r["foreign_cpu_share"] for r in raws if r.get("foreign_cpu_share") is not None),
                                      default=None))


def _merge_records(lists: list[list[dict]], names: list[str]) -> list[dict]:
    if len({len(records) for records in lists}) != 1:
        raise PiperError(f"--refit: {', '.join(names)} hold different numbers of benchmark records; merge "
                         "calibrations of the same sweep (presets, --quick)")
    out = []
    for i, recs in enumerate(zip(*lists, strict=True)):
        labels = [({k: v for k, v in r.items() if isinstance(v, str)}, set(r)) for r in recs]
        if any(label != labels[0] for label in labels):
            raise PiperError(f"--refit: record {i} differs between {', '.join(names)} ({labels[0][0]} vs another); "
                             "merge calibrations of the same sweep")
        merged = dict(recs[0])
        for key, value in recs[0].items():
            if isinstance(value, float):
                merged[key] = statistics.median(float(r[key]) for r in recs)
            elif isinstance(value, list) and key == "window_means_s":
                merged[key] = [t for r in recs for t in r[key]]
        out.append(merged)
    return out


def _versions() -> dict[str, str]:
    import numpy

    from piper_sim import __version__ as piper_version

    return {"piper_sim": str(piper_version), "torch": str(torch.__version__), "python": platform.python_version(),
            "numpy": numpy.__version__}
