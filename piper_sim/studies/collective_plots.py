"""Plots and text tables of the collective studies (from study.csv and link_kinds.csv). matplotlib, Agg.

study all-to-all:
- bandwidth.png: bus bandwidth per GPU vs nodes, one panel per message size, one line per algorithm;
- speedup.png: time(flat) / time(algorithm) vs nodes, one line per (algorithm, size) -- above 1 = faster
  than flat (the simulated time includes each GPU posting its messages one after another);
- link_kinds.png: highest utilization of each link kind vs nodes, one panel per algorithm (largest size).
Every title and table names the size convention of the study (study.csv `size_per`: per GPU or per GPU pair).
study collective: bandwidth.png, bus bandwidth against size (nccl-tests' S of the collective, named on the axis),
one panel per GPU count, one line per algorithm.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import yaml  # noqa: E402

from piper_sim.analysis import style  # noqa: E402
from piper_sim.analysis.tables import Col, render  # noqa: E402
from piper_sim.studies.all_to_all import SIZE_PER  # noqa: E402
from piper_sim.studies.collective import COLLECTIVES

KIND_ORDER = list(style.LINK_KIND_COLORS)


def size_per(df: pd.DataFrame) -> str:
    """The study's size convention as words: "per GPU" (each GPU's whole buffer) or "per GPU pair"."""
    return SIZE_PER[str(df["size_per"].iloc[0])]


def _sizes(df: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(df.sort_values("bytes_per_pair")["size"].tolist()))


def study_context(out: Path, what: str = "one all-to-all alone on the machine") -> str:
    """The context line of the study's plots: the model whose buffer it sizes (--model), the machine, the tier."""
    spec = yaml.safe_load((out / "study.yaml").read_text()) if (out / "study.yaml").exists() else {}
    model = (spec.get("moe_buffer") or {}).get("model")
    machine = style.machine_label(spec.get("topology", "topology"))
    return style.context(model, machine, "des", what)


def _busbw_panels(df: pd.DataFrame, panel: str, values: list, x: str) -> tuple[plt.Figure, list]:
    """One panel per value of column `panel`, in each a bus-bandwidth line per algorithm against column x."""
    fig, axes = plt.subplots(1, len(values), figsize=(5.5 * len(values), 4.4), squeeze=False)
    for ax, value in zip(axes[0], values, strict=True):
        for alg, group in df[df[panel] == value].groupby("algorithm", sort=False):
            g = group.sort_values(x)
            ax.plot(g[x], g["busbw_bytes_per_s"] / 1e9, marker="o", color=style.color("algorithm", alg), label=str(alg))
        ax.grid(alpha=0.3)
    return fig, list(axes[0])


def _save(fig: plt.Figure, path: Path, what: str, context_line: str) -> None:
    style.suptitle(fig, what, context_line)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_bandwidth(df: pd.DataFrame, path: Path, context_line: str = "") -> None:
    sizes = _sizes(df)
    fig, axes = _busbw_panels(df, "size", sizes, "nodes")
    for ax, size in zip(axes, sizes, strict=True):
        style.count_axis(ax, list(df["nodes"]))
        ax.set_yscale("log")
        style.plain_log_axis(ax.yaxis)
        ax.set_xlabel("nodes")
        ax.set_ylabel("bus bandwidth per GPU (GB/s)")
        ax.set_title(f"{size} {size_per(df)}", fontsize=10)
        ax.legend()
    _save(fig, path, "all-to-all bus bandwidth per GPU against machine size", context_line)


def speedup_table(df: pd.DataFrame) -> pd.DataFrame:
    """time(flat) / time(alg) per (nodes, size, algorithm); empty without flat rows."""
    merged = with_speedup(df, how="inner")
    return merged[
        [
            "nodes",
            "size",
            "algorithm",
            "time_s",
            "flat_time_s",
            "speedup_vs_flat",
            "messages_per_gpu",
            "serial_overhead_s",
        ]
    ]


def with_speedup(df: pd.DataFrame, how: str) -> pd.DataFrame:
    """The rows with flat_time_s and speedup_vs_flat (time(flat) / time(alg)) at their (nodes, size); how="left"
    keeps rows without a flat run (NaN there)."""
    flat = df[df["algorithm"] == "flat"][["nodes", "size", "time_s"]].rename(columns={"time_s": "flat_time_s"})
    merged = df.merge(flat, on=["nodes", "size"], how=how)
    merged["speedup_vs_flat"] = merged["flat_time_s"] / merged["time_s"]
    return merged


def plot_speedup(df: pd.DataFrame, path: Path, context_line: str = "") -> None:
    table = speedup_table(df)
    sizes = _sizes(df)
    fig, ax = plt.subplots(figsize=(7.5, 4.4))
    for (alg, size), group in table[table["algorithm"] != "flat"].groupby(["algorithm", "size"], sort=False):
        g = group.sort_values("nodes")
        ax.plot(
            g["nodes"],
            g["speedup_vs_flat"],
            marker="o",
            color=style.color("algorithm", alg),
            ls=style.LINE_STYLES[sizes.index(size) % len(style.LINE_STYLES)],
            label=f"{alg} {size}",
        )
    ax.axhline(1.0, color="black", lw=0.8)
    style.count_axis(ax, list(df["nodes"]))
    ax.set_yscale("log")
    style.plain_log_axis(ax.yaxis)
    ax.set_xlabel("nodes")
    ax.set_ylabel("speedup over flat (time flat / time, x)")
    style.title(ax, f"all-to-all speedup over the flat algorithm (sizes {size_per(df)})", context_line)
    ax.grid(alpha=0.3)
    if ax.lines[:-1]:  # lines besides the parity line
        style.legend_outside(ax)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def kind_table(kinds: pd.DataFrame, df: pd.DataFrame) -> pd.DataFrame:
    """Highest utilization per (nodes, algorithm, link kind) at the largest size (wide table)."""
    largest = _sizes(df)[-1]
    k = kinds[kinds["size"] == largest]
    wide = k.pivot_table(index=["nodes", "algorithm"], columns="link_kind", values="max_utilization")
    order = [c for c in KIND_ORDER if c in wide.columns] + [c for c in wide.columns if c not in KIND_ORDER]
    return wide[order].reset_index()


def plot_link_kinds(kinds: pd.DataFrame, df: pd.DataFrame, path: Path, context_line: str = "") -> None:
    table = kind_table(kinds, df)
    algs = list(dict.fromkeys(table["algorithm"].tolist()))
    fig, axes = plt.subplots(1, len(algs), figsize=(5 * len(algs), 4), squeeze=False)
    for ax, alg in zip(axes[0], algs, strict=True):
        t = table[table["algorithm"] == alg].sort_values("nodes")
        for kind in [c for c in table.columns if c not in ("nodes", "algorithm")]:
            if t[kind].notna().any():
                ax.plot(t["nodes"], t[kind] * 100, marker="o", color=style.color("link", kind), label=kind)
        style.count_axis(ax, list(t["nodes"]))
        ax.set_ylim(0, 105)
        ax.set_xlabel("nodes")
        ax.set_ylabel("highest link utilization (%)")
        ax.set_title(f"{alg}, {_sizes(df)[-1]} {size_per(df)}", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    _save(fig, path, "highest link utilization per link kind", context_line)


def markdown(table: pd.DataFrame) -> str:
    """A markdown table; floats with 4 significant digits, missing values blank."""

    def cell(v: object) -> str:
        if isinstance(v, float):
            return "" if v != v else f"{v:.4g}"
        return str(v)

    lines = ["| " + " | ".join(map(str, table.columns)) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines)


def write_plots(out: Path) -> list[Path]:
    """All plots and the markdown tables for the CSVs in `out` (whatever rows they hold)."""
    df = pd.read_csv(out / "study.csv")
    if df.empty:
        return []
    kinds = pd.read_csv(out / "link_kinds.csv")
    paths = [out / "bandwidth.png", out / "speedup.png", out / "link_kinds.png"]
    line = study_context(out)
    plot_bandwidth(df, paths[0], line)
    plot_speedup(df, paths[1], line)
    if not kinds.empty:
        plot_link_kinds(kinds, df, paths[2], line)
    tables, per = out / "tables.md", size_per(df)
    with tables.open("w") as f:
        f.write(
            f"# Speedup over flat (sizes {per})\n\n"
            + markdown(speedup_table(df).rename(columns={"size": f"size {per}"}))
            + "\n\n"
        )
        if not kinds.empty:
            largest = _sizes(df)[-1]
            f.write(
                f"# Highest utilization per link kind ({largest} {per})\n\n" + markdown(kind_table(kinds, df)) + "\n"
            )
    return [p for p in paths if p.exists()] + [tables]


STUDY_COLUMNS = [
    Col("nodes", "nodes", "count"),
    Col("gpus", "GPUs", "count"),
    Col("size", "size"),
    Col("algorithm", "algorithm"),
    Col("time_s", "time", "time"),
    Col("busbw_bytes_per_s", "bus bw per GPU", "GB/s"),
    Col("speedup_vs_flat", "over flat", "x"),
    Col("busiest_link_kind", "busiest link"),
    Col("busiest_utilization", "its utilization", "%"),
    Col("note", "note"),
]


def study_text(out: Path) -> str:
    """The printed table of the study (analysis/tables.py): one row per (nodes, size, algorithm) it ran, with its
    speedup over flat where flat ran; the size header names the convention."""
    df = pd.read_csv(out / "study.csv", keep_default_na=False, na_values=[""])
    if df.empty:
        return ""
    rows = with_speedup(df, how="left").sort_values(["nodes", "bytes_per_pair"], kind="stable").to_dict("records")
    columns = [
        Col(c.key, f"size {size_per(df)}") if c.key == "size" else c
        for c in STUDY_COLUMNS
        if c.key != "note" or ("note" in df and df["note"].notna().any())
    ]
    return render(rows, columns)


def plot_collective(df: pd.DataFrame, path: Path, collective: str, context_line: str = "") -> None:
    """Bus bandwidth against size (nccl-tests' S of the collective), one panel per GPU count, one line per
    algorithm: the curve nccl-tests and rccl-tests print as a table."""
    kind = COLLECTIVES.get(collective, "--collective")
    counts = sorted(df["gpus"].unique().tolist())
    fig, axes = _busbw_panels(df, "gpus", counts, "size_bytes")
    for ax, gpus in zip(axes, counts, strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xlabel(f"size: {kind.size_meaning} (bytes)")
        ax.set_ylabel(f"busbw = algbw x {kind.factor_text} (GB/s)")
        ax.set_title(f"{gpus} GPUs", fontsize=10)
        style.from_zero(ax)
        ax.legend()
    _save(fig, path, f"{collective} bus bandwidth against size, as nccl-tests prints it", context_line)


def write_collective_plots(out: Path) -> list[Path]:
    """bandwidth.png of a collective study (whatever rows study.csv holds)."""
    df = pd.read_csv(out / "study.csv")
    if df.empty:
        return []
    collective = str(df["collective"].iloc[0])
    path = out / "bandwidth.png"
    plot_collective(df, path, collective, study_context(out, f"one {collective} alone on the machine"))
    return [path]
