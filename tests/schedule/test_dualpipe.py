"""DualPipe (DeepSeek-V3 technical report, section 3.2.1; github.com/deepseek-ai/DualPipe) and DualPipeV: the
bidirectional and V layouts, the generators' orders, lowering, the simulator, the planner."""

from __future__ import annotations

import dataclasses

import pytest

from piper_sim.config import load_config
from piper_sim.errors import ConfigError
from piper_sim.planning.pipeline_estimate import pipeline_s
from piper_sim.planning.plan_point import PlanPoint
from piper_sim.planning.resource import stage_memory
from piper_sim.planning.space import _schedule_allows
from piper_sim.schedule.build import build_schedule, split_layers
from piper_sim.schedule.dryrun import coarse_timing
from piper_sim.schedule.generator_registry import schedule_layout
from piper_sim.schedule.generators import dualpipe, dualpipe_v, one_f_one_b, zb_h1
from piper_sim.schedule.io import schedule_from_json, schedule_to_json
from piper_sim.schedule.ir import Layout, VirtualStages
from piper_sim.schedule.validate import ScheduleError, check_coarse, check_schedule, dry_run, dry_run_coarse
from piper_sim.simulator import simulate
from piper_sim.workload.presets import load_model

BI = Layout.BIDIRECTIONAL
SPLIT_UNITS = {"forward": 1, "backward_input": 1, "backward_weight": 1}  # F 1, full backward B 2, W 1
PAPER_UNITS = {"forward": 1, "backward": 2}
SHAPES = [(2, 4), (2, 8), (4, 8), (4, 12), (6, 12), (8, 16), (8, 20), (8, 32)]


def _makespan(programs, pp: int, vpp: int, m: int, durations: dict, layout: Layout = Layout.INTERLEAVED) -> float:
    return dry_run_coarse(programs, pp, vpp, m, durations=durations, layout=layout)


# ---------------------------------------------------------------- layouts


def test_layouts_map_chunks_to_virtual_stages() -> None:
    inter, v, bi = (VirtualStages(layout, 4, 2) for layout in (Layout.INTERLEAVED, Layout.V, BI))
    assert [inter.of(p, c) for c in range(2) for p in range(4)] == [0, 1, 2, 3, 4, 5, 6, 7]
    assert [v.of(p, 1) for p in range(4)] == [7, 6, 5, 4] == [bi.of(p, 1) for p in range(4)]
    for stages in (inter, v, bi):
        assert all(stages.where(stages.of(p, c)) == (p, c) for p in range(4) for c in range(2))
    assert [v.next(3), v.previous(4)] == [4, 3]  # V: one pipeline down the ranks and back up
    assert [bi.next(3), bi.previous(4), bi.is_first(4), bi.is_last(3)] == [None, None, True, True]
    assert [bi.position(bi.of(p, 1)) for p in range(4)] == [3, 2, 1, 0]  # rank p, up: stage pp - 1 - p
    assert split_layers(8, bi) == ((0, 1), (2, 3), (4, 5), (6, 7)) * 2
    with pytest.raises(ValueError, match="2 chunks"):
        VirtualStages(Layout.V, 4, 3)


def test_microbatches_split_between_the_two_pipelines() -> None:
    bi = VirtualStages(BI, 4, 2)
    assert [m for m in range(8) if bi.runs(1, 0, m, 8)] == [0, 1, 2, 3]
    assert [m for m in range(8) if bi.runs(1, 1, m, 8)] == [4, 5, 6, 7]
    assert all(
        VirtualStages(Layout.INTERLEAVED, 4, 2).runs(p, c, m, 8) for p in range(4) for c in range(2) for m in range(8)
    )


# ---------------------------------------------------------------- generator


@pytest.mark.parametrize(("pp", "m"), SHAPES)
def test_dualpipe_validates_and_runs_without_deadlock(pp: int, m: int) -> None:
    programs = dualpipe(pp, 2, m)
    check_coarse(programs, pp, 2, m, layout=BI)
    assert [len(p) for p in programs] == [3 * m] * pp  # each rank: F, B, W of every microbatch, once
    for p in range(pp):  # rank p and rank pp - 1 - p run the same order, directions swapped
        mirror = [(t.kind, 1 - t.chunk, (t.microbatch + m // 2) % m) for t in programs[pp - 1 - p]]
        assert [(t.kind, t.chunk, t.microbatch) for t in programs[p]] == mirror
    assert _makespan(programs, pp, 2, m, SPLIT_UNITS, BI) >= 3 * m


def test_the_interleaved_dry_run_of_dualpipe_does_not_pass() -> None:
    """The order only runs with its layout's dependencies: checked as interleaved, it fails."""
    with pytest.raises(ScheduleError):
        dry_run_coarse(dualpipe(4, 2, 8), 4, 2, 8)


@pytest.mark.parametrize(
    ("pp", "vpp", "m", "key"),
    [
        (3, 2, 12, "parallel.pp"),
        (4, 1, 8, "parallel.vpp"),
        (4, 3, 8, "parallel.vpp"),
        (4, 2, 9, "parallel.num_microbatches"),
        (4, 2, 6, "parallel.num_microbatches"),
        (0, 2, 8, "parallel.pp"),
    ],
)
def test_dualpipe_constraints_name_the_key(pp: int, vpp: int, m: int, key: str) -> None:
    with pytest.raises(ConfigError) as error:
        dualpipe(pp, vpp, m)
    assert error.value.key == key
    assert not _schedule_allows("dualpipe", max(pp, 1), vpp, m, 64)


@pytest.mark.parametrize(
    ("pp", "vpp", "m", "key"),
    [
        (4, 1, 8, "parallel.vpp"),
        (4, 2, 7, "parallel.num_microbatches"),
        (2, 2, 0, "parallel.num_microbatches"),
    ],
)
def test_dualpipe_v_constraints_name_the_key(pp: int, vpp: int, m: int, key: str) -> None:
    with pytest.raises(ConfigError) as error:
        dualpipe_v(pp, vpp, m)
    assert error.value.key == key
    assert not _schedule_allows("dualpipe-v", pp, vpp, m, 64)


@pytest.mark.parametrize(("pp", "m"), [(1, 2), (2, 4), (3, 6), (3, 7), (4, 8), (4, 13), (8, 16)])
def test_dualpipe_v_validates_and_its_bubble_is_below_zb_h1(pp: int, m: int) -> None:
    """DualPipeV on pp ranks runs 2 pp half-size stages: chunk tasks of half a stage's time."""
    programs = dualpipe_v(pp, 2, m)
    check_coarse(programs, pp, 2, m, layout=Layout.V)
    half = {kind: t / 2 for kind, t in SPLIT_UNITS.items()}
    bubble = _makespan(programs, pp, 2, m, half, Layout.V) - 3 * m
    assert bubble == pytest.approx((pp - 1) / 2)  # measured: half of ZB-H1's pp - 1
    assert bubble <= _makespan(zb_h1(pp, 1, m), pp, 1, m, SPLIT_UNITS) - 3 * m


def test_dualpipe_order_follows_the_reference_at_pp_4() -> None:
    """DualPipe.step on rank 0 of 4, 8 microbatches (0-3 down, 4-7 up), worked by hand: 1 (nF0) F0 F1;
    2 (nF0F1) F2 F4; 3 (nB1W1F1) B4 W4 F5; 4 (nF0B1F1B0) F3 B5 F6 B0; 5 (nB1F1B0) B6 F7 B1; 6 (nB1B0) B7
    and B2 with its weight pass deferred; 7 (nWB0) W2 B3 deferred; 8 (nW) W3. An unsplit backward is B W."""
    order = [
        f"{'W' if t.kind == 'backward_weight' else t.kind[0].upper()}{t.microbatch}.{t.chunk}"
        for t in dualpipe(4, 2, 8)[0]
    ]
    assert " ".join(order) == (
        "F0.0 F1.0 F2.0 F4.1 B4.1 W4.1 F5.1 F3.0 B5.1 W5.1 F6.1 B0.0 W0.0 B6.1 W6.1 "
        "F7.1 B1.0 W1.0 B7.1 W7.1 B2.0 W2.0 B3.0 W3.0"
    )


@pytest.mark.parametrize(("pp", "m"), SHAPES)
def test_dualpipe_bubble_is_below_1f1b_and_zb_h1(pp: int, m: int) -> None:
    dual = _makespan(dualpipe(pp, 2, m), pp, 2, m, SPLIT_UNITS, BI) - 3 * m
    ofob = _makespan(one_f_one_b(pp, 1, m), pp, 1, m, PAPER_UNITS) - 3 * m
    zb = _makespan(zb_h1(pp, 1, m), pp, 1, m, SPLIT_UNITS) - 3 * m
    assert ofob == 3 * (pp - 1) and zb == pp - 1
    assert dual == pp // 2 - 1  # measured; below both (0 at pp 2)
    assert dual < ofob and dual <= zb


# ---------------------------------------------------------------- lowering, simulator, files


def _config(pp: int = 4, m: int = 8, **extra):
    overrides = [
        "schedule=dualpipe",
        f"parallel.pp={pp}",
        "parallel.vpp=2",
        f"parallel.num_microbatches={m}",
        f"parallel.ep={8 // pp}",
        *[f"{k}={v}" for k, v in extra.items()],
    ]
    return load_config("examples/small-moe.yaml", overrides)


def test_lowered_dualpipe_validates_and_dry_runs() -> None:
    schedule = build_schedule(_config())
    assert schedule.layout == BI and schedule_layout("dualpipe") == BI
    check_schedule(schedule)
    assert dry_run(schedule) > 0
    programs = schedule.stage_programs
    embeds = [p for p, program in enumerate(programs) if any("embed" in t.ops for t in program)]
    heads = [p for p, program in enumerate(programs) if any("head" in t.ops for t in program)]
    assert embeds == heads == [0, 3]  # both pipelines' ends: each rank holds stage p and stage pp - 1 - p
    sends = {(t.chunk, t.peer_stage) for t in programs[1] if t.kind == "send" and t.role == "act"}
    assert sends == {(0, 2), (1, 0)}  # down: to the next rank; up: to the previous one
    assert schedule_from_json(schedule_to_json(schedule)) == schedule


def test_the_two_copies_gradients_are_summed_over_the_mirror_group() -> None:
    """Rank p's chunk 0 and rank pp - 1 - p's chunk 1 hold the same layers: one all-reduce of role grad_mirror
    over the pair, before the data-parallel reductions; no other layout has it."""
    schedule = build_schedule(_config())
    mesh = schedule.mesh
    for p, program in enumerate(schedule.stage_programs):
        (mirror,) = [t for t in program if t.role == "grad_mirror"]
        assert mirror.kind == "all_reduce" and mirror.group_axis == "mirror"
        reductions = [t.role for t in program if t.kind == "all_reduce"]
        assert reductions[0] == "grad_mirror"
        rank = mesh.stage_ranks(p)[0]
        assert mesh.group(rank, "mirror") == tuple(sorted({rank, mesh.peer(rank, mesh.pp - 1 - p)}))
        for c in (0, 1):
            twin = schedule.virtual_stage(mesh.pp - 1 - p, 1 - c)
            assert schedule.stage_layers[schedule.virtual_stage(p, c)] == schedule.stage_layers[twin]
    v_layout = build_schedule(_config(schedule="dualpipe-v"))
    assert not [t for program in v_layout.stage_programs for t in program if t.role == "grad_mirror"]


def test_simulated_dualpipe_bubble_is_below_1f1b() -> None:
    def bubble(schedule: str, vpp: int) -> float:
        cfg = load_config(
            "examples/small-moe.yaml", [f"schedule={schedule}", f"parallel.vpp={vpp}", "parallel.pp=4", "parallel.ep=2"]
        )
        return simulate(cfg).report.bubble_fraction

    assert bubble("dualpipe", 2) < bubble("1f1b", 1)
    assert bubble("dualpipe-v", 2) < bubble("1f1b", 1)


def test_memory_model_counts_both_copies_of_the_parameters() -> None:
    model = load_model("small-moe")
    point = PlanPoint(
        pp=4, ep=2, dp=1, vpp=2, micro_batch_size=2, num_microbatches=8, schedule="dualpipe", all_to_all="flat"
    )
    single = PlanPoint(
        pp=4, ep=2, dp=1, vpp=1, micro_batch_size=2, num_microbatches=8, schedule="1f1b", all_to_all="flat"
    )
    dual, base = stage_memory(model, point), stage_memory(model, single)
    assert sum(s.state_bytes for s in dual) == pytest.approx(2 * sum(s.state_bytes for s in base))


# ---------------------------------------------------------------- planner


@pytest.mark.parametrize(
    ("schedule", "pp", "m"),
    [
        ("dualpipe", 2, 4),
        ("dualpipe", 2, 16),
        ("dualpipe", 4, 8),
        ("dualpipe", 4, 24),
        ("dualpipe", 8, 16),
        ("dualpipe", 8, 40),
        ("dualpipe-v", 2, 4),
        ("dualpipe-v", 3, 7),
        ("dualpipe-v", 4, 20),
        ("dualpipe-v", 8, 16),
    ],
)
@pytest.mark.parametrize(("f", "b", "w"), [(1.0, 1.0, 1.0), (1.0, 2.0, 0.5), (2.0, 1.0, 1.0)])
def test_pipeline_time_equals_the_dry_run(schedule: str, pp: int, m: int, f: float, b: float, w: float) -> None:
    """The estimator's per-rank times per microbatch: dualpipe runs one chunk task of each kind on each rank
    (durations f, b, w), dualpipe-v two (f / 2, b / 2, w / 2 each)."""
    point = PlanPoint(
        pp=pp, ep=1, dp=1, vpp=2, micro_batch_size=1, num_microbatches=m, schedule=schedule, all_to_all="flat"
    )
    per_task = 1 if schedule == "dualpipe" else 2
    durations = {"forward": f / per_task, "backward_input": b / per_task, "backward_weight": w / per_task}
    generator = dualpipe if schedule == "dualpipe" else dualpipe_v
    makespan = coarse_timing(generator(pp, 2, m), vpp=2, durations=durations, layout=schedule_layout(schedule)).makespan
    assert pipeline_s(point, [(f, b, w, 0.0)] * pp) == pytest.approx(makespan, rel=1e-9)


def test_a_microbatch_on_the_other_pipelines_chunk_is_reported() -> None:
    programs = dualpipe(2, 2, 4)
    moved = tuple(
        tuple(
            dataclasses.replace(
                t,
                chunk=1,
                task_id=t.task_id.replace(":c0:", ":c1:"),
                deps=tuple(d.replace(":c0:", ":c1:") for d in t.deps),
            )
            if t.microbatch == 0
            else t
            for t in program
        )
        for program in programs
    )
    with pytest.raises(ScheduleError, match="runs microbatch 0 on a chunk of another pipeline"):
        check_coarse(moved, 2, 2, 4, layout=BI)


def test_interleaved_schedule_files_do_not_carry_a_layout() -> None:
    cfg = load_config("examples/small-moe.yaml", [])
    text = schedule_to_json(build_schedule(cfg))
    assert '"layout"' not in text and schedule_from_json(text).layout == Layout.INTERLEAVED
