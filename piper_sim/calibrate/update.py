"""`piper-sim calibrate --out PROFILE --benches KINDS`: measure some communication benchmarks alone and write them
into an existing profile.

Owns measuring only the listed communication benchmarks (torch_backend/bench/calibration_inputs.COMM_BENCHES) on the
profile's ranks and threads, and the profile they go into: its `measurements.network.local` series of those
benchmarks replaced by the new ones (fitted as a full calibration fits them, record_fits.network_summary),
everything else kept as it was (numbers, order, the comments of its top-level lines), and the run recorded in
`measurements.network.separate_runs` (benchmarks, command, date, ranks, versions, load, foreign CPU share). A
profile calibrated before a benchmark existed takes it this way without measuring everything again, which would move
every other number with the machine's drift. Must not import torch (the benchmarks are loaded to measure).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import yaml

from piper_sim.calibrate.calibration import _busy_core_s, _own_core_s, foreign_cpu_share
from piper_sim.calibrate.record_fits import network_summary
from piper_sim.calibrate.records_to_profile import aggregate, write_profile
from piper_sim.calibrate.sweep import DEFAULT_PRESETS, make_sweep
from piper_sim.errors import ConfigError, PiperError
from piper_sim.torch_backend.bench.calibration_inputs import COMM_BENCHES, CalibrationJob


def check_benches(text: str) -> tuple[str, ...]:
    """The benchmarks of a comma-separated list, each one of COMM_BENCHES, in their running order."""
    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [n for n in names if n not in COMM_BENCHES]
    if unknown or not names:
        raise ConfigError("--benches", text, f"a comma-separated list of {', '.join(COMM_BENCHES)}")
    return tuple(b for b in COMM_BENCHES if b in names)


def read_existing(out: Path, ranks: int) -> dict:
    """The profile --benches writes into: a calibrated profile (its machine and measurements) of --ranks ranks."""
    if not out.is_file():
        raise PiperError(
            f"calibrate --benches: {out} is no profile; --benches adds to a calibrated profile "
            "(calibrate it in full first)"
        )
    try:
        profile = yaml.safe_load(out.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise PiperError(f"calibrate --benches: cannot read {out} as a profile ({type(err).__name__})") from None
    machine = profile.get("machine") if isinstance(profile, dict) else None
    if not isinstance(machine, dict) or not isinstance(profile.get("measurements"), dict):
        raise PiperError(
            f"calibrate --benches: {out} has no machine and measurements; --benches adds to a profile "
            "that piper-sim calibrate wrote"
        )
    if machine.get("ranks") != ranks:
        raise ConfigError("--ranks", ranks, f"the ranks {out} was calibrated with ({machine.get('ranks')})")
    return profile


def update_network(
    out: Path,
    *,
    ranks: int,
    benches: tuple[str, ...],
    quick: bool,
    command: str,
    timeout_s: float | None = None,
    records_out: Path | None = None,
    threads: int | None = None,
) -> dict:
    """Measure `benches` on `ranks` local ranks (the profile's threads per rank unless given) and write them into
    the profile at `out` (with_network); returns the profile mapping."""
    profile = read_existing(out, ranks)
    if ranks < 2:
        raise ConfigError("--ranks", ranks, "at least 2 (communication needs two ranks)")
    from piper_sim.torch_backend.bench import runner as bench  # torch: loaded only when measuring

    started, busy0, own0 = time.perf_counter(), _busy_core_s(), _own_core_s()
    load_before = [round(x, 2) for x in os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="piper-calibrate-") as tmp:
        job = CalibrationJob(
            records_dir=tmp,
            quick=quick,
            presets=DEFAULT_PRESETS,
            compute=False,
            benches=benches,
            cpu_sweep=make_sweep(quick, DEFAULT_PRESETS),
            cuda_sweep=make_sweep(quick, DEFAULT_PRESETS, cuda=True),
        )
        per_rank = bench.run_local_job(
            job, ranks, timeout_s or 1800.0, threads or profile["machine"].get("threads_per_rank")
        )
    wall = time.perf_counter() - started
    foreign = foreign_cpu_share(busy0, own0, wall)
    if foreign is not None and foreign > 0.05:
        print(
            f"calibrate: warning: other processes used {100 * foreign:.0f}% of the cores during the measurement",
            file=sys.stderr,
        )
    run = {
        "benches": list(benches),
        "command": command,
        "sweep": "quick" if quick else "full",
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "ranks": ranks,
        "threads_per_rank": per_rank[0]["machine"]["threads_per_rank"],
        "versions": bench.library_versions(),
        "calibrate_wall_s": round(wall, 1),
        "load_average_before": load_before,
        "foreign_cpu_share": None if foreign is None else round(foreign, 2),
    }
    if records_out is not None:
        records_out.parent.mkdir(parents=True, exist_ok=True)
        records_out.write_text(json.dumps({"per_rank": per_rank, "run": run}))
    updated = with_network(profile, per_rank, run)
    comments = _line_comments(out.read_text())
    write_profile(out, updated)
    _restore_comments(out, comments)
    return updated


def with_network(profile: dict, per_rank: list[dict], run: dict) -> dict:
    """The profile with the benchmarks of `run` (its "benches") replaced by the records' fits in
    measurements.network.local, and `run` appended to measurements.network.separate_runs."""
    measured = network_summary(aggregate(per_rank)).get("local", {})
    missing = [b for b in run["benches"] if b not in measured]
    if missing:
        raise PiperError(f"calibrate --benches: the ranks recorded nothing for {', '.join(missing)}")
    network = dict(profile["measurements"].get("network") or {})
    network["local"] = {**(network.get("local") or {}), **{b: measured[b] for b in run["benches"]}}
    network["separate_runs"] = [*(network.get("separate_runs") or []), run]
    return {**profile, "measurements": {**profile["measurements"], "network": network}}


def _line_comments(text: str) -> dict[str, str]:
    """The trailing comments of the file's top-level `key: value  # comment` lines, by the line before them."""
    out = {}
    for line in text.splitlines()[1:]:
        body, sep, comment = line.partition("  #")
        if sep and not line.startswith((" ", "#")):
            out[body.rstrip()] = line[len(body.rstrip()) :]
    return out


def _restore_comments(path: Path, comments: dict[str, str]) -> None:
    lines = path.read_text().splitlines()
    path.write_text(
        "\n".join(line + comments.get(line, "") if not line.startswith(" ") else line for line in lines) + "\n"
    )
