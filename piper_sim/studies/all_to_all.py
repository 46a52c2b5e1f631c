"""The all-to-all study: one collective alone on the machine, over node counts, sizes and algorithms.

Owns the all-to-all's study spec and rows; the loop, the result store, the machine and the CSVs are the collective
studies' shared ones (piper_sim.studies.collective_sweep). Must not import torch.

Sizes: with size_per "gpu" (default) a size is each GPU's whole send buffer (nccl-tests' and rccl-tests'
convention for `size`: S bytes split into n equal blocks, one per rank, its own included); with "pair" it is
the bytes each GPU sends to each other GPU (S x n per GPU). SIZE_PER names the convention in every table and
plot. Bandwidths follow nccl-tests: algorithm bandwidth = per-GPU buffer (n blocks) /
time, bus bandwidth = algorithm bandwidth x (n - 1) / n (the bytes each GPU really sends per second).
time_s includes the split-size exchange every algorithm runs first (`study collective` times the data phases
alone, as nccl-tests' fixed-size all-to-all). messages_per_gpu is the most messages any GPU sends over all
phases; serial_overhead_s = that count x
the topology's message_overhead_s, the part of time_s a GPU spends posting its messages one after another
(the flow model charges each phase the overhead of its busiest source's messages).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from piper_sim.collectives.algorithms import ALL_TO_ALL, Fanout, bind_fanout, data_phases, split_phases
from piper_sim.errors import ConfigError
from piper_sim.points.keys import KeyedPoint, keyed_point
from piper_sim.points.store import ResultStore
from piper_sim.studies.collective_sweep import (
    KIND_FIELDS,
    Log,
    MachineSpec,
    parse_counts,
    parse_list,
    parse_size,
    point,
    routing_fields,
    run_sweep,
    skipped,
    stderr_log,
    study_machine,
    time_phases,
    write_sweep,
)
from piper_sim.studies.prepcache import PreparedCache
from piper_sim.studies.routes import TooManyFlows
from piper_sim.topology.graph import Topology

__all__ = [
    "HOST_EQUIVARIANT",
    "KIND_COLUMNS",
    "SIZE_PER",
    "STUDY_COLUMNS",
    "StudySpec",
    "build_topology",
    "parse_list",
    "parse_nodes",
    "parse_size",
    "run_study",
    "write_study",
]

HOST_EQUIVARIANT = frozenset({"flat", "2dh", "halo", "rccl", "nccl", "deepep"})  # uniform phases map onto themselves
# when same-class hosts swap (halo: its relays follow the NICs' switches; rccl, nccl: flat's flows)
STUDY_COLUMNS = [
    "nodes",
    "gpus",
    "size",
    "size_per",
    "bytes_per_pair",
    "bytes_per_gpu",
    "algorithm",
    "routing",
    "valiant",
    "time_s",
    "algbw_bytes_per_s",
    "busbw_bytes_per_s",
    "busiest_link",
    "busiest_link_kind",
    "busiest_utilization",
    "saturated_kinds",
    "split_exchange_s",
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
SIZE_PER = {"gpu": "per GPU", "pair": "per GPU pair"}  # --size-per: how the tables and plots name a size
KIND_COLUMNS = ["nodes", "size", "algorithm", *KIND_FIELDS]


def parse_nodes(text: str) -> list[int]:
    return parse_counts(text, "--nodes")


@dataclass(frozen=True, kw_only=True)
class StudySpec(MachineSpec):
    nodes: tuple[int, ...]
    sizes: tuple[str, ...]  # as given (labels), parsed with parse_size
    algorithms: tuple[str, ...]
    size_per: str = "gpu"  # a size is each GPU's whole buffer ("gpu") or what it sends each GPU ("pair")
    fanout: tuple[int, int] | None = None  # (top-k, experts) of the model whose buffer it is (--model): deepep's dedup

    def check(self) -> None:
        for alg in self.algorithms:
            ALL_TO_ALL.get(alg, "--algorithms")
        if self.size_per not in SIZE_PER:
            raise ConfigError("--size-per", self.size_per, " or ".join(SIZE_PER))
        for s in self.sizes:
            parse_size(s)
        self.check_machine()
        build_topology(self, min(self.nodes))  # topology parameters (--set) checked before the first run

    def keyed(self, nodes: int, algorithm: str, size: str) -> KeyedPoint:
        """One row in the result store: everything the row depends on."""
        own = {"size_per": self.size_per, **({"fanout": self.fanout} if self.fanout is not None else {})}
        return keyed_point(
            {
                "study": "all-to-all",
                **self.machine_fields(),
                **own,
                "nodes": nodes,
                "algorithm": algorithm,
                "bytes": parse_size(size),
                "size": size,
            }
        )

    def machines(self) -> tuple[int, ...]:
        return self.nodes

    def where(self, nodes: int) -> str:
        return f"{nodes} nodes"

    def build(self, nodes: int) -> tuple[Topology, list[str]]:
        return build_topology(self, nodes)

    def rows(
        self, topo: Topology, gpus: list[str], algorithm: str, cache: PreparedCache, nodes: int, sizes: list[str]
    ) -> Iterator[tuple[dict, list[dict]]]:
        return _algorithm_rows(self, topo, gpus, algorithm, cache, nodes, sizes)


def build_topology(spec: StudySpec, nodes: int) -> tuple[Topology, list[str]]:
    """The machine for `nodes` nodes (collective_sweep.study_machine)."""
    return study_machine(spec, nodes=nodes)


def run_study(
    spec: StudySpec, log: Log = stderr_log, store: ResultStore | None = None
) -> Iterator[tuple[dict, list[dict]]]:
    """Yield (study row, link-kind rows) per (nodes, algorithm, size), smallest machines first (sweep.run_sweep)."""
    return run_sweep(spec, log, store)


def _algorithm_rows(
    spec: StudySpec, topo: Topology, gpus: list[str], alg: str, cache: PreparedCache, nodes: int, sizes: list[str]
) -> Iterator[tuple[dict, list[dict]]]:
    n = len(gpus)
    per_pair = [parse_size(s) / (n if spec.size_per == "gpu" else 1) for s in sizes]
    symmetric = alg in HOST_EQUIVARIANT
    algorithm = bind_fanout(ALL_TO_ALL.get(alg), Fanout(*spec.fanout) if spec.fanout else None)
    splits = split_phases(algorithm(np.full((n, n), per_pair[0]), gpus, topo))[0]  # data phases not kept
    try:  # the split-size exchange does not depend on the buffer: timed once
        splits_s = time_phases(cache, splits, symmetric)
    except TooManyFlows as exc:
        for label, pair_bytes in zip(sizes, per_pair, strict=True):
            yield skipped(_head(spec, topo, nodes, label, pair_bytes, alg), f"skipped: {exc}"), []
        return
    del splits  # n x n flows: not held while the data phases are built
    for label, pair_bytes in zip(sizes, per_pair, strict=True):
        phases = data_phases(algorithm, np.full((n, n), pair_bytes), gpus, topo)
        yield point(
            cache,
            phases,
            symmetric,
            _head(spec, topo, nodes, label, pair_bytes, alg),
            {"nodes": nodes, "size": label, "algorithm": alg},
            _timing(n * pair_bytes, n, splits_s),
        )


def _head(spec: StudySpec, topo: Topology, nodes: int, label: str, pair_bytes: float, alg: str) -> dict:
    n = topo.num_gpus
    return {
        "nodes": nodes,
        "gpus": n,
        "size": label,
        "size_per": spec.size_per,
        "bytes_per_pair": pair_bytes,
        "bytes_per_gpu": n * pair_bytes,
        "algorithm": alg,
        **routing_fields(spec, topo),
    }


def _timing(buffer_bytes: float, n: int, splits_s: float) -> Callable[[float], dict]:
    """nccl-tests' bandwidths of the per-GPU buffer, over the data phases' time and the split-size exchange's."""

    def timing(data_s: float) -> dict:
        time_s = data_s + splits_s
        algbw = buffer_bytes / time_s if time_s > 0 else float("inf")
        return {
            "time_s": time_s,
            "algbw_bytes_per_s": algbw,
            "busbw_bytes_per_s": algbw * (n - 1) / n,
            "split_exchange_s": splits_s,
        }

    return timing


def write_study(spec: StudySpec, out: Path, log: Log | None = None) -> tuple[Path, Path]:
    """Run the study into `out` (sweep.write_sweep: study.csv, link_kinds.csv, the result store)."""
    return write_sweep(spec, out, STUDY_COLUMNS, KIND_COLUMNS, "study all-to-all", log)
