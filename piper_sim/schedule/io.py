"""Schedule files: JSON (exact round trip) and CSV (one row per rank and task).

Owns the on-disk forms behind `piper-sim schedule export`. Must not import simpy, torch or numpy.

JSON holds everything: name, mesh, vpp, num_microbatches, lowered, layout (when not interleaved), stage_layers
and every Task
field of every stage program (fields equal to their default are left out), so
schedule_from_json(schedule_to_json(s)) == s.

CSV has one row per (rank, task) from Schedule.rank_tasks (global task ids "r<rank>:<local id>",
concrete peers), plus the columns local_id, stage, peer_stage, group_axis and nonblocking that make it
readable back. Lists (ops, deps, peers) are joined with ";". What CSV does not carry: the schedule
name, the mesh shape (dp, ep, tp: pass `mesh`), stage_layers, the layout (pass `layout`), and vpp,
num_microbatches and lowered unless given (otherwise inferred: 1 + the largest chunk and microbatch;
lowered when any kind is not a coarse kind). An op equal to "" cannot be told from no op. The program
of each stage is read from the first rank of that stage; every other rank of the stage must agree with it.
"""

from __future__ import annotations

import csv
import json
from dataclasses import fields
from pathlib import Path
from typing import Any

from piper_sim.errors import PiperError
from piper_sim.schedule.ir import Layout, Schedule, Task, global_task_id
from piper_sim.workload.mesh import Mesh
from piper_sim.workload.task_kinds import COARSE_KINDS

FORMAT = "piper-sim-schedule"
VERSION = 1
CSV_COLUMNS = (
    "rank",
    "stage",
    "task_id",
    "local_id",
    "kind",
    "stream",
    "microbatch",
    "chunk",
    "ops",
    "deps",
    "role",
    "layer",
    "peers",
    "tag",
    "peer_stage",
    "group_axis",
)
OPTIONAL_COLUMNS = ("nonblocking",)  # "1" for a nonblocking collective (ZeRO-3); files without it have none
_TUPLE_FIELDS = ("ops", "deps")
_INT_FIELDS = ("microbatch", "chunk", "layer", "peer_stage")
_TASK_DEFAULTS = {f.name: f.default for f in fields(Task) if f.name != "task_id" and f.name != "kind"}
_TASK_FIELDS = {f.name for f in fields(Task)}


def task_to_dict(task: Task) -> dict:
    """Task fields as JSON values, leaving out fields equal to their default."""
    out: dict = {"task_id": task.task_id, "kind": task.kind}
    for name, default in _TASK_DEFAULTS.items():
        value = getattr(task, name)
        if value != default:
            out[name] = list(value) if name in _TUPLE_FIELDS else value
    return out


def task_from_dict(data: dict) -> Task:
    unknown = set(data) - _TASK_FIELDS
    if unknown:
        raise PiperError(f"schedule file: unknown task field(s) {sorted(unknown)}; allowed: {sorted(_TASK_FIELDS)}")
    values: dict[str, Any] = {k: tuple(v) if k in _TUPLE_FIELDS else v for k, v in data.items()}
    return Task(**values)


def schedule_to_json(schedule: Schedule, *, indent: int | None = None) -> str:
    """The schedule as JSON; "layout" only when it is not the default interleaved one."""
    mesh = schedule.mesh
    layout = {} if schedule.layout == Layout.INTERLEAVED else {"layout": str(schedule.layout)}
    return json.dumps(
        {
            "format": FORMAT,
            "version": VERSION,
            "name": schedule.name,
            "mesh": {
                "pp": mesh.pp,
                "dp": mesh.dp,
                "ep": mesh.ep,
                "tp": mesh.tp,
                "etp": mesh.etp,
                **({"cp": mesh.cp} if mesh.cp > 1 else {}),
                **({"replicate": mesh.replicate} if mesh.replicate > 1 else {}),
            },
            "vpp": schedule.vpp,
            "num_microbatches": schedule.num_microbatches,
            "lowered": schedule.lowered,
            **layout,
            "stage_layers": [list(layers) for layers in schedule.stage_layers],
            "stage_programs": [[task_to_dict(t) for t in program] for program in schedule.stage_programs],
        },
        indent=indent,
    )


def schedule_from_json(text: str) -> Schedule:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise PiperError(f"schedule file: not valid JSON ({error})") from error
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise PiperError(f"schedule file: expected a JSON object with format {FORMAT!r}")
    if data.get("version") != VERSION:
        raise PiperError(f"schedule file: version {data.get('version')!r}; allowed: {VERSION}")
    try:
        return Schedule(
            name=data["name"],
            mesh=Mesh(**data["mesh"]),
            vpp=data["vpp"],
            num_microbatches=data["num_microbatches"],
            lowered=data["lowered"],
            layout=Layout(data.get("layout", Layout.INTERLEAVED)),
            stage_layers=tuple(tuple(layers) for layers in data["stage_layers"]),
            stage_programs=tuple(tuple(task_from_dict(t) for t in program) for program in data["stage_programs"]),
        )
    except (KeyError, TypeError, ValueError) as error:
        raise PiperError(f"schedule file: missing or bad field ({error})") from error


def _csv_row(row: dict, task: Task, stage: int) -> dict:
    return {
        **row,
        "stage": stage,
        "local_id": task.task_id,
        "ops": ";".join(row["ops"]),
        "deps": ";".join(row["deps"]),
        "peers": ";".join(str(p) for p in row["peers"]),
        "peer_stage": task.peer_stage,
        "group_axis": task.group_axis,
        "nonblocking": "1" if task.nonblocking else "",
    }


def schedule_to_csv(schedule: Schedule, path: str | Path) -> None:
    """Write one row per (rank, task), ranks in order, tasks in program order."""
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS + OPTIONAL_COLUMNS)
        writer.writeheader()
        for rank in range(schedule.mesh.num_ranks):
            program = schedule.program(rank)
            stage = schedule.mesh.stage_of(rank)
            for task, row in zip(program, schedule.rank_tasks(rank), strict=True):
                writer.writerow(_csv_row(row, task, stage))


def _split(text: str) -> tuple[str, ...]:
    return tuple(text.split(";")) if text else ()


def _task_from_row(row: dict) -> Task:
    prefix = global_task_id(int(row["rank"]), "")
    deps = tuple(d[len(prefix) :] if d.startswith(prefix) else d for d in _split(row["deps"]))
    return Task(
        task_id=row["local_id"],
        kind=row["kind"],
        ops=_split(row["ops"]),
        deps=deps,
        role=row["role"],
        tag=row["tag"],
        group_axis=row["group_axis"],
        nonblocking=row.get("nonblocking") == "1",
        **{name: int(row[name]) for name in _INT_FIELDS},
    )


def _read_rank_programs(path: str | Path) -> dict[int, list[Task]]:
    programs: dict[int, list[Task]] = {}
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        missing = set(CSV_COLUMNS) - set(reader.fieldnames or ())
        if missing:
            raise PiperError(f"schedule CSV {path}: missing column(s) {sorted(missing)}")
        for row in reader:
            try:
                programs.setdefault(int(row["rank"]), []).append(_task_from_row(row))
            except ValueError as error:
                raise PiperError(f"schedule CSV {path}: bad row {row} ({error})") from error
    return programs


def schedule_from_csv(
    path: str | Path,
    mesh: Mesh,
    *,
    name: str = "",
    vpp: int | None = None,
    num_microbatches: int | None = None,
    lowered: bool | None = None,
    layout: Layout = Layout.INTERLEAVED,
) -> Schedule:
    """Read a CSV written by schedule_to_csv back; see the module docstring for what CSV loses."""
    by_rank = _read_rank_programs(path)
    if sorted(by_rank) != list(range(mesh.num_ranks)):
        raise PiperError(
            f"schedule CSV {path}: ranks {sorted(by_rank)[:8]}... do not match a mesh of {mesh.num_ranks} ranks"
        )
    programs = tuple(tuple(by_rank[mesh.stage_ranks(p)[0]]) for p in range(mesh.pp))
    for rank, tasks in by_rank.items():
        if tuple(tasks) != programs[mesh.stage_of(rank)]:
            raise PiperError(
                f"schedule CSV {path}: rank {rank} runs a different program than the "
                f"first rank of stage {mesh.stage_of(rank)}"
            )
    all_tasks = [t for program in programs for t in program]
    return Schedule(
        name=name,
        mesh=mesh,
        stage_programs=programs,
        layout=layout,
        vpp=vpp if vpp is not None else 1 + max((t.chunk for t in all_tasks), default=0),
        num_microbatches=(
            num_microbatches if num_microbatches is not None else 1 + max((t.microbatch for t in all_tasks), default=0)
        ),
        lowered=lowered if lowered is not None else any(t.kind not in COARSE_KINDS for t in all_tasks),
    )
