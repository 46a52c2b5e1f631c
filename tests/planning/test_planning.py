"""The planner: the plan space against hand counts, the resource model against the simulator's tracker, the
estimator's closed forms against dry runs and the simulator, resume, the Dask path, and bad input."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from piper_sim.cli import main
from piper_sim.config import load_config
from piper_sim.errors import ConfigError
from piper_sim.planning import resource
from piper_sim.planning.estimate import Estimator
from piper_sim.planning.pipeline_estimate import pipeline_s
from piper_sim.planning.plan_fixes import parse_fixes
from piper_sim.planning.plan_point import PlanPoint
from piper_sim.planning.planner import PlanRequest, domain_gpus, screen
from piper_sim.planning.resource import coarse_programs, stage_memory
from piper_sim.planning.space import enumerate_plans
from piper_sim.schedule.build import build_schedule
from piper_sim.schedule.dryrun import coarse_timing
from piper_sim.schedule.validate import check_schedule, dry_run
from piper_sim.simulator import simulate
from piper_sim.studies import config_sweep as sweep_module
from piper_sim.studies.config_sweep import run_sweep
from piper_sim.topology.load import load_topology
from piper_sim.topology.placement import place
from piper_sim.workload.presets import load_model
from piper_sim.workload.profile_load import load_profile

TINY = load_model("tiny-moe")  # 4 layers, 8 experts


def test_enumeration_equals_a_hand_count():
    # 8 GPUs, 8 sequences, 1F1B + flat only: pp 1 (ep 1,2,4,8; one microbatch of 1) = 4; pp 2 (ep 1,2,4;
    # mbs 1 or 2) = 6; pp 4 (ep 1,2; mbs 1,2,4) = 6; pp 8 > 4 layers
    fixed = parse_fixes(["schedule=1f1b", "collectives.all_to_all=flat"])
    assert len(enumerate_plans(TINY, 8, 8, domain_gpus=8, fixed=fixed)) == 16
    # all four schedules: gpipe as 1f1b (16); ZB-H1 without pp 1 (12); interleaved: pp 2 x vpp 2 with an
    # even microbatch count, ep 1,2,4 (3)
    points = enumerate_plans(TINY, 8, 8, domain_gpus=8, fixed=parse_fixes(["collectives.all_to_all=flat"]))
    by_schedule = {s: sum(p.schedule == s for p in points) for s in ("1f1b", "gpipe", "zb-h1", "interleaved-1f1b")}
    assert by_schedule == {"1f1b": 16, "gpipe": 16, "zb-h1": 12, "interleaved-1f1b": 3}
    # an EP group within one node of 2 GPUs: ep 4 and 8 drop out
    assert {p.ep for p in enumerate_plans(TINY, 8, 8, domain_gpus=2, fixed=fixed)} == {1, 2}


def test_halo_is_tried_only_where_an_ep_group_leaves_a_node():
    """HALO on one node runs flat's phases, so an EP group inside a node (ep x etp consecutive ranks, a divisor of
    its GPUs; ep 1 has no all-to-all) keeps the flat twin alone; fixed to HALO alone, HALO is kept."""
    fixed = parse_fixes(["schedule=1f1b", "parallel.pp=1"])
    points = enumerate_plans(TINY, 16, 16, domain_gpus=16, node_gpus=4, fixed=fixed)
    by_ep = {ep: sorted({p.all_to_all for p in points if p.ep == ep}) for ep in {p.ep for p in points}}
    assert by_ep == {1: ["flat"], 2: ["flat"], 4: ["flat"], 8: ["flat", "halo"]}
    only_halo = parse_fixes(["schedule=1f1b", "parallel.pp=1", "collectives.all_to_all=halo"])
    kept = enumerate_plans(TINY, 16, 16, domain_gpus=16, node_gpus=4, fixed=only_halo)
    assert {p.all_to_all for p in kept} == {"halo"}
    # the twin dropped is the same simulation: EP 8 inside a node of the 8-GPU uniform cluster, 16 GPUs
    request = PlanRequest(model="tiny-moe", num_gpus=16, global_batch=16, topology="uniform", profile="mi250x")
    assert load_topology("uniform", 16).num_hosts == 2
    flat, halo = (
        simulate(
            load_config(
                request.config(
                    PlanPoint(
                        pp=1,
                        ep=8,
                        dp=2,
                        vpp=1,
                        micro_batch_size=1,
                        num_microbatches=1,
                        schedule="1f1b",
                        all_to_all=a2a,
                        recompute="none",
                        zero=0,
                    )
                )
            )
        ).report.step_time_s
        for a2a in ("flat", "halo")
    )
    assert flat == halo


def test_every_emitted_plan_validates_and_dry_runs():
    request = PlanRequest(model="tiny-moe", num_gpus=8, global_batch=8, topology="uniform", profile="mi250x")
    for point in enumerate_plans(TINY, 8, 8, domain_gpus=8):
        schedule = build_schedule(load_config(request.config(point)))
        check_schedule(schedule)
        dry_run(schedule)


GRID = [
    PlanPoint(
        pp=pp,
        ep=ep,
        dp=8 // (pp * ep),
        vpp=vpp,
        micro_batch_size=mbs,
        num_microbatches=m,
        schedule=s,
        all_to_all="flat",
        recompute=rc,
        zero=zero,
    )
    for pp, ep, vpp, mbs, m, s, rc, zero in [
        (1, 8, 1, 2, 4, "1f1b", "none", 0),
        (2, 4, 1, 1, 8, "1f1b", "none", 0),
        (2, 4, 1, 1, 8, "gpipe", "none", 0),
        (2, 2, 2, 1, 8, "interleaved-1f1b", "none", 0),
        (4, 2, 1, 2, 4, "zb-h1", "none", 0),
        (8, 1, 1, 1, 8, "1f1b", "none", 0),
        (2, 2, 1, 1, 8, "1f1b", "full", 2),
        (4, 1, 1, 2, 4, "zb-h1", "full", 1),
        (2, 4, 2, 1, 8, "interleaved-1f1b", "selective", 2),
        (4, 2, 2, 1, 8, "dualpipe", "none", 0),
        (2, 4, 2, 1, 8, "dualpipe", "none", 0),
        (4, 2, 2, 1, 8, "dualpipe-v", "none", 0),
    ]
]


@pytest.mark.parametrize("point", GRID, ids=lambda p: p.label())
def test_resource_model_agrees_with_the_tracker(point):
    request = PlanRequest(
        model="small-moe",
        num_gpus=8,
        global_batch=point.micro_batch_size * point.num_microbatches * point.dp * point.ep,
        topology="uniform",
    )
    report = simulate(load_config(request.config(point))).report
    model = load_model("small-moe")
    modelled = [m.peak_bytes for m in stage_memory(model, point)]
    assert modelled == pytest.approx(report.peak_memory_bytes, rel=0.05)
    assert modelled == pytest.approx(report.peak_memory_bytes, rel=1e-12)  # the same formulas: exactly


@pytest.mark.parametrize(
    ("preset", "schedule", "pp", "vpp"),
    [
        ("deepseek-v3", "1f1b", 8, 1),  # three dense layers first
        ("llama4-maverick", "interleaved-1f1b", 4, 3),  # MoE every other layer
        ("qwen3-30b-a3b", "dualpipe-v", 4, 2),  # each stage holds a chunk at each end of the pipeline
        ("mixtral-8x7b", "zb-h1", 6, 1),  # 32 layers over 6 stages: 5 and 6 a stage
    ],
)
def test_stages_of_one_shape_share_their_memory_terms(preset, schedule, pp, vpp):
    """stage_memory computes the terms once per stage shape (resource.stage_shape): each stage's state, activations
    and transient equal those computed for that stage alone, and distinct shapes are computed apart."""
    model = load_model(preset)
    point = PlanPoint(
        pp=pp, ep=1, dp=1, vpp=vpp, micro_batch_size=1, num_microbatches=4 * pp, schedule=schedule, all_to_all="flat"
    )
    resource._TERMS.clear()
    shared = stage_memory(model, point)
    parallel = replace(point.parallel, num_microbatches=1)
    for p, got in enumerate(shared):
        state, act, transient = resource._stage_terms(
            model, resource.schedule_layout(schedule), parallel, p, True, point.recompute, None, point.zero, None,
            True, resource.DEFAULT_SELECTIVE_MODULES, point.reshard_after_forward,
        )  # fmt: skip
        counts = resource.live_counts(schedule, pp, vpp, point.num_microbatches, p)
        assert got.state_bytes == state
        assert got.activation_bytes == float(np.max(counts @ act)) + transient
    shapes = {resource.stage_shape(model, resource.schedule_layout(schedule), pp, vpp, p) for p in range(pp)}
    assert 1 < len(shapes) < pp


@pytest.mark.parametrize("point", GRID, ids=lambda p: p.label())
def test_estimator_is_close_to_the_simulator(point):
    model = load_model("small-moe")
    topo = load_topology("frontier", 8)
    estimator = Estimator(model, topo, place(topo, 8, "contiguous"), load_profile("mi250x"))
    request = PlanRequest(model="small-moe", num_gpus=8, global_batch=1, topology="frontier")
    simulated = simulate(load_config(request.config(point))).report.step_time_s
    assert estimator.estimate(point).step_time_s == pytest.approx(simulated, rel=0.1)


@pytest.mark.parametrize(
    ("schedule", "pp", "vpp", "m"),
    [
        ("1f1b", 4, 1, 8),
        ("gpipe", 4, 1, 8),
        ("1f1b", 8, 1, 8),
        ("interleaved-1f1b", 4, 2, 8),
        ("zb-h1", 4, 1, 8),
        ("zb-h1", 4, 1, 16),
    ],
)
def test_pipeline_closed_forms_equal_the_dry_run(schedule, pp, vpp, m):
    f, b, w = 1.0, 2.0, 0.0
    if schedule == "zb-h1":
        b, w = 1.0, 1.0
    point = PlanPoint(
        pp=pp, ep=1, dp=1, vpp=vpp, micro_batch_size=1, num_microbatches=m, schedule=schedule, all_to_all="flat"
    )
    durations = {"forward": f / vpp, "backward": b / vpp, "backward_input": b / vpp, "backward_weight": w / vpp}
    makespan = coarse_timing(coarse_programs(schedule, pp, vpp, m), vpp=vpp, durations=durations).makespan
    assert pipeline_s(point, [(f, b, w, 0.0)] * pp) == pytest.approx(makespan, rel=1e-9)


def test_a_plan_the_model_calls_infeasible_is_flagged_by_simulate():
    request = PlanRequest(model="x-moe-medium", num_gpus=8, global_batch=8, topology="frontier")
    _, table, _, _ = screen(request)
    row = table[~table["fits"]].iloc[0]
    point = PlanPoint(
        **{k: row[k].item() if hasattr(row[k], "item") else row[k] for k in PlanPoint.__dataclass_fields__}
    )
    report = simulate(load_config(request.config(point))).report
    assert not all(report.fits_memory) and min(report.memory_headroom_bytes) < 0


def test_a_fixed_knob_outside_the_default_search_is_honoured():
    request = PlanRequest(
        model="tiny-moe", num_gpus=8, global_batch=8, topology="uniform", fixed=parse_fixes(["optimizer.zero=2"])
    )
    _, table, _, _ = screen(request)
    assert len(table) > 0 and set(table["zero"]) == {2}


def test_frontier_locality_domains():
    topo = load_topology("frontier", 1024)
    domains = [domain_gpus("frontier", 1024, d, topo) for d in ("node", "switch", "group", "any")]
    assert domains == [8, 32, 1024, 1024]
    assert domain_gpus("frontier", 2048, "group", load_topology("frontier", 2048)) == 1024


def test_plan_builds_the_topology_once(tmp_path, monkeypatch):
    """`piper-sim plan` builds its machine once (planning/cli.check_machine) and screens every plan on it: the
    topology's builder runs once before the first estimate and once in all."""
    from piper_sim.planning import planner
    from piper_sim.topology import load as topology_load

    builds, estimates = [], []
    build, estimate = topology_load._build, planner.Estimator.estimate
    monkeypatch.setattr(topology_load, "_build", lambda *a: builds.append(a) or build(*a))
    monkeypatch.setattr(
        planner.Estimator, "estimate", lambda self, point: estimates.append(len(builds)) or estimate(self, point)
    )
    main(
        [
            "plan",
            "tiny-moe",
            "--gpus",
            "8",
            "--global-batch",
            "8",
            "--topology",
            "uniform",
            "--top",
            "0",
            "--workers",
            "0",
            "--out",
            str(tmp_path / "plan"),
        ]
    )
    assert estimates and estimates[0] == 1 and len(builds) == 1


GRID_ARGS = ["parallel.pp=1,2", "collectives.all_to_all=flat,halo"]
BASE = {"model": "tiny-moe", "parallel": {"pp": 1, "ep": 2, "num_microbatches": 4}}


def test_an_interrupted_sweep_resumes_without_recomputing(tmp_path, monkeypatch):
    real = sweep_module.simulate_point
    calls = []

    def interrupted(payload):
        if len(calls) == 2:
            raise KeyboardInterrupt
        calls.append(payload)
        return real(payload)

    monkeypatch.setattr(sweep_module, "simulate_point", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(BASE, GRID_ARGS, tmp_path / "run", workers=0, progress=False)
    assert len(list((tmp_path / "run" / "points").glob("*.json"))) == 2  # finished points are kept
    calls.clear()
    monkeypatch.setattr(sweep_module, "simulate_point", lambda p: calls.append(p) or real(p))
    resumed = run_sweep(BASE, GRID_ARGS, tmp_path / "run", workers=0, progress=False)
    assert len(calls) == 2  # only the two unfinished points ran
    calls.clear()
    fresh = run_sweep(BASE, GRID_ARGS, tmp_path / "fresh", workers=0, progress=False)
    cols = [c for c in fresh.columns if c != "sim_wall_s"]
    assert resumed[cols].equals(fresh[cols])
    calls.clear()
    again = run_sweep(BASE, GRID_ARGS, tmp_path / "run", workers=0, progress=False)
    assert calls == [] and again.equals(resumed)  # everything finished: nothing recomputed


def test_dask_local_cluster_gives_the_in_process_table(tmp_path):
    local = run_sweep(BASE, GRID_ARGS, tmp_path / "local", workers=0, progress=False)
    dask = run_sweep(BASE, GRID_ARGS, tmp_path / "dask", workers=2, progress=False)
    cols = [c for c in local.columns if c != "sim_wall_s"]
    assert dask[cols].equals(local[cols])


def test_plan_cli_writes_its_outputs(tmp_path, capsys):
    out = tmp_path / "plan"
    code = main(
        [
            "plan",
            "tiny-moe",
            "--gpus",
            "8",
            "--topology",
            "uniform",
            "--global-batch",
            "16",
            "--top",
            "3",
            "--workers",
            "0",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    for name in ("plans.parquet", "plans.csv", "best.yaml", "pareto.png", "why.md"):
        assert (out / name).exists(), name
    table = pd.read_csv(out / "plans.csv")
    assert table["refined"].sum() == 3 and table["sim_step_time_s"].notna().sum() == 3
    assert table["rank"].tolist() == list(range(1, len(table) + 1)) and table.iloc[0]["refined"]
    assert "chosen:" in capsys.readouterr().out
    best = load_config(str(out / "best.yaml"))
    assert best.parallel.num_gpus == 8 and best.parallel.sequences_per_step == 16


@pytest.mark.parametrize(
    "args",
    [
        ["--fix", "foo=1"],
        ["--fix", "parallel.pp=3"],
        ["--fix", "schedule=zz"],
        ["--gpus", "0"],
        ["--scheduler", "tcp://127.0.0.1:9"],
    ],
)
def test_plan_bad_input_is_one_clear_error(tmp_path, capsys, args):
    base = {"--gpus": "8", "--global-batch": "16"}
    argv = ["plan", "tiny-moe", "--topology", "uniform", "--out", str(tmp_path / "p")]
    for key, value in base.items():
        if key not in args:
            argv += [key, value]
    assert main(argv + args) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("piper-sim: error:")]
    assert len(errors) == 1 and args[0].lstrip("-").split("=")[0] in errors[0]  # names the option


@pytest.mark.parametrize(
    ("command", "flag", "key", "allowed"),
    [
        (["plan", "tiny-moe", "--gpus", "8", "--global-batch", "16"], "--topology", "topology", "frontier"),
        (["plan", "tiny-moe", "--gpus", "8", "--global-batch", "16"], "--profile", "cost.profile", "mi250x"),
        (
            ["study", "scaling", "tiny-moe", "--gpus", "8,16", "--strong", "--global-batch", "16"],
            "--profile",
            "cost.profile",
            "mi250x",
        ),
        (
            ["study", "scaling", "tiny-moe", "--gpus", "8,16", "--strong", "--global-batch", "16"],
            "--topology",
            "topology",
            "frontier",
        ),
    ],
)
def test_a_bad_topology_or_profile_names_the_flag_and_the_key_before_any_work(
    tmp_path, capsys, command, flag, key, allowed
):
    out = tmp_path / "p"
    assert main([*command, flag, "no-such-thing", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and not out.exists()  # one line, nothing planned (no note, no --out claimed)
    assert err.startswith(f"piper-sim: error: {flag} {key}: got 'no-such-thing'; allowed: ") and allowed in err


def test_python_m_piper_sim_exits_with_the_commands_status(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "piper_sim",
            "plan",
            "tiny-moe",
            "--gpus",
            "8",
            "--global-batch",
            "16",
            "--profile",
            "nope",
            "--out",
            str(tmp_path / "p"),
        ],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )  # this checkout's piper_sim
    assert done.returncode == 2 and "--profile cost.profile" in done.stderr


def test_no_plan_fits_exits_non_zero(tmp_path, capsys):
    code = main(
        [
            "plan",
            "x-moe-large",
            "--gpus",
            "8",
            "--global-batch",
            "8",
            "--top",
            "1",
            "--workers",
            "0",
            "--out",
            str(tmp_path / "p"),
        ]
    )
    assert code == 1
    assert "no plan fits" in capsys.readouterr().err
    assert "No plan fits" in (tmp_path / "p" / "why.md").read_text()


def test_fix_parses_config_keys_and_lists():
    assert parse_fixes(["parallel.pp=2,4", "schedule=zb-h1"]) == {"pp": (2, 4), "schedule": ("zb-h1",)}
    with pytest.raises(ConfigError, match="positive integers"):
        parse_fixes(["parallel.ep=two"])
    assert json.dumps(parse_fixes([])) == "{}"
