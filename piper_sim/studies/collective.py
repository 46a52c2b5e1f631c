"""The collective study: one collective alone on the machine (all-reduce, all-gather, reduce-scatter, all-to-all,
broadcast) over GPU counts, sizes and algorithms, its time and bandwidths as nccl-tests and rccl-tests print them.

Owns the collectives' conventions (COLLECTIVES), the study spec and its rows; the loop, the result store, the
machine and the CSVs are the studies' shared ones (piper_sim.studies.collective_sweep). Must not import torch.

A size is nccl-tests' S of each operation (NVIDIA/nccl-tests doc/PERFORMANCE.md): all-reduce, each rank's buffer;
all-gather, the gathered buffer on each rank (recvcount x n: each rank sends S / n); reduce-scatter, each rank's input
buffer (it keeps S / n); all-to-all, each rank's send buffer (n blocks of S / n, its own included); broadcast, the
root's buffer (root: member 0). algbw = S / time; busbw = algbw x 2 (n - 1) / n (all-reduce), (n - 1) / n
(all-gather, reduce-scatter, all-to-all), 1 (broadcast). The all-to-all is timed without the split-size exchange
that `study all-to-all` adds (nccl-tests' alltoall_perf moves fixed-size blocks). GPUs are placed as --placement
says on as many nodes as they need (the first node filled first).
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from piper_sim.analysis.tables import Col, render
from piper_sim.collectives.algorithms import (
    ALL_GATHER,
    ALL_REDUCE,
    ALL_TO_ALL,
    BROADCAST,
    MEASURED_ALGORITHMS,
    REDUCE_SCATTER,
    Phase,
    data_phases,
)
from piper_sim.errors import ConfigError
from piper_sim.points.keys import KeyedPoint, keyed_point
from piper_sim.points.store import ResultStore
from piper_sim.registry import Registry
from piper_sim.studies.all_to_all import HOST_EQUIVARIANT
from piper_sim.studies.collective_sweep import (
    KIND_FIELDS,
    Log,
    MachineSpec,
    parse_size,
    point,
    routing_fields,
    run_sweep,
    stderr_log,
    study_machine,
    write_sweep,
)
from piper_sim.studies.prepcache import PreparedCache
from piper_sim.topology.graph import Topology


@dataclass(frozen=True)
class Collective:
    """A collective as nccl-tests measures it: its algorithms, what its size is, its bus-bandwidth factor."""

    name: str
    algorithms: Registry
    size_meaning: str  # what S is, for table headers and study.yaml
    factor_text: str  # busbw = algbw x this
    factor: Callable[[int], float]
    host_equivariant: frozenset[str] = frozenset()  # algorithms whose phases map onto themselves when hosts swap

    def phases(self, algorithm: str, size_bytes: float, members: list[str], topo: Topology) -> list[Phase]:
        """The algorithm's phases for a collective of nccl-tests' size S over the members."""
        if self.algorithms is ALL_TO_ALL:
            n = len(members)
            return data_phases(ALL_TO_ALL.get(algorithm), np.full((n, n), size_bytes / n), members, topo)
        return self.algorithms.get(algorithm)(size_bytes, members, topo)


COLLECTIVES: Registry[Collective] = Registry("collective")
for _c in (
    Collective("all_reduce", ALL_REDUCE, "each rank's buffer", "2(n-1)/n", lambda n: 2 * (n - 1) / n),
    Collective("all_gather", ALL_GATHER, "the gathered buffer per rank", "(n-1)/n", lambda n: (n - 1) / n),
    Collective("reduce_scatter", REDUCE_SCATTER, "the input buffer per rank", "(n-1)/n", lambda n: (n - 1) / n),
    Collective(
        "all_to_all", ALL_TO_ALL, "the send buffer per rank", "(n-1)/n", lambda n: (n - 1) / n, HOST_EQUIVARIANT
    ),
    Collective("broadcast", BROADCAST, "the root's buffer", "1", lambda n: 1.0),
):
    COLLECTIVES.register(_c.name)(_c)

STUDY_COLUMNS = [
    "collective",
    "gpus",
    "nodes",
    "size",
    "size_bytes",
    "algorithm",
    "routing",
    "valiant",
    "time_s",
    "algbw_bytes_per_s",
    "busbw_bytes_per_s",
    "busbw_factor",
    "busiest_link",
    "busiest_link_kind",
    "busiest_utilization",
    "saturated_kinds",
    "messages_per_gpu",
    "serial_overhead_s",
    "pairs",
    "network_flows",
    "simulated_flows",
    "simulated_links",
    "solves",
    "prepare_s",
    "simulate_s",
    "note",
]
KIND_COLUMNS = ["gpus", "size", "algorithm", *KIND_FIELDS]


def machine_algorithms(collective: str, topo: Topology) -> list[str]:
    """The collective's algorithms this machine can run: those needing a library's measured parameters only where
    the machine gives them (topology.collectives)."""
    return [
        a
        for a in COLLECTIVES.get(collective, "--collective").algorithms.names()
        if a not in MEASURED_ALGORITHMS or a in topo.collectives
    ]


@dataclass(frozen=True, kw_only=True)
class CollectiveSpec(MachineSpec):
    collective: str
    gpus: tuple[int, ...]
    sizes: tuple[str, ...]  # as given (labels), parsed with parse_size
    algorithms: tuple[str, ...]

    @property
    def kind(self) -> Collective:
        return COLLECTIVES.get(self.collective, "--collective")

    def check(self) -> None:
        for alg in self.algorithms:
            self.kind.algorithms.get(alg, "--algorithms")
        for n in self.gpus:
            if n < 2:
                raise ConfigError("--gpus", n, "at least 2 GPUs (a collective needs two ranks)")
        for s in self.sizes:
            parse_size(s)
        self.check_machine()
        topo, _ = self.build(min(self.gpus))  # topology parameters (--set) checked before the first run
        runnable = machine_algorithms(self.collective, topo)
        for alg in self.algorithms:
            if alg not in runnable:
                raise ConfigError(
                    "--algorithms",
                    alg,
                    f"one the machine has parameters for: {', '.join(runnable)} "
                    f"(topology.collectives.{alg} is not given)",
                )

    def keyed(self, gpus: int, algorithm: str, size: str) -> KeyedPoint:
        return keyed_point(
            {
                "study": "collective",
                "collective": self.collective,
                **self.machine_fields(),
                "gpus": gpus,
                "algorithm": algorithm,
                "bytes": parse_size(size),
                "size": size,
            }
        )

    def machines(self) -> tuple[int, ...]:
        return self.gpus

    def where(self, gpus: int) -> str:
        return f"{gpus} GPUs"

    def build(self, gpus: int) -> tuple[Topology, list[str]]:
        return study_machine(self, gpus=gpus)

    def rows(
        self, topo: Topology, gpus: list[str], algorithm: str, cache: PreparedCache, machine: int, sizes: list[str]
    ) -> Iterator[tuple[dict, list[dict]]]:
        n, kind = len(gpus), self.kind
        head = {
            "collective": self.collective,
            "gpus": n,
            "nodes": len({topo.host_of(g) for g in gpus}),
            "algorithm": algorithm,
            **routing_fields(self, topo),
        }
        for label in sizes:
            size = parse_size(label)
            yield point(
                cache,
                kind.phases(algorithm, size, gpus, topo),
                algorithm in kind.host_equivariant,
                {**head, "size": label, "size_bytes": size},
                {"gpus": n, "size": label, "algorithm": algorithm},
                _timing(size, kind.factor(n)),
            )


def _timing(size_bytes: float, factor: float) -> Callable[[float], dict]:
    """nccl-tests' time and bandwidths of a collective of size S."""

    def timing(time_s: float) -> dict:
        algbw = size_bytes / time_s if time_s > 0 else float("inf")
        return {
            "time_s": time_s,
            "algbw_bytes_per_s": algbw,
            "busbw_bytes_per_s": algbw * factor,
            "busbw_factor": factor,
        }

    return timing


def run_collective_study(
    spec: CollectiveSpec, log: Log = stderr_log, store: ResultStore | None = None
) -> Iterator[tuple[dict, list[dict]]]:
    """Yield (study row, link-kind rows) per (GPUs, algorithm, size), fewest GPUs first (sweep.run_sweep)."""
    return run_sweep(spec, log, store)


def write_collective_study(spec: CollectiveSpec, out: Path, log: Log | None = None) -> tuple[Path, Path]:
    """Run the study into `out` (sweep.write_sweep: study.csv, link_kinds.csv, the result store)."""
    return write_sweep(spec, out, STUDY_COLUMNS, KIND_COLUMNS, "study collective", log)


def table_columns(collective: str) -> list[Col]:
    """The printed table's columns in nccl-tests' units (size in B, time in us, bandwidths in GB/s, two decimals),
    the size header saying what S is for this collective and the busbw header its factor."""
    kind = COLLECTIVES.get(collective, "--collective")
    return [
        Col("gpus", "GPUs", "count"),
        Col("nodes", "nodes", "count"),
        Col("size_bytes", f"size: {kind.size_meaning} (B)", "count"),
        Col("algorithm", "algorithm"),
        Col("time_us", "time (us)", "num"),
        Col("algbw_bytes_per_s", "algbw = size / time", "GB/s", digits=2),
        Col("busbw_bytes_per_s", f"busbw = algbw x {kind.factor_text}", "GB/s", digits=2),
        Col("busiest_link_kind", "busiest link"),
        Col("busiest_utilization", "its utilization", "%"),
        Col("note", "note"),
    ]


def study_text(study_csv: Path) -> str:
    """The printed table of a collective study's rows (analysis/tables.py), by GPUs, size and algorithm; a row's
    note only where the point was skipped (the machine's notes are on stderr and in study.csv)."""
    with Path(study_csv).open(newline="") as f:
        rows = [{k: _number(v) for k, v in row.items() if v != ""} for row in csv.DictReader(f)]
    if not rows:
        return ""
    for row in rows:
        if "time_s" in row:
            row["time_us"] = row["time_s"] * 1e6
        if not str(row.get("note", "")).startswith("skipped"):
            row.pop("note", None)
    rows.sort(key=lambda r: (r["gpus"], r["size_bytes"]))
    return render(rows, table_columns(str(rows[0]["collective"])))  # a column no row has (note) is left out


def _number(text: str) -> object:
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text
