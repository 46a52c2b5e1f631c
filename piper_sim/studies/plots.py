"""Plots and text tables of an all-to-all study (from study.csv and link_kinds.csv). matplotlib, Agg.

- bandwidth.png: bus bandwidth per GPU vs nodes, one panel per message size, one line per algorithm;
- speedup.png: time(flat) / time(algorithm) vs nodes, one line per (algorithm, size) -- above 1 = faster
  than flat (the simulated time includes each GPU posting its messages one after another);
- link_kinds.png: highest utilization of each link kind vs nodes, one panel per algorithm (largest size).
Every title and table names the size convention of the study (study.csv `size_per`: per GPU or per GPU pair).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from piper_sim.studies.all_to_all import SIZE_PER  # noqa: E402

KIND_ORDER = ["xgmi", "nvlink", "intra", "cpu", "gpu_nic", "nic", "local", "global", "up", "down"]


def size_per(df: pd.DataFrame) -> str:
    """The study's size convention as words: "per GPU" (each GPU's whole buffer) or "per GPU pair"."""
    return SIZE_PER[str(df["size_per"].iloc[0])]


def _sizes(df: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(df.sort_values("bytes_per_pair")["size"].tolist()))


def plot_bandwidth(df: pd.DataFrame, path: Path) -> None:
    sizes = _sizes(df)
    fig, axes = plt.subplots(1, len(sizes), figsize=(5 * len(sizes), 4), squeeze=False)
    for ax, size in zip(axes[0], sizes, strict=True):
        for alg, group in df[df["size"] == size].groupby("algorithm", sort=False):
            g = group.sort_values("nodes")
            ax.plot(g["nodes"], g["busbw_bytes_per_s"] / 1e9, marker="o", label=str(alg))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("nodes")
        ax.set_ylabel("bus bandwidth per GPU (GB/s)")
        ax.set_title(f"{size} {size_per(df)}")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def speedup_table(df: pd.DataFrame) -> pd.DataFrame:
    """time(flat) / time(alg) per (nodes, size, algorithm); empty without flat rows."""
    flat = df[df["algorithm"] == "flat"][["nodes", "size", "time_s"]].rename(columns={"time_s": "flat_time_s"})
    merged = df.merge(flat, on=["nodes", "size"])
    merged["speedup_vs_flat"] = merged["flat_time_s"] / merged["time_s"]
    return merged[["nodes", "size", "algorithm", "time_s", "flat_time_s", "speedup_vs_flat", "messages_per_gpu",
                   "serial_overhead_s"]]


def plot_speedup(df: pd.DataFrame, path: Path) -> None:
    table = speedup_table(df)
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for (alg, size), group in table[table["algorithm"] != "flat"].groupby(["algorithm", "size"], sort=False):
        g = group.sort_values("nodes")
        ax.plot(g["nodes"], g["speedup_vs_flat"], marker="o", label=f"{alg} {size}")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("nodes")
    ax.set_ylabel("speedup over flat (time flat / time, x)")
    ax.set_title(f"all-to-all speedup over the flat algorithm (sizes {size_per(df)})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
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


def plot_link_kinds(kinds: pd.DataFrame, df: pd.DataFrame, path: Path) -> None:
    table = kind_table(kinds, df)
    algs = list(dict.fromkeys(table["algorithm"].tolist()))
    fig, axes = plt.subplots(1, len(algs), figsize=(5 * len(algs), 4), squeeze=False)
    for ax, alg in zip(axes[0], algs, strict=True):
        t = table[table["algorithm"] == alg].sort_values("nodes")
        for kind in [c for c in table.columns if c not in ("nodes", "algorithm")]:
            if t[kind].notna().any():
                ax.plot(t["nodes"], t[kind] * 100, marker="o", label=kind)
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 105)
        ax.set_xlabel("nodes")
        ax.set_ylabel("highest link utilization (%)")
        ax.set_title(f"{alg}, {_sizes(df)[-1]} {size_per(df)}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


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
    plot_bandwidth(df, paths[0])
    plot_speedup(df, paths[1])
    if not kinds.empty:
        plot_link_kinds(kinds, df, paths[2])
    tables, per = out / "tables.md", size_per(df)
    with tables.open("w") as f:
        f.write(f"# Speedup over flat (sizes {per})\n\n"
                + markdown(speedup_table(df).rename(columns={"size": f"size {per}"})) + "\n\n")
        if not kinds.empty:
            largest = _sizes(df)[-1]
            f.write(f"# Highest utilization per link kind ({largest} {per})\n\n" + markdown(kind_table(kinds, df))
                    + "\n")
    return [p for p in paths if p.exists()] + [tables]
