"""Writing a run directory: config.yaml, report.json, links.csv, the trace, perfetto.json, plots/*.png.

The one place that writes a run's files; both `simulate` and `run` use it. What is written is chosen by OUTPUTS
(`--outputs`); a progress line with an ETA shows while the files are written (progress.py), its ETA from each
file's measured seconds per trace row (benchmarks/bench_memory.py prints each output's wall time).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import yaml

from piper_sim.analysis.band import band_text
from piper_sim.analysis.links import link_kind_summary
from piper_sim.analysis.plots import plot_link_utilization, plot_timeline
from piper_sim.analysis.run_report import Report, steps_note
from piper_sim.analysis.tables import percent
from piper_sim.config import Config
from piper_sim.errors import ConfigError
from piper_sim.progress import bar as progress_bar
from piper_sim.result import RunResult
from piper_sim.rundir import writing
from piper_sim.trace.perfetto import FILE_NAMES, check_format, first_step_rows, perfetto_row_count, write_perfetto
from piper_sim.trace.runtrace import trace_file, write_trace
from piper_sim.trace.tracks import check_detail, choose_detail, stage_rows

OUTPUTS = {
    "report": "report.json, config.yaml, links.csv and link_kinds.csv",
    "trace": "those and the trace (trace.parquet or trace.csv)",
    "all": "those, the Perfetto trace (--perfetto) and plots/ (the default)",
}
# seconds per row of each file on this machine's 2 shared cores (dense-128 of benchmarks/bench_memory.py, 511k
# rows: trace.parquet 0.3 us, perfetto.json 6 us an event, .json.gz 9 us, .pftrace 12 us, the timeline plot 7 us a
# trace row): only the progress line's ETA reads them, as each file's share of the work
SECONDS_PER_ROW = {"trace": 0.3e-6, "json": 6e-6, "gz": 9e-6, "proto": 12e-6, "timeline": 7e-6}
WRITING_FORMAT = "{desc}: {percentage:3.0f}% [{elapsed}<{remaining}]"


def check_outputs(outputs: str) -> str:
    """outputs, when it is one of OUTPUTS."""
    if outputs not in OUTPUTS:
        raise ConfigError("--outputs", outputs, "; ".join(f"{k}: {v}" for k, v in OUTPUTS.items()))
    return outputs


def check_perfetto(outputs: str, perfetto: str | None) -> str:
    """The Perfetto format a run writes (trace/perfetto.py FORMATS): --perfetto, checked (and what it needs
    installed); json by default with --outputs all, none with report or trace, where another is an error."""
    if perfetto is None:
        return "json" if outputs == "all" else "none"
    if check_format(perfetto) != "none" and outputs != "all":
        raise ConfigError(
            "--perfetto", perfetto, f"none with --outputs {outputs} (a Perfetto trace is written with --outputs all)"
        )
    return perfetto


def write_run(
    out_dir: Path,
    result: RunResult,
    outputs: str = "all",
    *,
    perfetto: str | None = None,
    detail: str = "auto",
    progress: bool = False,
    check: Callable[[], None] | None = None,
) -> dict[str, Path]:
    """Write a run's files (either backend), as OUTPUTS[outputs] says: config.yaml (resolved), report.json, where
    the simulator loaded links links.csv, link_kinds.csv (and with all, plots/link_utilization.png); with trace or
    all the trace; with all the Perfetto trace in the format perfetto names (check_perfetto), at detail (tracks.py
    DETAILS: per rank, or per stage past a size), and plots/timeline.png. progress: a progress line on stderr while
    they are written; check: called between files and chunks of rows (a memory guard's check raises to stop)."""
    works = _works(out_dir, result, check_outputs(outputs), check_perfetto(outputs, perfetto), check_detail(detail))
    out_dir.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    with progress_bar(
        sum(rows * per_row for _, rows, per_row, _ in works),
        "writing outputs",
        show=progress,
        bar_format=WRITING_FORMAT,
    ) as line:
        for key, rows, per_row, write in works:
            line.set_description_str(f"writing {key}", refresh=False)
            if check is not None:
                check()

            def tick(n: int, per_row: float = per_row) -> None:
                line.update(n * per_row)
                if check is not None:
                    check()

            paths.update(write(tick))
            if key not in ("perfetto", "trace"):  # those count their rows as they write them
                line.update(rows * per_row)
    return paths


Work = tuple[str, int, float, Callable[[Callable[[int], None]], dict[str, Path]]]


def _works(out_dir: Path, result: RunResult, outputs: str, perfetto: str, detail: str) -> list[Work]:
    """The files to write as (name, rows it writes, seconds per row, write(on_rows) -> {key: path})."""
    links = result.links
    works: list[Work] = [("report", 0, 0.0, lambda _: _write_report(out_dir, result))]
    if links is not None:
        works.append(("links", 0, 0.0, lambda _: _write_links(out_dir, links, result.context, outputs == "all")))
    if outputs == "report":
        return works  # no rows to write: a simulated run's trace frame is not built (RunResult.trace)
    trace = result.trace
    if outputs in ("trace", "all"):
        works.append(
            (
                "trace",
                len(trace),
                SECONDS_PER_ROW["trace"],
                lambda tick: _write_trace(out_dir, trace, result.config.trace_format, tick),
            )
        )
    rows = perfetto_row_count(trace)
    mesh = result.schedule.mesh
    per_stage = mesh.num_ranks // mesh.pp
    chosen = choose_detail(detail, rows) if per_stage > 1 else "rank"
    if perfetto != "none":
        events = rows // per_stage if chosen == "stage" else rows
        works.append(
            (
                "perfetto",
                events,
                SECONDS_PER_ROW[perfetto],
                lambda tick: _write_perfetto(out_dir, result, perfetto, chosen, per_stage, tick),
            )
        )
    if outputs == "all":
        works.append(
            (
                "timeline",
                first_step_rows(trace) // (per_stage if chosen == "stage" else 1),
                SECONDS_PER_ROW["timeline"],
                lambda _: _write_timeline(out_dir, result, chosen, per_stage),
            )
        )
    return works


def _write_report(out_dir: Path, result: RunResult) -> dict[str, Path]:
    path = out_dir / "report.json"
    with writing(path):
        path.write_text(json.dumps(result.report.to_dict(), indent=2))
    return {"config": write_config(out_dir, result.config), "report": path}


def _write_links(out_dir: Path, links, context: str, plot: bool) -> dict[str, Path]:
    paths = {"links": out_dir / "links.csv", "link_kinds": out_dir / "link_kinds.csv"}
    with writing(paths["links"]):
        links.to_csv(paths["links"], index=False)
    with writing(paths["link_kinds"]):
        link_kind_summary(links).to_csv(paths["link_kinds"], index=False)
    if plot and not links.empty:
        (out_dir / "plots").mkdir(exist_ok=True)
        paths["link_plot"] = out_dir / "plots" / "link_utilization.png"
        with writing(paths["link_plot"]):
            plot_link_utilization(links, paths["link_plot"], context_line=context)
    return paths


def _write_trace(out_dir: Path, trace, fmt: str, tick: Callable[[int], None]) -> dict[str, Path]:
    with writing(trace_file(out_dir, fmt)):
        return {"trace": write_trace(trace, out_dir, fmt, on_rows=tick)}


def _write_perfetto(
    out_dir: Path, result: RunResult, fmt: str, detail: str, per_stage: int, tick: Callable[[int], None]
) -> dict[str, Path]:
    path = out_dir / FILE_NAMES[fmt]
    with writing(path):
        write_perfetto(
            result.trace, path, on_rows=tick, fmt=fmt, detail=detail, ranks_per_stage=per_stage, links=result.links
        )
    return {"perfetto": path}


def _write_timeline(out_dir: Path, result: RunResult, detail: str, per_stage: int) -> dict[str, Path]:
    """The first step's timeline, a row per rank or (detail stage) per pipeline stage."""
    (out_dir / "plots").mkdir(exist_ok=True)
    path = out_dir / "plots" / "timeline.png"
    trace = result.trace
    with writing(path):
        if detail == "stage":
            first = trace[trace["step"] == trace["step"].min()]
            plot_timeline(
                stage_rows(first, per_stage),
                path,
                f"timeline of step 0 by stage: {result.title}",
                result.context,
                track="stage",
            )
        else:
            plot_timeline(trace, path, f"timeline of step 0: {result.title}", result.context)
    return {"timeline": path}


def write_config(out_dir: Path, config: Config) -> Path:
    """config.yaml: the resolved config of a run or an estimate."""
    path = out_dir / "config.yaml"
    with writing(path):
        path.write_text(yaml.safe_dump(config.resolved(), sort_keys=False))
    return path


def write_estimate(out_dir: Path, config: Config, report: dict) -> dict[str, Path]:
    """The estimate tier's files: config.yaml and report.json (no trace or plots: nothing ran)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"config": write_config(out_dir, config), "report": out_dir / "report.json"}
    with writing(paths["report"]):
        paths["report"].write_text(json.dumps(report, indent=2))
    return paths


TIERS = {"des": "discrete-event simulation", "estimate": "the planner's analytic estimate (docs/planning.md)"}


def format_report(report: Report | dict) -> str:
    """A short human summary of a report (or of report.json read back); figures a report has not are left out."""
    if isinstance(report, Report):
        report = report.to_dict()
    gib = 2.0**30
    lines = (
        [f"tier                {report['tier']}: {TIERS.get(report['tier'], report['tier'])}"]
        if report.get("tier")
        else []
    )
    for key, label, show in (
        ("num_gpus", "GPUs", str),
        ("step_time_s", "step time", lambda v: f"{v * 1e3:.3f} ms"),
        ("tokens_per_s", "tokens/s", lambda v: f"{v:,.0f}"),
        ("tflops_per_gpu", "TFLOPS/GPU", lambda v: f"{v:.2f}"),
        ("mfu", "MFU", lambda v: percent(v, 2) + (" of the bf16 peak" if "mfu_fp8_peak" in report else "")),
        ("mfu_fp8_peak", "MFU (fp8 peak)", lambda v: percent(v, 2)),
        ("bubble_fraction", "bubble", percent),
        ("exposed_comm_fraction", "exposed comm", percent),
        ("peak_memory_bytes", "peak memory/stage", lambda v: ", ".join(f"{m / gib:.2f}" for m in v) + " GiB"),
        ("all_to_all_bandwidth_bytes_per_s", "all-to-all bw", lambda v: f"{v / 1e9:.2f} GB/s per GPU"),
    ):
        if report.get(key) is not None:
            lines.append(f"{label:<20}{show(report[key])}")
    if report.get("error_band") is not None:
        lines.append(f"{'error band':<20}{band_text(report['error_band'])}")
    if steps_note(report):
        lines.append(f"{'step time over':<20}{steps_note(report)}")
    if report.get("estimate") is not None:
        e = report["estimate"]
        lines.append(
            f"estimate terms      pipeline {e['pipeline_s'] * 1e3:.3f} ms (bubble {e['bubble_s'] * 1e3:.3f}, "
            f"all-to-all {e['all_to_all_s'] * 1e3:.3f}), gradients {e['grad_reduce_s'] * 1e3:.3f} ms, "
            f"optimizer {e['optimizer_s'] * 1e3:.3f} ms"
        )
    if "memory_headroom_bytes" in report:
        reserve = report.get("framework_reserve_bytes", 0.0) / gib
        lines.append(
            "memory headroom     "
            + ", ".join(f"{h / gib:.2f}" for h in report["memory_headroom_bytes"])
            + f" GiB per stage (HBM less the {reserve:.2f} GiB framework reserve"
            + ("" if all(report["fits_memory"]) else "; DOES NOT FIT")
            + ")"
        )
    if report.get("busiest_link") is not None:
        b = report["busiest_link"]
        lines.append(f"busiest link        {b['link']} ({b['link_kind']}) {percent(b['utilization'])} mean utilization")
    if "sim_wall_s" in report:
        verb = "estimated in" if report.get("tier") == "estimate" else "simulated in"
        lines.append(f"{verb:<20}{report['sim_wall_s']:.2f} s")
    return "\n".join(lines)
