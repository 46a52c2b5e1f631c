"""`piper-sim calibrate`: run the micro-benchmarks on N ranks at once and write a cost profile.

Owns the calibration's course: the warning when the machine is busy, the sweep (sweep.make_sweep) and job
handed to the benchmarks, the raw records (saved with --records), the profile built from them
(records_to_profile.build_profile) and written, rebuilding a profile from saved records (--refit) and merging several
calibrations. The benchmarks and their ranks are piper_sim.torch_backend.bench (runner.run_local_job,
run_testbed_job); this module must not import torch, and imports the torch side only when it measures.
"""

from __future__ import annotations

import gzip
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from piper_sim.calibrate.records_to_profile import build_profile, write_profile
from piper_sim.calibrate.sweep import DEFAULT_PRESETS, make_sweep
from piper_sim.errors import PiperError
from piper_sim.torch_backend.bench.calibration_inputs import CalibrationJob


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


def calibrate(
    out: Path,
    *,
    ranks: int,
    quick: bool,
    testbed: str | None = None,
    presets: tuple[str, ...] = DEFAULT_PRESETS,
    command: str = "",
    timeout_s: float | None = None,
    records_out: Path | None = None,
    threads: int | None = None,
) -> dict:
    """Run the benchmarks and write the profile to `out`; returns the profile mapping.

    records_out: also save the raw per-rank records (JSON) there, for refitting (refit_profile)."""
    from piper_sim.torch_backend.bench import runner as bench  # torch: loaded only when measuring

    if ranks < 1:
        raise PiperError(f"--ranks {ranks}: a positive number of ranks")
    timeout = timeout_s or (1800.0 if quick else 7200.0)
    started, busy0, own0 = time.perf_counter(), _busy_core_s(), _own_core_s()
    load_before = [round(x, 2) for x in os.getloadavg()]
    time.sleep(0.5)
    busy_now = foreign_cpu_share(busy0, own0, time.perf_counter() - started)
    if busy_now is not None and busy_now > 0.2:
        print(
            f"calibrate: warning: the machine is busy ({100 * busy_now:.0f}% of the cores in use by other "
            "processes); their work will be measured as contention",
            file=sys.stderr,
        )
    with tempfile.TemporaryDirectory(prefix="piper-calibrate-") as tmp:
        job = CalibrationJob(
            records_dir=tmp,
            quick=quick,
            presets=presets,
            cpu_sweep=make_sweep(quick, presets),
            cuda_sweep=make_sweep(quick, presets, cuda=True),
        )
        per_rank = bench.run_local_job(job, ranks, timeout, threads)
        testbed_ranks = bench.run_testbed_job(job, testbed, timeout) if testbed else None
    wall = time.perf_counter() - started
    foreign = foreign_cpu_share(busy0, own0, wall)
    if foreign is not None and foreign > 0.05:
        print(
            f"calibrate: warning: other processes used {100 * foreign:.0f}% of the cores during the measurement",
            file=sys.stderr,
        )
    raw = {
        "per_rank": per_rank,
        "testbed_per_rank": testbed_ranks,
        "quick": quick,
        "command": command,
        "versions": bench.library_versions(),
        "wall_s": wall,
        "load_average_before": load_before,
        "foreign_cpu_share": foreign,
    }
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
        raise PiperError(
            f"--refit {' '.join(map(str, paths))}: not the records calibrate --records writes "
            f"({type(err).__name__}: {err})"
        ) from None
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
            raise PiperError(
                f"--refit: {', '.join(names)} ran different numbers of ranks; merge calibrations of "
                "the same --ranks and sweep"
            )
        return [
            dict(
                ranks[0],
                records=_merge_records([r["records"] for r in ranks], names),
                compute_cpu_share=statistics.median(r.get("compute_cpu_share", 0.0) for r in ranks),
            )
            for ranks in zip(*per_calibration, strict=True)
        ]

    return dict(
        first,
        per_rank=merge_ranks("per_rank"),
        testbed_per_rank=merge_ranks("testbed_per_rank"),
        command=f"median of {len(raws)} calibrations: " + " | ".join(str(r.get("command", "")) for r in raws),
        wall_s=sum(float(r.get("wall_s") or 0.0) for r in raws),
        foreign_cpu_share=max(
            (r["foreign_cpu_share"] for r in raws if r.get("foreign_cpu_share") is not None), default=None
        ),
    )


def _merge_records(lists: list[list[dict]], names: list[str]) -> list[dict]:
    if len({len(records) for records in lists}) != 1:
        raise PiperError(
            f"--refit: {', '.join(names)} hold different numbers of benchmark records; merge "
            "calibrations of the same sweep (presets, --quick)"
        )
    out = []
    for i, recs in enumerate(zip(*lists, strict=True)):
        labels = [({k: v for k, v in r.items() if isinstance(v, str)}, set(r)) for r in recs]
        if any(label != labels[0] for label in labels):
            raise PiperError(
                f"--refit: record {i} differs between {', '.join(names)} ({labels[0][0]} vs another); "
                "merge calibrations of the same sweep"
            )
        merged = dict(recs[0])
        for key, value in recs[0].items():
            if isinstance(value, float):
                merged[key] = statistics.median(float(r[key]) for r in recs)
            elif isinstance(value, list) and key == "window_means_s":
                merged[key] = [t for r in recs for t in r[key]]
        out.append(merged)
    return out
