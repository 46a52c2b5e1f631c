"""The planner's screen gives the same table, digit for digit, as the stored tables in tests/data/screen_tables:
every candidate's knobs, memory per stage, reserve, fit and estimate for three small requests that between them
take every schedule, ZeRO stage, resharding choice, HSDP, context parallelism, selective recomputation and fp8.
The stored tables were written by the screen before its memoization (but for the HSDP rows, rewritten when the
estimator's memo of the gradient reduction was keyed by the HSDP degree); regenerate them with
`python tests/planning/test_screen_tables.py` only when a change of the resource model or the estimator is intended."""

from __future__ import annotations

import gzip
import io
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd

from piper_sim.planning.estimate import Estimator
from piper_sim.planning.plan_fixes import parse_fixes
from piper_sim.planning.planner import PlanRequest, candidates, screen
from piper_sim.topology.load import load_topology
from piper_sim.topology.placement import place
from piper_sim.workload.presets import load_model
from piper_sim.workload.profile_load import load_profile

STORE = Path(__file__).resolve().parents[1] / "data" / "screen_tables"
REQUESTS = {
    "mixtral-16-frontier": dict(
        model="mixtral-8x7b",
        num_gpus=16,
        global_batch=32,
        topology="frontier",
        seq_len=4096,
        fixed=["parallel.pp=2,4", "parallel.micro_batch_size=1"],
    ),
    "dsv2-16-frontier-cp-selective": dict(
        model="deepseek-v2",
        num_gpus=16,
        global_batch=8,
        topology="frontier",
        seq_len=32768,
        flash_attention=False,
        fixed=["parallel.pp=2", "parallel.micro_batch_size=1", "parallel.tp=1"],
    ),
    "qwen3-30b-16-h100-fp8": dict(
        model="qwen3-30b-a3b",
        num_gpus=16,
        global_batch=32,
        topology="dgx-h100-superpod",
        seq_len=4096,
        precision="fp8",
        fixed=["parallel.pp=1,2", "parallel.micro_batch_size=2"],
    ),
}


def table_text(name: str, estimate_unfit: bool = True) -> str:
    """The screen's table of REQUESTS[name] as CSV, every float with 17 significant digits (exact)."""
    settings = dict(REQUESTS[name])
    request = PlanRequest(**{**settings, "fixed": parse_fixes(settings["fixed"]), "top_k": 0})
    _, table, hbm_bytes, reserve_bytes = screen(request, progress=False, estimate_unfit=estimate_unfit)
    table = table.assign(hbm_bytes=hbm_bytes, max_reserve_bytes=reserve_bytes)
    return table.to_csv(index=False, float_format="%.17g", lineterminator="\n")


def test_the_screen_tables_are_unchanged():
    for name in REQUESTS:
        stored = gzip.decompress((STORE / f"{name}.csv.gz").read_bytes()).decode()
        got = table_text(name)
        if got != stored:
            differ = [(a, b) for a, b in zip(stored.splitlines(), got.splitlines(), strict=False) if a != b]
            header = stored.splitlines()[0]
            raise AssertionError(
                f"{name}: {len(differ)} rows differ (rows {len(stored.splitlines())} stored, "
                f"{len(got.splitlines())} now); columns {header}; first stored/now:\n"
                + "\n".join(differ[0] if differ else ("", ""))
            )


def test_without_estimating_the_plans_that_do_not_fit_the_plans_that_fit_are_unchanged():
    """reproduce reads only the best plan that fits: screen(estimate_unfit=False) prices the others' memory only."""
    stored = pd.read_csv(io.StringIO(gzip.decompress((STORE / "mixtral-16-frontier.csv.gz").read_bytes()).decode()))
    got = pd.read_csv(io.StringIO(table_text("mixtral-16-frontier", estimate_unfit=False)))
    estimates = [c for c in stored.columns if c.startswith("est_")]
    assert 0 < stored["fits"].sum() < len(stored)
    pd.testing.assert_frame_equal(
        got[got["fits"]], stored[stored["fits"]], check_dtype=False, check_exact=True
    )  # int-valued floats read back as ints
    assert got.loc[~got["fits"], estimates].isna().all().all()
    pd.testing.assert_frame_equal(got.drop(columns=estimates), stored.drop(columns=estimates), check_exact=True)


def test_an_hsdp_plans_estimate_does_not_depend_on_the_plans_estimated_before_it():
    """HSDP reduces a unit's gradients within its shard group and all-reduces the shard across the replicas: its
    gradient reduction differs from its ZeRO-3 twin's without HSDP, whichever the estimator prices first."""
    request = PlanRequest(model="mixtral-8x7b", num_gpus=16, global_batch=32, topology="frontier", seq_len=4096)
    model = load_model(request.model_section())
    hsdp = next(p for p in candidates(request, model) if p.dp_shard > 0)
    twin = replace(hsdp, dp_shard=0)
    topo = load_topology("frontier", 16)

    def estimator() -> Estimator:
        return Estimator(model, topo, place(topo, 16, "contiguous"), load_profile(request.profile_choice().profile))

    alone = estimator().estimate(hsdp)
    after_twin = estimator()
    twin_estimate = after_twin.estimate(twin)
    assert after_twin.estimate(hsdp) == alone
    assert alone.grad_reduce_s != twin_estimate.grad_reduce_s


if __name__ == "__main__":  # write the stored tables with the piper_sim on the path
    STORE.mkdir(parents=True, exist_ok=True)
    for name in REQUESTS:
        (STORE / f"{name}.csv.gz").write_bytes(gzip.compress(table_text(name).encode(), mtime=0))
        print(f"wrote {STORE / name}.csv.gz", file=sys.stderr)
