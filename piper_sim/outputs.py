"""Writing a run directory: config.yaml, report.json, trace, perfetto.json, links.csv, plots/*.png.

The one place that writes a run's files; both `simulate` and `run` use it.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from piper_sim.analysis.links import link_kind_summary
from piper_sim.analysis.plots import plot_link_utilization, plot_timeline
from piper_sim.analysis.report import Report
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
    paths = {"config": out_dir / "config.yaml", "report": out_dir / "report.json"}
    paths["config"].write_text(yaml.safe_dump(result.config.resolved(), sort_keys=False))
    paths["trace"] = write_trace(trace, out_dir, result.config.trace_format)
    paths["perfetto"] = out_dir / "perfetto.json"
    write_perfetto(trace, paths["perfetto"])
    paths["timeline"] = out_dir / "plots" / "timeline.png"
    plot_timeline(trace, paths["timeline"], result.title)
    links = result.links
    if links is not None:
        paths["links"] = out_dir / "links.csv"
        links.to_csv(paths["links"], index=False)
        paths["link_kinds"] = out_dir / "link_kinds.csv"
        link_kind_summary(links).to_csv(paths["link_kinds"], index=False)
        if not links.empty:
            paths["link_plot"] = out_dir / "plots" / "link_utilization.png"
            plot_link_utilization(links, paths["link_plot"])
    paths["report"].write_text(json.dumps(result.report.to_dict(), indent=2))
    return paths


def format_report(report: Report | dict) -> str:
    """A short human summary of a report (or of report.json read back)."""
    if isinstance(report, Report):
        report = report.to_dict()
    gib = 2.0**30
    lines = [
        f"GPUs                {report['num_gpus']}",
        f"step time           {report['step_time_s'] * 1e3:.3f} ms",
        f"tokens/s            {report['tokens_per_s']:,.0f}",
        f"TFLOPS/GPU          {report['tflops_per_gpu']:.2f}",
        f"MFU                 {report['mfu'] * 100:.2f} %",
        f"bubble              {report['bubble_fraction'] * 100:.1f} %",
        f"exposed comm        {report['exposed_comm_fraction'] * 100:.1f} %",
        "peak memory/stage   " + ", ".join(f"{m / gib:.2f}" for m in report["peak_memory_bytes"]) + " GiB",
        f"all-to-all bw       {report['all_to_all_bandwidth_bytes_per_s'] / 1e9:.2f} GB/s per GPU",
    ]
    if "memory_headroom_bytes" in report:
        lines.append("memory headroom     " + ", ".join(f"{h / gib:.2f}" for h in report["memory_headroom_bytes"])
                     + " GiB per stage (HBM less the framework reserve" + ("" if all(report["fits_memory"])
                                                                          else "; DOES NOT FIT") + ")")
    if "busiest_link" in report:
        b = report["busiest_link"]
        lines.append(f"busiest link        {b['link']} ({b['link_kind']}) "
                     f"{b['utilization'] * 100:.1f} % mean utilization")
    if "sim_wall_s" in report:
        lines.append(f"simulated in        {report['sim_wall_s']:.2f} s")
    return "\n".join(lines)
