"""`piper-sim sweep CONFIG --grid KEY=V1,V2 ...`: the simulator over any grid of config keys.

Owns expanding the grid (the cartesian product, in the order the keys are given), resolving every point
before anything runs (a bad value names its key at once), the table, and sweep.yaml (the base, the grid and
how many points this run reused, found stale and computed). Points run on the planner's engine and store: each
keyed by planning.keys.point_key, written as it finishes, not recomputed while its key holds.
Must not import torch.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pandas as pd
import yaml

from piper_sim.config import apply_overrides, load_config, read_config_file
from piper_sim.errors import ConfigError, named_by
from piper_sim.planning.engine import run_points
from piper_sim.planning.keys import keyed_point
from piper_sim.planning.planner import simulate_point
from piper_sim.planning.store import ResultStore

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


def run_sweep(config: str | Path | dict, grid_items: list[str], out: Path, *, overrides: list[str] | None = None,
              scheduler: str | None = None, workers: int | None = None, progress: bool = True) -> pd.DataFrame:
    base = config if isinstance(config, dict) else read_config_file(config)
    base = apply_overrides(base, overrides or [])
    points = sweep_points(base, parse_grid(grid_items))
    keyed = [keyed_point({"config": resolved}) for _, resolved in points]
    store = ResultStore(out)
    results = run_points(simulate_point, keyed, store, scheduler=scheduler, workers=workers, label="sweep",
                         progress=progress)
    table = pd.DataFrame([{**values, "digest": point.digest, **results[point.digest]}
                          for (values, _), point in zip(points, keyed, strict=True)])
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "sweep.csv", index=False)
    table.to_parquet(out / "sweep.parquet", index=False)
    (out / "sweep.yaml").write_text(yaml.safe_dump({"base": base, "grid": grid_items,
                                                    "points": store.tally.as_dict()}, sort_keys=False))
    return table
