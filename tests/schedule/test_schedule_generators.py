"""Schedule generators, validation, dry runs, grid rendering and schedule files."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from piper_sim.errors import ConfigError, PiperError
from piper_sim.schedule.generator_registry import SCHEDULES, schedule_layout
from piper_sim.schedule.generators import gpipe, interleaved_one_f_one_b, one_f_one_b, zb_h1
from piper_sim.schedule.grid import render_grid
from piper_sim.schedule.io import schedule_from_csv, schedule_from_json, schedule_to_csv, schedule_to_json
from piper_sim.schedule.ir import Schedule, Task, VirtualStages, coarse_task_id
from piper_sim.schedule.validate import (
    ScheduleError,
    check_coarse,
    check_lowered,
    coarse_timing,
    dry_run,
    dry_run_coarse,
    max_in_flight,
)
from piper_sim.workload.mesh import Mesh

PAPER_UNITS = {"forward": 1, "backward": 2}
SPLIT_UNITS = {"forward": 1, "backward_input": 1, "backward_weight": 1}
GRID = [(pp, vpp, m) for pp in (1, 2, 3, 4, 8) for vpp in (1, 2, 3) for m in (1, 2, 4, 8, 16)]


def _supported(name: str, pp: int, vpp: int, m: int) -> bool:
    if name in ("1f1b", "zb-h1"):
        return vpp == 1
    if name == "interleaved-1f1b":
        return vpp > 1 and m % pp == 0
    if name == "dualpipe":
        return pp % 2 == 0 and vpp == 2 and m % 2 == 0 and m >= 2 * pp
    if name == "dualpipe-v":
        return vpp == 2 and m >= 2 * pp
    return True


def _bubble_per_microbatch_work(programs, pp: int, vpp: int, m: int, durations: dict) -> float:
    """Idle time of a stage in units of one full-stage forward + backward (vpp chunk works)."""
    makespan = dry_run_coarse(programs, pp, vpp, m, durations=durations)
    work_per_chunk = sum(durations.values())
    return (makespan - m * vpp * work_per_chunk) / (vpp * work_per_chunk)


# ---------------------------------------------------------------- generators


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "dualpipe", "dualpipe-v"])
@pytest.mark.parametrize(("pp", "vpp", "m"), GRID)
def test_generators_validate_and_run_without_deadlock(name: str, pp: int, vpp: int, m: int) -> None:
    generator = SCHEDULES.get(name)
    if not _supported(name, pp, vpp, m):
        with pytest.raises(ConfigError):
            generator(pp, vpp, m)
        return
    programs = generator(pp, vpp, m)
    layout = schedule_layout(name)
    check_coarse(programs, pp, vpp, m, layout=layout)
    tasks_per_chunk = 3 if name in ("zb-h1", "dualpipe", "dualpipe-v") else 2
    chunks_per_microbatch = vpp // VirtualStages(layout, pp, vpp).num_pipelines  # dualpipe: one per rank
    assert [len(p) for p in programs] == [tasks_per_chunk * chunks_per_microbatch * m] * pp
    assert dry_run_coarse(programs, pp, vpp, m, layout=layout) >= tasks_per_chunk * chunks_per_microbatch * m


def test_coarse_tasks_follow_the_ir() -> None:
    programs = zb_h1(2, 1, 2)
    w = next(t for t in programs[0] if t.kind == "backward_weight")
    b = next(t for t in programs[0] if t.kind == "backward_input" and t.microbatch == w.microbatch)
    assert w.deps == (b.task_id,) and b.deps == (coarse_task_id("forward", 0, w.microbatch),)
    assert all(t.task_id == coarse_task_id(t.kind, t.chunk, t.microbatch) for p in programs for t in p)


@pytest.mark.parametrize(
    ("name", "pp", "vpp", "m", "key"),
    [
        ("interleaved-1f1b", 4, 1, 8, "parallel.vpp"),
        ("interleaved-1f1b", 4, 2, 6, "parallel.num_microbatches"),
        ("1f1b", 4, 2, 8, "parallel.vpp"),
        ("zb-h1", 4, 2, 8, "parallel.vpp"),
        ("gpipe", 0, 1, 8, "parallel.pp"),
        ("1f1b", 4, 1, 0, "parallel.num_microbatches"),
    ],
)
def test_unsupported_parameters_raise_config_error(name: str, pp: int, vpp: int, m: int, key: str) -> None:
    with pytest.raises(ConfigError) as error:
        SCHEDULES.get(name)(pp, vpp, m)
    assert error.value.key == key


@pytest.mark.parametrize("pp", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("m", [1, 2, 4, 8, 16])
def test_1f1b_and_gpipe_makespan_closed_form(pp: int, m: int) -> None:
    for generator in (gpipe, one_f_one_b):
        makespan = dry_run_coarse(generator(pp, 1, m), pp, 1, m, durations=PAPER_UNITS)
        assert makespan == (m + pp - 1) * (1 + 2)


@pytest.mark.parametrize(("pp", "m"), [(p, m) for p in (1, 2, 3, 4, 8) for m in (1, 2, 4, 8, 16)])
def test_in_flight_activations(pp: int, m: int) -> None:
    for stage, program in enumerate(one_f_one_b(pp, 1, m)):
        assert max_in_flight(program) == min(pp - stage, m)
    for stage, program in enumerate(zb_h1(pp, 1, m)):
        assert max_in_flight(program) <= pp - stage
    assert all(max_in_flight(program) == m for program in gpipe(pp, 1, m))


@pytest.mark.parametrize(("pp", "vpp", "m"), [(p, v, m) for p in (2, 4, 8) for v in (2, 3) for m in (8, 16)])
def test_interleaved_bubble_is_1f1b_bubble_over_vpp(pp: int, vpp: int, m: int) -> None:
    bubble = _bubble_per_microbatch_work(interleaved_one_f_one_b(pp, vpp, m), pp, vpp, m, PAPER_UNITS)
    assert bubble == pytest.approx((pp - 1) / vpp)
    assert _bubble_per_microbatch_work(one_f_one_b(pp, 1, m), pp, 1, m, PAPER_UNITS) == pp - 1


@pytest.mark.parametrize(("pp", "m"), [(p, m) for p in (2, 3, 4, 8) for m in (1, 2, 4, 8, 16)])
def test_zb_h1_bubble_smaller_than_1f1b(pp: int, m: int) -> None:
    zb = _bubble_per_microbatch_work(zb_h1(pp, 1, m), pp, 1, m, SPLIT_UNITS)
    assert zb < _bubble_per_microbatch_work(one_f_one_b(pp, 1, m), pp, 1, m, PAPER_UNITS)
    if m >= pp:  # Qi et al. 2023: bubble (p - 1)(t_F + t_B - t_W), a third of 1F1B's with equal times
        assert zb * 3 == pytest.approx(pp - 1)


def test_gpipe_interleaves_chunks_with_smaller_bubble() -> None:
    assert _bubble_per_microbatch_work(gpipe(4, 2, 8), 4, 2, 8, PAPER_UNITS) == pytest.approx(3 / 2)


@pytest.mark.parametrize(
    ("name", "vpp"),
    [("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2), ("zb-h1", 1), ("dualpipe", 2), ("dualpipe-v", 2)],
)
def test_large_dry_run(name: str, vpp: int) -> None:
    programs = SCHEDULES.get(name)(32, vpp, 128)
    makespan = dry_run_coarse(programs, 32, vpp, 128, layout=schedule_layout(name))
    if name == "1f1b":
        assert makespan == (128 + 31) * 2


# ---------------------------------------------------------------- bad schedules


def test_missing_backward_raises_with_grid() -> None:
    programs = one_f_one_b(2, 1, 2)
    broken = (programs[0], tuple(t for t in programs[1] if t.task_id != "B:c0:m1"))
    with pytest.raises(ScheduleError) as error:
        check_coarse(broken, 2, 1, 2)
    message = str(error.value)
    assert "B:c0:m1 (backward) appears 0 times" in message
    assert "stage 0 | F0 F1 .  B0" in message and "stage 1 | .  F0 B0 F1" in message
    assert "stage 0 stuck: B:c0:m1 waits for B:c0:m1 on stage 1" in message


def test_dep_pointing_later_raises_with_grid() -> None:
    program = one_f_one_b(1, 1, 2)[0]  # F0 B0 F1 B1
    swapped = (program[1], program[0], *program[2:])
    with pytest.raises(ScheduleError) as error:
        check_coarse((swapped,), 1, 1, 2)
    message = str(error.value)
    assert "depends on F:c0:m0 which comes later" in message
    assert "stage 0 |" in message and "stage 0 stuck: B:c0:m0 waits for F:c0:m0 (same stage)" in message


def test_deadlocking_order_raises() -> None:
    f, b = ("forward", "backward")
    order = [(f, 0), (b, 0), (f, 1), (b, 1)]
    stage0 = tuple(
        Task(
            task_id=coarse_task_id(k, 0, mb),
            kind=k,
            chunk=0,
            microbatch=mb,
            deps=() if k == f else (coarse_task_id(f, 0, mb),),
        )
        for k, mb in order
    )
    stage1 = (stage0[2], stage0[3], stage0[0], stage0[1])
    check_coarse((stage0, stage1), 2, 1, 2)
    with pytest.raises(ScheduleError, match="deadlock") as error:
        dry_run_coarse((stage0, stage1), 2, 1, 2)
    assert "stage 1 stuck: F:c0:m1 waits for F:c0:m1 on stage 0" in str(error.value)


# ---------------------------------------------------------------- grid


GOLDEN_1F1B_PP4_M8 = """\
stage 0 | F0 F1 F2 F3 .  .  .  B0 F4 B1 F5 B2 F6 B3 F7 B4 .  B5 .  B6 .  B7
stage 1 | .  F0 F1 F2 .  .  B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 .  B6 .  B7 .
stage 2 | .  .  F0 F1 .  B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 .  B7 .  .
stage 3 | .  .  .  F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7 .  .  ."""


def test_grid_1f1b_golden() -> None:
    # By hand: stage 3 runs F0 at t=3 and B0 at t=4; B0 climbs one stage per step (stage 0 at t=7);
    # 1F1B then alternates, and the last backward leaves stage 0 at t=21: 22 = (8 + 4 - 1) * 2 steps.
    assert render_grid(one_f_one_b(4, 1, 8)) == GOLDEN_1F1B_PP4_M8


def test_grid_chunks_durations_and_truncation() -> None:
    grid = render_grid(interleaved_one_f_one_b(2, 2, 2), max_width=200)
    assert grid.splitlines()[0].startswith("stage 0 | F0.0 F1.0 F0.1 F1.1")
    paper = render_grid(one_f_one_b(2, 1, 2), durations=PAPER_UNITS)
    assert paper.splitlines() == ["stage 0 | F0 F1 .  .  B0 B0 .  B1 B1", "stage 1 | .  F0 B0 B0 F1 B1 B1 .  ."]
    short = render_grid(one_f_one_b(4, 1, 8), max_width=40)
    assert all(len(line) <= 40 and line.endswith("...") for line in short.splitlines())
    assert short.splitlines()[0] == "stage 0 | F0 F1 F2 F3 .  .  .  B0 F4 ..."


def test_coarse_timing_rows_match_grid() -> None:
    timing = coarse_timing(one_f_one_b(4, 1, 8))
    assert timing.makespan == 22 and not timing.deadlocked
    assert timing.starts[3][:2] == (3, 4)


# ---------------------------------------------------------------- lowered schedules


def _lower_p2p(programs, pp: int, vpp: int) -> tuple[tuple[Task, ...], ...]:
    """A minimal p2p lowering for tests: recv right before a compute, send right after it."""
    num_virtual = pp * vpp
    lowered = []
    for stage, program in enumerate(programs):
        out: list[Task] = []
        for task in program:
            virtual, mb = task.chunk * pp + stage, task.microbatch
            source = virtual - 1 if task.kind == "forward" else virtual + 1
            if task.kind != "backward_weight" and 0 <= source < num_virtual:
                tag = f"{task.kind[0]}:v{virtual}:m{mb}"
                out.append(
                    Task(
                        task_id=f"recv:{tag}",
                        kind="recv",
                        microbatch=mb,
                        chunk=task.chunk,
                        peer_stage=source % pp,
                        tag=tag,
                        role="act",
                    )
                )
                task = dataclasses.replace(task, deps=(*task.deps, f"recv:{tag}"))
            out.append(task)
            target = virtual + 1 if task.kind == "forward" else virtual - 1
            if task.kind != "backward_weight" and 0 <= target < num_virtual:
                tag = f"{task.kind[0]}:v{target}:m{mb}"
                out.append(
                    Task(
                        task_id=f"send:{tag}",
                        kind="send",
                        microbatch=mb,
                        chunk=task.chunk,
                        peer_stage=target % pp,
                        tag=tag,
                        role="act",
                        deps=(task.task_id,),
                    )
                )
        lowered.append(tuple(out))
    return tuple(lowered)


@pytest.mark.parametrize(
    ("name", "pp", "vpp", "m"),
    [
        ("gpipe", 4, 1, 8),
        ("1f1b", 4, 1, 8),
        ("1f1b", 3, 1, 2),
        ("interleaved-1f1b", 4, 2, 8),
        ("zb-h1", 4, 1, 8),
        ("gpipe", 2, 3, 4),
        ("1f1b", 32, 1, 128),
    ],
)
def test_lowered_dry_run_matches_coarse(name: str, pp: int, vpp: int, m: int) -> None:
    coarse = SCHEDULES.get(name)(pp, vpp, m)
    schedule = Schedule(
        name=name,
        mesh=Mesh(pp=pp, ep=2),
        vpp=vpp,
        num_microbatches=m,
        stage_programs=_lower_p2p(coarse, pp, vpp),
        lowered=True,
    )
    check_lowered(schedule)
    assert dry_run(schedule) == dry_run_coarse(coarse, pp, vpp, m)
    assert dry_run(schedule, PAPER_UNITS) == dry_run_coarse(coarse, pp, vpp, m, durations=PAPER_UNITS)


def _moe_schedule() -> Schedule:
    """Two stages, ep = 2: forward with an all-to-all, activations and gradients over p2p."""
    stage0 = (
        Task(task_id="F0", kind="forward", microbatch=0, chunk=0, ops=("embed", "attn:0", "router:0")),
        Task(
            task_id="a2a",
            kind="all_to_all",
            microbatch=0,
            chunk=0,
            role="dispatch",
            layer=0,
            group_axis="ep",
            deps=("F0",),
        ),
        Task(task_id="FE0", kind="forward_expert", microbatch=0, chunk=0, ops=("experts:0",), deps=("a2a",)),
        Task(task_id="send", kind="send", microbatch=0, chunk=0, role="act", peer_stage=1, tag="act:m0", deps=("FE0",)),
        Task(task_id="recv", kind="recv", microbatch=0, chunk=0, role="grad", peer_stage=1, tag="grad:m0"),
        Task(task_id="B0", kind="backward", microbatch=0, chunk=0, deps=("recv", "F0")),
    )
    stage1 = (
        Task(task_id="recv", kind="recv", microbatch=0, chunk=0, role="act", peer_stage=0, tag="act:m0"),
        Task(task_id="F0", kind="forward", microbatch=0, chunk=0, ops=("head",), deps=("recv",)),
        Task(task_id="B0", kind="backward", microbatch=0, chunk=0, ops=("head",), deps=("F0",)),
        Task(
            task_id="send", kind="send", microbatch=0, chunk=0, role="grad", peer_stage=0, tag="grad:m0", deps=("B0",)
        ),
        Task(task_id="ar", kind="all_reduce", role="grad_dense", group_axis="dp", deps=("B0",)),
    )
    return Schedule(
        name="moe",
        mesh=Mesh(pp=2, ep=2),
        vpp=1,
        num_microbatches=1,
        lowered=True,
        stage_programs=(stage0, stage1),
        stage_layers=((0,), (1,)),
    )


def test_lowered_dry_run_with_collectives() -> None:
    schedule = _moe_schedule()
    check_lowered(schedule)
    # stage 0: F0 [0,1], all-to-all at 1, FE0 [1,2], send at 2; stage 1: F0 [2,3], B0 [3,4]; B0 [4,5].
    assert dry_run(schedule) == 5
    assert (
        dry_run(schedule, {"forward": 1, "forward_expert": 1, "backward": 2, "all_to_all": 0.5, "send": 0.25})
        == 1 + 0.5 + 1 + 0.25 + 1 + 2 + 0.25 + 2
    )
    assert render_grid(schedule).splitlines() == ["stage 0 | F0 F0 .  .  B0", "stage 1 | .  .  F0 B0 ."]


def test_lowered_deadlock_and_mismatched_tags() -> None:
    schedule = _moe_schedule()
    stage0 = schedule.stage_programs[0]
    late_send = (stage0[0], stage0[1], stage0[2], stage0[4], stage0[5], stage0[3])  # B0 before send act
    deadlock = dataclasses.replace(schedule, stage_programs=(late_send, schedule.stage_programs[1]))
    check_lowered(deadlock)
    with pytest.raises(ScheduleError, match="deadlock") as error:
        dry_run(deadlock)
    assert "rank 0 stuck: B0 waits for recv" in str(error.value)
    assert "rank 2 stuck: F0 waits for recv" in str(error.value)
    bad_tag = dataclasses.replace(stage0[3], tag="act:m9")
    mismatched = dataclasses.replace(
        schedule, stage_programs=((*stage0[:3], bad_tag, *stage0[4:]), schedule.stage_programs[1])
    )
    with pytest.raises(ScheduleError, match="tag 'act:m9'") as error:
        check_lowered(mismatched)
    assert "rank 0 | F0 F0" in str(error.value)


# ---------------------------------------------------------------- files


def test_json_round_trip() -> None:
    for schedule in (
        _moe_schedule(),
        Schedule(name="zb-h1", mesh=Mesh(pp=4, dp=2, ep=2), vpp=1, num_microbatches=8, stage_programs=zb_h1(4, 1, 8)),
    ):
        assert schedule_from_json(schedule_to_json(schedule)) == schedule
    with pytest.raises(PiperError, match="format"):
        schedule_from_json("{}")


def test_csv_round_trip(tmp_path) -> None:
    schedule = _moe_schedule()
    path = tmp_path / "schedule.csv"
    schedule_to_csv(schedule, path)
    lines = path.read_text().splitlines()
    assert len(lines) == 1 + schedule.num_tasks()
    assert lines[1].startswith("0,0,r0:F0,F0,forward,compute,0,0,embed;attn:0;router:0,")
    back = schedule_from_csv(path, schedule.mesh, name="moe")
    assert back == dataclasses.replace(schedule, stage_layers=())
    coarse = Schedule(
        name="", mesh=Mesh(pp=2, ep=2), vpp=2, num_microbatches=4, stage_programs=interleaved_one_f_one_b(2, 2, 4)
    )
    schedule_to_csv(coarse, path)
    assert schedule_from_csv(path, coarse.mesh) == coarse


def test_schedule_layer_imports_nothing_that_runs() -> None:
    code = (
        "import sys, piper_sim.schedule.generators, piper_sim.schedule.validate, "
        "piper_sim.schedule.grid, piper_sim.schedule.io; "
        "print(sorted({'numpy', 'simpy', 'torch'} & set(sys.modules)))"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    assert out.stdout.strip() == "[]"
