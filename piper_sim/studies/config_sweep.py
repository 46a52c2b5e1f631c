"""`piper-sim sweep CONFIG --grid KEY=V1,V2 ...`: the simulator over any grid of config keys.

Owns expanding the grid (the cartesian product, in the order the keys are given), resolving every point
before anything runs (a bad value names its key at once), the table, and sweep.yaml (the base, the grid and
how many points this run reused, found stale and computed). Points run on piper_sim.points' runner and store: each
keyed by points.keys.point_key, written as it finishes, not recomputed while its key holds.
Must not import torch.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pandas as pd
import yaml

from piper_sim.analysis.tables import Col, render
from piper_sim.config import apply_overrides, load_config, read_config_file
from piper_sim.errors import ConfigError, named_by
from piper_sim.planning.planner import simulate_point
from piper_sim.points.dask_runner import run_points
from piper_sim.points.keys import keyed_point
from piper_sim.points.store import ResultStore
from piper_sim.rundir import writing
from piper_sim.schedule.communicators import config_reserve_bytes
from piper_sim.workload.memory import headroom_bytes
from piper_sim.workload.profile_load import load_profile

MAX_POINTS = 100_000


def parse_grid(items: list[str]) -> list[tuple[str, list[str]]]:
    """--grid KEY=V1,V2,... -> [(key, [values as written])]."""
    if not items:
        raise ConfigError("--grid", None, "at least one KEY=V1,V2,... (e.g. --grid parallel.pp=2,4,8)")
    grid, seen = [], set()
    for item in items:
        key, sep, values = item.partition("=")
        if not sep or not key or not values:
            raise ConfigError("--grid", item, "KEY=V1,V2,... with a config key such as parallel.pp")
        if key in seen:
            raise ConfigError("--grid", key, "each key once")
        seen.add(key)
        grid.append((key, [v.strip() for v in values.split(",")]))
    return grid


def sweep_points(base: dict, grid: list[tuple[str, list[str]]]) -> list[tuple[dict, dict]]:
    """[(grid values of the point, its resolved config)] for every point, checked before any runs."""
    count = 1
    for _, values in grid:
        count *= len(values)
    if count > MAX_POINTS:
        raise ConfigError("--grid", f"{count} points", f"at most {MAX_POINTS}")
    keys = [k for k, _ in grid]
    out = []
    for combo in itertools.product(*(values for _, values in grid)):
        overrides = [f"{k}={v}" for k, v in zip(keys, combo, strict=True)]
        with named_by("--grid"):  # a bad value names its option and key here, before anything runs
            cfg = load_config(apply_overrides(base, overrides))
            cfg.parallel.validate(cfg.model)
        out.append((dict(zip(keys, combo, strict=True)), cfg.resolved()))
    return out


def run_sweep(
    config: str | Path | dict,
    grid_items: list[str],
    out: Path,
    *,
    overrides: list[str] | None = None,
    scheduler: str | None = None,
    workers: int | None = None,
    progress: bool = True,
) -> pd.DataFrame:
    base = config if isinstance(config, dict) else read_config_file(config)
    base = apply_overrides(base, overrides or [])
    points = sweep_points(base, parse_grid(grid_items))
    keyed = [keyed_point({"config": resolved}) for _, resolved in points]
    store = ResultStore(out)
    results = run_points(
        simulate_point, keyed, store, scheduler=scheduler, workers=workers, label="sweep", progress=progress
    )
    table = pd.DataFrame(
        [
            {**values, "digest": point.digest, **results[point.digest]}
            for (values, _), point in zip(points, keyed, strict=True)
        ]
    )
    out.mkdir(parents=True, exist_ok=True)
    with writing(out / "sweep.csv"):
        table.to_csv(out / "sweep.csv", index=False)
    with writing(out / "sweep.parquet"):
        table.to_parquet(out / "sweep.parquet", index=False)
    with writing(out / "sweep.yaml"):
        (out / "sweep.yaml").write_text(
            yaml.safe_dump({"base": base, "grid": grid_items, "points": store.tally.as_dict()}, sort_keys=False)
        )
    return table


def sweep_text(
    table: pd.DataFrame,
    config: str | Path | dict,
    grid_items: list[str],
    *,
    overrides: list[str] | None = None,
    max_rows: int = 40,
) -> str:
    """The printed table of a sweep (analysis/tables.py): the grid's values, each point's GPUs, its figures, and
    whether its busiest stage fits the device's HBM less the framework reserve."""
    base = config if isinstance(config, dict) else read_config_file(config)
    configs = [
        load_config(resolved)
        for _, resolved in sweep_points(apply_overrides(base, overrides or []), parse_grid(grid_items))
    ]
    rows = [
        {**row, "gpus": cfg.parallel.num_gpus, "fits": _fits(cfg, row["sim_peak_memory_bytes"])}
        for row, cfg in zip(table.to_dict("records"), configs, strict=True)
    ]
    columns = [Col(key, key) for key, _ in parse_grid(grid_items)] + SWEEP_COLUMNS
    return render(rows[:max_rows], columns) + (
        f"\n... {len(rows) - max_rows} more points in sweep.csv" if len(rows) > max_rows else ""
    )


SWEEP_COLUMNS = [
    Col("gpus", "GPUs", "count"),
    Col("sim_step_time_s", "step", "time"),
    Col("sim_tflops_per_gpu", "TFLOPS/GPU", "TFLOPS"),
    Col("sim_mfu", "MFU", "%"),
    Col("sim_tokens_per_s", "tokens/s", "count"),
    Col("sim_bubble_fraction", "bubble", "%"),
    Col("sim_exposed_comm_fraction", "exposed comm", "%"),
    Col("sim_peak_memory_bytes", "peak memory", "GiB"),
    Col("fits", "fits", "yes/no"),
    Col("sim_all_to_all_bandwidth_bytes_per_s", "all-to-all per GPU", "GB/s"),
    Col("sim_wall_s", "simulated in", "time"),
    Col("sim_extrapolation", "from short runs"),  # docs/metrics.md, extrapolation
]


def _fits(cfg, peak_bytes: float) -> bool:
    """The busiest stage's peak within the device's HBM less the framework reserve (as simulate's report)."""
    profile = load_profile(cfg.cost_profile)
    return headroom_bytes([peak_bytes], profile.hbm_bytes, config_reserve_bytes(cfg, profile))[0] >= 0
