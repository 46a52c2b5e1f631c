"""Writing a run directory: config.yaml, report.json, trace, perfetto.json, links.csv, plots/*.png.

The one place that writes a run's files; both `simulate` and `run` use it.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from piper_sim.analysis.band import band_text
from piper_sim.analysis.links import link_kind_summary
from piper_sim.analysis.plots import plot_link_utilization, plot_timeline
from piper_sim.analysis.report import Report, steps_note
from piper_sim.analysis.tables import percent
from piper_sim.config import Config
from piper_sim.result import RunResult
from piper_sim.trace.perfetto import write_perfetto
from piper_sim.trace.runtrace import write_trace


def write_run(out_dir: Path, result: RunResult) -> dict[str, Path]:
    """Write a run's files (either backend): config.yaml (resolved), report.json, the trace, perfetto.json,
    plots/timeline.png, and where the simulator loaded links, links.csv, link_kinds.csv and
    plots/link_utilization.png."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "plots").mkdir(exist_ok=True)
    trace = result.trace
    paths = {"config": write_config(out_dir, result.config), "report": out_dir / "report.json"}
    paths["trace"] = write_trace(trace, out_dir, result.config.trace_format)
    paths["perfetto"] = out_dir / "perfetto.json"
    write_perfetto(trace, paths["perfetto"])
    paths["timeline"] = out_dir / "plots" / "timeline.png"
    plot_timeline(trace, paths["timeline"], f"timeline of step 0: {result.title}", result.context)
    links = result.links
    if links is not None:
        paths["links"] = out_dir / "links.csv"
        links.to_csv(paths["links"], index=False)
        paths["link_kinds"] = out_dir / "link_kinds.csv"
        link_kind_summary(links).to_csv(paths["link_kinds"], index=False)
        if not links.empty:
            paths["link_plot"] = out_dir / "plots" / "link_utilization.png"
            plot_link_utilization(links, paths["link_plot"], context_line=result.context)
    paths["report"].write_text(json.dumps(result.report.to_dict(), indent=2))
    return paths


def write_config(out_dir: Path, config: Config) -> Path:
    """config.yaml: the resolved config of a run or an estimate."""
    path = out_dir / "config.yaml"
    path.write_text(yaml.safe_dump(config.resolved(), sort_keys=False))
    return path


def write_estimate(out_dir: Path, config: Config, report: dict) -> dict[str, Path]:
    """The estimate tier's files: config.yaml and report.json (no trace or plots: nothing ran)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"config": write_config(out_dir, config), "report": out_dir / "report.json"}
    paths["report"].write_text(json.dumps(report, indent=2))
    return paths


TIERS = {"des": "discrete-event simulation", "estimate": "the planner's analytic estimate (docs/planning.md)"}


def format_report(report: Report | dict) -> str:
    """A short human summary of a report (or of report.json read back); figures a report has not are left out."""
    if isinstance(report, Report):
        report = report.to_dict()
    gib = 2.0**30
    lines = [f"tier                {report['tier']}: {TIERS.get(report['tier'], report['tier'])}"] \
        if report.get("tier") else []
    for key, label, show in (
            ("num_gpus", "GPUs", str),
            ("step_time_s", "step time", lambda v: f"{v * 1e3:.3f} ms"),
            ("tokens_per_s", "tokens/s", lambda v: f"{v:,.0f}"),
            ("tflops_per_gpu", "TFLOPS/GPU", lambda v: f"{v:.2f}"),
            ("mfu", "MFU", lambda v: percent(v, 2)),
            ("bubble_fraction", "bubble", percent),
            ("exposed_comm_fraction", "exposed comm", percent),
            ("peak_memory_bytes", "peak memory/stage", lambda v: ", ".join(f"{m / gib:.2f}" for m in v) + " GiB"),
            ("all_to_all_bandwidth_bytes_per_s", "all-to-all bw", lambda v: f"{v / 1e9:.2f} GB/s per GPU")):
        if report.get(key) is not None:
            lines.append(f"{label:<20}{show(report[key])}")
    if report.get("error_band") is not None:
        lines.append(f"{'error band':<20}{band_text(report['error_band'])}")
    if steps_note(report):
        lines.append(f"{'step time over':<20}{steps_note(report)}")
    if report.get("estimate") is not None:
        e = report["estimate"]
        lines.append(f"estimate terms      pipeline {e['pipeline_s'] * 1e3:.3f} ms (bubble {e['bubble_s'] * 1e3:.3f}, "
                     f"all-to-all {e['all_to_all_s'] * 1e3:.3f}), gradients {e['grad_reduce_s'] * 1e3:.3f} ms, "
                     f"optimizer {e['optimizer_s'] * 1e3:.3f} ms")
    if "memory_headroom_bytes" in report:
        reserve = report.get("framework_reserve_bytes", 0.0) / gib
        lines.append("memory headroom     " + ", ".join(f"{h / gib:.2f}" for h in report["memory_headroom_bytes"])
                     + f" GiB per stage (HBM less the {reserve:.2f} GiB framework reserve"
                     + ("" if all(report["fits_memory"]) else "; DOES NOT FIT") + ")")
    if report.get("busiest_link") is not None:
        b = report["busiest_link"]
        lines.append(f"busiest link        {b['link']} ({b['link_kind']}) "
                     f"{percent(b['utilization'])} mean utilization")
    if "sim_wall_s" in report:
        verb = "estimated in" if report.get("tier") == "estimate" else "simulated in"
        lines.append(f"{verb:<20}{report['sim_wall_s']:.2f} s")
    return "\n".join(lines)
