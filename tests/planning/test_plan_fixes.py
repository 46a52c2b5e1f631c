"""What --fix can set and what the planner says when it leaves no plan: communication libraries, the all-reduce
algorithm and flash attention as fixes; a dense model's expert TP; the key an empty space is named by; one row per
plan; DualPipe's two chunks taken where they are the only choice; Dask's dashboard switch."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from piper_sim.config import load_config
from piper_sim.errors import ConfigError
from piper_sim.notes import config_notes
from piper_sim.planning.plan_fixes import parse_fixes, split_settings
from piper_sim.planning.plan_point import KNOB_NAMES
from piper_sim.planning.planner import PlanRequest, candidates, plan, screen
from piper_sim.planning.space import space_notes
from piper_sim.points import dask_runner
from piper_sim.workload.presets import load_model

DENSE = {
    "preset": "small-moe",
    "name": "small-dense",
    "num_experts": 1,
    "top_k": 1,
    "num_dense_layers": 8,
    "dense_ffn_dim": 1024,
}


def request(fixes: list[str], **kw) -> PlanRequest:
    fixed, settings = split_settings(parse_fixes(fixes))
    return PlanRequest(
        **{
            "model": "small-moe",
            "num_gpus": 16,
            "global_batch": 64,
            "topology": "frontier",
            "fixed": fixed,
            **settings,
            **kw,
        }
    )


def test_fix_sets_the_all_to_all_to_a_communication_library():
    _, table, _, _ = screen(request(["collectives.all_to_all=rccl", "parallel.ep=8"]))
    assert len(table) > 0 and set(table["all_to_all"]) == {"rccl"}


def test_fix_searches_overlapped_all_to_alls_where_the_schedule_pairs_passes():
    """Off unless fixed; with true,false each plan that can pair its passes comes in both forms (the estimate never
    prices the overlapped one dearer, and most cheaper), and the plan's config carries it."""
    assert not screen(request(["parallel.ep=8"]))[1]["overlap_all_to_all"].any()
    fixes = ["parallel.ep=8", "collectives.overlap_all_to_all=true,false"]
    table = screen(request(fixes))[1]
    on, off = table[table["overlap_all_to_all"]], table[~table["overlap_all_to_all"]]
    assert len(on) > 0 and on["label"].str.contains(" overlapped").all()
    assert ((on["pp"] == 1) | on["schedule"].isin(["dualpipe", "dualpipe-v"]) | (on["vpp"] > 1)).all()
    assert (on["zero"] != 3).all()
    assert (on.loc[on["pp"] == 1, "num_microbatches"] > 1).all()  # one micro-batch without pipelining pairs nothing
    assert (off.loc[off["pp"] == 1, "num_microbatches"] == 1).any()
    knobs = [k for k in KNOB_NAMES if k != "overlap_all_to_all"]
    twins = on.set_index(knobs)["est_step_time_s"]
    alone = off.set_index(knobs)["est_step_time_s"]
    assert twins.index.isin(alone.index).all()
    assert (twins <= alone.loc[twins.index]).all() and (twins < alone.loc[twins.index]).mean() > 0.5
    assert len(off) > len(on)  # 1F1B with pipelining, ZB-H1, ZeRO-3 plans: no overlapped form
    point = candidates(request(["parallel.ep=8", "collectives.overlap_all_to_all=true"]), load_model("small-moe"))[0]
    assert load_config(request([]).config(point)).collectives.overlap_all_to_all


def test_fix_sets_the_all_reduce_and_flash_attention_of_every_plan():
    ring = request(["parallel.pp=1", "parallel.ep=2", "parallel.tp=1"])
    rccl = request(
        ["parallel.pp=1", "parallel.ep=2", "parallel.tp=1", "collectives.all_reduce=rccl", "cost.flash_attention=false"]
    )
    assert (rccl.all_reduce, rccl.flash_attention) == ("rccl", False)
    point = candidates(rccl, load_model("small-moe"))[0]
    config = load_config(rccl.config(point))
    assert (config.collectives.all_reduce, config.flash_attention) == ("rccl", False)
    # the estimate prices the gradient reduction with the fixed algorithm (dp 8 replicas of the dense weights)
    by_ring = screen(ring)[1].set_index("label")["est_grad_reduce_s"]
    by_rccl = screen(request(["parallel.pp=1", "parallel.ep=2", "parallel.tp=1", "collectives.all_reduce=rccl"]))[
        1
    ].set_index("label")["est_grad_reduce_s"]
    assert (by_ring != by_rccl.loc[by_ring.index]).any()


@pytest.mark.parametrize(
    ("fix", "key"),
    [
        ("cost.flash_attention=true,false", "--fix cost.flash_attention"),
        ("collectives.all_reduce=tree", "--fix collectives.all_reduce"),
        ("collectives.all_to_all=smoke", "--fix collectives.all_to_all"),
    ],
)
def test_a_setting_takes_one_value_that_every_plan_can_use(fix, key):
    with pytest.raises(ConfigError) as err:
        parse_fixes([fix])
    assert err.value.key == key


def test_a_library_the_topology_has_no_parameters_for_names_the_fix(tmp_path, capsys):
    from piper_sim.cli import main

    code = main(
        [
            "plan",
            "small-moe",
            "--gpus",
            "16",
            "--global-batch",
            "64",
            "--topology",
            "dgx-h100-superpod",
            "--fix",
            "collectives.all_to_all=rccl",
            "--top",
            "0",
            "--out",
            str(tmp_path / "p"),
        ]
    )
    assert code == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .splitlines()[-1]
        .startswith("piper-sim: error: --fix collectives.all_to_all: got 'rccl'")
    )


def test_a_dense_model_with_a_tp_fix_takes_etp_equal_to_tp_and_says_so():
    dense = request(["parallel.tp=2"], model=DENSE, num_gpus=8, global_batch=8, topology="uniform")
    points = candidates(dense, load_model(DENSE))
    assert points and {(p.tp, p.etp, p.ep) for p in points} == {(2, 2, 1)}
    assert any("parallel.etp follows parallel.tp" in n for n in space_notes(load_model(DENSE), dense.fixed))
    with pytest.raises(ConfigError) as err:  # an expert TP of 1 asked for: the error names it
        screen(
            request(["parallel.tp=2", "parallel.etp=1"], model=DENSE, num_gpus=8, global_batch=8, topology="uniform")
        )
    assert err.value.key == "--fix parallel.etp"


def test_an_ep_group_wider_than_the_domain_names_ep_domain():
    wide = request(["parallel.ep=16"], model={"preset": "small-moe", "num_experts": 16}, topology="dgx-h100-superpod")
    with pytest.raises(ConfigError) as err:
        screen(wide)
    assert (err.value.key, err.value.value) == ("--ep-domain", "switch")
    assert len(screen(PlanRequest(**{**wide.__dict__, "domain": "any"}))[1]) > 0


def test_a_tp_by_ep_plan_table_has_one_row_per_plan(tmp_path):
    fixes = [
        "parallel.tp=2",
        "parallel.ep=4",
        "parallel.micro_batch_size=2",
        "parallel.etp=1,2",
        "parallel.sp=true,false",
    ]
    req = request(fixes, topology="dgx-h100-superpod", top_k=2)
    points = candidates(req, load_model("small-moe"))
    assert len({p.label() for p in points}) == len(points) == len(set(points))
    result = plan(req, tmp_path, workers=0, progress=False)
    assert len(result.table) == len(points) and result.table["label"].is_unique
    assert int(result.table["refined"].sum()) == 2


def test_dualpipe_without_vpp_2_takes_it_and_says_so():
    cfg = load_config("small-moe", ["schedule=dualpipe"])  # the example gives vpp 1
    assert cfg.parallel.vpp == 2
    assert any(n.startswith("parallel.vpp 1 taken as 2") for n in config_notes(cfg))
    assert load_config("small-moe", ["schedule=dualpipe-v", "parallel.vpp=4"]).parallel.vpp == 4  # not taken over
    assert load_config("small-moe", ["schedule=1f1b"]).parallel.vpp == 1
    # the planner: a vpp bound keeps DualPipe at its only value, and says so
    req = request(["schedule=dualpipe", "parallel.vpp=1"])
    points = candidates(req, load_model("small-moe"))
    assert points and {p.vpp for p in points} == {2}
    assert any("parallel.vpp 2" in n for n in space_notes(load_model("small-moe"), req.fixed))


def test_dashboard_needs_dask_and_bokeh(monkeypatch):
    monkeypatch.setattr(dask_runner, "_dashboard", False)
    with pytest.raises(ConfigError) as err:
        dask_runner.configure_engine(None, 0, True)
    assert err.value.key == "--dashboard"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "bokeh" else object())
    with pytest.raises(ConfigError) as err:
        dask_runner.configure_engine(None, 2, True)
    assert err.value.key == "--dashboard"
    dask_runner.configure_engine(None, 2, False)
    assert dask_runner._dashboard is False


@pytest.mark.skipif(importlib.util.find_spec("bokeh") is None, reason="Dask draws its dashboard with bokeh")
def test_dashboard_serves_and_prints_its_address(tmp_path, capsys, monkeypatch):
    from piper_sim.points.keys import keyed_point
    from piper_sim.points.store import ResultStore

    monkeypatch.setattr(dask_runner, "_dashboard", False)
    dask_runner.configure_engine(None, 1, True)
    dask_runner.run_points(dict, [keyed_point({"a": 1})], ResultStore(Path(tmp_path)), workers=1, label="t")
    err = capsys.readouterr().err
    assert "piper-sim: Dask dashboard of t: http" in err
