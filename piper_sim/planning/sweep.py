"""`piper-sim sweep CONFIG --grid KEY=V1,V2 ...`: the simulator over any grid of config keys.

Owns expanding the grid (the cartesian product, in the order the keys are given), resolving every point
before anything runs (a bad value names its key at once), and the table. Points run on the planner's
engine and store: each keyed by the digest of its resolved config, written as it finishes, never recomputed.
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
from piper_sim.planning.planner import simulate_point
from piper_sim.planning.store import ResultStore, point_digest

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
    keyed = [(point_digest(resolved), {"config": resolved}) for _, resolved in points]
    results = run_points(simulate_point, keyed, ResultStore(out), scheduler=scheduler, workers=workers,
                         label="sweep", progress=progress)
    table = pd.DataFrame([{**values, "digest": digest, **results[digest]}
                          for (values, _), (digest, _) in zip(points, keyed, strict=True)])
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "sweep.csv", index=False)
    table.to_parquet(out / "sweep.parquet", index=False)
    (out / "sweep.yaml").write_text(yaml.safe_dump({"base": base, "grid": grid_items}, sort_keys=False))
    return table
