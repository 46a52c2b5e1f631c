"""The all-to-all study: one collective alone on the machine, over node counts, sizes and algorithms.

Owns the study spec, the rows of study.csv and link_kinds.csv (written one run at a time, so an
interrupted study keeps its completed rows) and the size/node-list parsing. Must not import torch.

Sizes: with size_per "gpu" (default) a size is each GPU's whole send buffer (nccl-tests' and rccl-tests'
convention for `size`: S bytes split into n equal blocks, one per rank, its own included); with "pair" it is
the bytes each GPU sends to each other GPU (S x n per GPU). SIZE_PER names the convention in every table and
plot. Bandwidths follow nccl-tests: algorithm bandwidth = per-GPU buffer (n blocks) /
time, bus bandwidth = algorithm bandwidth x (n - 1) / n (the bytes each GPU really sends per second).
Utilization of a link = bytes it carried / (capacity x collective time): 1.0 means busy throughout.
messages_per_gpu is the most messages any GPU sends over all phases; serial_overhead_s = that count x
the topology's message_overhead_s, the part of time_s a GPU spends posting its messages one after another
(the flow model charges each phase the overhead of its busiest source's messages).
"""

from __future__ import annotations

import csv
import re
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from piper_sim.collectives.algorithms import ALL_TO_ALL, Fanout, Phase, bind_fanout, data_phases, split_phases
from piper_sim.errors import ConfigError, named_by
from piper_sim.planning.keys import KeyedPoint, keyed_point
from piper_sim.planning.store import ResultStore
from piper_sim.progress import Eta
from piper_sim.studies.prepcache import PreparedCache
from piper_sim.studies.routes import TooManyFlows
from piper_sim.studies.runner import CollectiveRun, Prepared, simulate
from piper_sim.topology.graph import Topology
from piper_sim.topology.load import load_topology, read_topology_mapping
from piper_sim.topology.placement import PLACEMENTS, place
from piper_sim.units import COUNT_LIMIT

DRAGONFLIES = ("frontier", "lumi", "dragonfly")  # builders with a dragonfly fabric (outside_groups parameter)
SIZE_UNITS = {"B": 1.0, "KiB": 2.0**10, "MiB": 2.0**20, "GiB": 2.0**30, "KB": 1e3, "MB": 1e6, "GB": 1e9}
HOST_EQUIVARIANT = frozenset({"flat", "2dh", "halo", "rccl", "nccl", "deepep"})  # uniform phases map onto themselves
# when same-class hosts swap (halo: its relays follow the NICs' switches; rccl, nccl: flat's flows)
SATURATED = 0.9  # a link busy at least this fraction of the collective counts as saturated
STUDY_COLUMNS = [
    "nodes", "gpus", "size", "size_per", "bytes_per_pair", "bytes_per_gpu", "algorithm", "routing", "valiant",
    "time_s", "algbw_bytes_per_s", "busbw_bytes_per_s", "busiest_link", "busiest_link_kind",
    "busiest_utilization", "saturated_kinds", "split_exchange_s", "messages_per_gpu", "serial_overhead_s", "pairs",
    "network_flows", "simulated_flows", "simulated_links", "solves", "prepare_s", "simulate_s", "note",
]
SIZE_PER = {"gpu": "per GPU", "pair": "per GPU pair"}  # --size-per: how the tables and plots name a size
KIND_COLUMNS = ["nodes", "size", "algorithm", "link_kind", "links_used", "bytes", "mean_utilization",
                "max_utilization", "saturated_links"]


MAX_SIZE_BYTES = 2.0**50  # a PiB per message: far beyond any buffer


def parse_size(text: str) -> float:
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", text)
    size = float(m.group(1)) * SIZE_UNITS[m.group(2) or "B"] if m and (m.group(2) or "B") in SIZE_UNITS else None
    if size is None or not 0 < size <= MAX_SIZE_BYTES:
        raise ConfigError("--sizes", text, f"a size above 0 B, at most 1 PiB, with a unit in {', '.join(SIZE_UNITS)} "
                                           "(e.g. 1MiB)")
    return size


def parse_list(text: str, key: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise ConfigError(key, text, "a comma-separated list")
    return items


def parse_nodes(text: str) -> list[int]:
    out = []
    for item in parse_list(text, "--nodes"):
        if not item.isdigit() or not 1 <= int(item) <= COUNT_LIMIT:
            raise ConfigError("--nodes", item, f"positive integers up to {COUNT_LIMIT:,}, e.g. 1,2,4,8")
        out.append(int(item))
    return out


@dataclass(frozen=True, kw_only=True)
class StudySpec:
    topology: str | dict
    nodes: tuple[int, ...]
    sizes: tuple[str, ...]  # as given (labels), parsed with parse_size
    algorithms: tuple[str, ...]
    size_per: str = "gpu"  # a size is each GPU's whole buffer ("gpu") or what it sends each GPU ("pair")
    placement: str = "contiguous"
    routing: str | None = None  # overrides topology.params.routing (dragonfly machines)
    valiant: str = "spread"  # dragonfly detours: "spread" (mean-field) or "hashed" (as the router does)
    scope: str | None = None  # overrides topology.params.network_scope (dragonfly: "machine" or "job")
    topology_params: dict = field(default_factory=dict)
    lump: bool = True
    max_flows: int | None = 20_000_000  # paths routed per run after the symmetry reductions (memory bound)
    fanout: tuple[int, int] | None = None  # (top-k, experts) of the model whose buffer it is (--model): deepep's dedup

    def check(self) -> None:
        for alg in self.algorithms:
            ALL_TO_ALL.get(alg, "--algorithms")
        if self.size_per not in SIZE_PER:
            raise ConfigError("--size-per", self.size_per, " or ".join(SIZE_PER))
        if self.valiant not in ("spread", "hashed"):
            raise ConfigError("--valiant", self.valiant, "spread or hashed")
        if self.scope not in (None, "machine", "job"):
            raise ConfigError("--scope", self.scope, "machine or job")
        for s in self.sizes:
            parse_size(s)
        if self.max_flows is not None and self.max_flows < 1:
            raise ConfigError("--max-flows", self.max_flows, "a positive number of paths")
        with named_by("--topology"):
            read_topology_mapping(self.topology)
        with named_by("--placement"):
            PLACEMENTS.get(self.placement)
        build_topology(self, min(self.nodes))  # topology parameters (--set) checked before the first run

    def keyed(self, nodes: int, algorithm: str, size: str) -> KeyedPoint:
        """One row in the result store: everything the row depends on (the machine's mapping itself, so its file
        and the profile it names are not inputs of the key: the study prices no compute)."""
        fields = {k: v for k, v in self.__dict__.items() if k not in ("nodes", "sizes", "algorithms", "topology")
                  and not (k == "fanout" and v is None)}
        return keyed_point({"study": "all-to-all", **fields, "machine": read_topology_mapping(self.topology),
                            "nodes": nodes, "algorithm": algorithm, "bytes": parse_size(size), "size": size})


def build_topology(spec: StudySpec, nodes: int) -> tuple[Topology, list[str]]:
    """The machine for `nodes` nodes, a dragonfly's detours as --valiant says. With mean-field detours the outside
    groups of a dragonfly's whole machine are aggregated by class (exact for that routing;
    piper_sim.topology.dragonfly), unless set."""
    raw = read_topology_mapping(spec.topology)
    params = {**(raw.get("params") or {}), **spec.topology_params, "num_nodes": nodes}
    if spec.routing is not None:
        params["routing"] = spec.routing
    if spec.scope is not None:
        params["network_scope"] = spec.scope
    if raw.get("builder") in DRAGONFLIES:
        params["valiant"] = spec.valiant  # the topology's own routes agree with the study's route table
        if spec.valiant == "spread" and "outside_groups" not in spec.topology_params:
            params["outside_groups"] = "aggregate"
    topo = load_topology({**raw, "params": params})
    return topo, place(topo, topo.num_gpus, spec.placement)


def messages_per_gpu(phases: list[Phase], n: int) -> int:
    total = np.zeros(n)
    for ph in phases:
        total += np.bincount(ph.src, minlength=n) * ph.messages
    return int(total.max()) if n else 0


def _link_rows(topo: Topology, run: CollectiveRun) -> tuple[list[dict], dict]:
    """Per link kind: usage and utilization; plus the busiest link."""
    util = run.link_bytes / (topo.capacity_bytes_per_s * run.time_s) if run.time_s > 0 else run.link_bytes * 0
    kinds = np.array(topo.link_kinds)
    rows = []
    for kind in sorted(set(kinds.tolist())):
        sel = (kinds == kind) & (run.link_bytes > 0)
        if not sel.any():
            continue
        rows.append({"link_kind": kind, "links_used": int(sel.sum()), "bytes": float(run.link_bytes[sel].sum()),
                     "mean_utilization": float(util[sel].mean()), "max_utilization": float(util[sel].max()),
                     "saturated_links": int((util[sel] >= SATURATED).sum())})
    top = int(np.argmax(util)) if util.size else 0
    busiest = {"busiest_link": "->".join(topo.links[top]), "busiest_link_kind": topo.link_kinds[top],
               "busiest_utilization": float(util[top]) if util.size else 0.0,
               "saturated_kinds": " ".join(r["link_kind"] for r in rows if r["saturated_links"])}
    return rows, busiest


def run_study(spec: StudySpec, log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
              store: ResultStore | None = None) -> Iterator[tuple[dict, list[dict]]]:
    """Yield (study row, link-kind rows) per (nodes, algorithm, size), smallest machines first. With a store,
    rows it holds are yielded from it (nothing finished is recomputed) and new rows are put in it."""
    spec.check()
    total, done = len(spec.nodes) * len(spec.algorithms) * len(spec.sizes), 0
    keys_by_nodes = {nodes: {(alg, size): spec.keyed(nodes, alg, size) for alg in spec.algorithms
                             for size in spec.sizes} for nodes in spec.nodes}
    stored_by_nodes = {nodes: {point: store.get(k.digest, k.key) if store is not None else None
                               for point, k in keys.items()} for nodes, keys in keys_by_nodes.items()}
    eta = Eta(sum(1 for rows in stored_by_nodes.values() for row in rows.values() if row is None))
    for nodes in spec.nodes:
        keys, stored = keys_by_nodes[nodes], stored_by_nodes[nodes]
        todo = {point for point in keys if stored.get(point) is None}
        if todo:
            topo, gpus = build_topology(spec, nodes)
            for note in topo.notes:
                log(f"{nodes} nodes: {note}")
            cache = PreparedCache(gpus, topo, lump_flows=spec.lump, spread=spec.valiant == "spread",
                                  max_sub_flows=spec.max_flows)
        for alg in spec.algorithms:
            sizes = [size for size in spec.sizes if (alg, size) in todo]
            computed = iter(())
            if sizes:
                log(f"[{done + 1}/{total}] {nodes} nodes ({len(gpus)} GPUs), {alg}: routing and lumping ...")
                computed = _algorithm_rows(spec, topo, gpus, alg, cache, nodes, sizes)
            for size in spec.sizes:
                done += 1
                if (alg, size) in todo:
                    row, kinds = next(computed)
                    if store is not None:
                        store.put(keys[(alg, size)].digest, keys[(alg, size)].key, {"row": row, "kinds": kinds})
                    eta.finished()
                    log(f"{_progress(done, total, row)}; {eta.text()}")
                else:
                    row, kinds = stored[(alg, size)]["row"], stored[(alg, size)]["kinds"]
                    log(f"[{done}/{total}] {nodes} nodes, {size}, {alg}: stored")
                yield row, kinds
        if todo:
            del cache


def _algorithm_rows(spec: StudySpec, topo: Topology, gpus: list[str], alg: str, cache: PreparedCache,
                    nodes: int, sizes: list[str]) -> Iterator[tuple[dict, list[dict]]]:
    n = len(gpus)
    per_pair = [parse_size(s) / (n if spec.size_per == "gpu" else 1) for s in sizes]
    symmetric = alg in HOST_EQUIVARIANT
    algorithm = bind_fanout(ALL_TO_ALL.get(alg), Fanout(*spec.fanout) if spec.fanout else None)
    splits = split_phases(algorithm(np.full((n, n), per_pair[0]), gpus, topo))[0]  # data phases not kept
    try:  # the split-size exchange does not depend on the buffer: timed once
        splits_s = _time(cache, splits, symmetric)
    except TooManyFlows as exc:
        for label, pair_bytes in zip(sizes, per_pair, strict=True):
            yield _skipped(spec, topo, nodes, n, label, pair_bytes, alg, 0, f"skipped: {exc}"), []
        return
    del splits  # n x n flows: not held while the data phases are built
    for label, pair_bytes in zip(sizes, per_pair, strict=True):
        phases = data_phases(algorithm, np.full((n, n), pair_bytes), gpus, topo)
        msgs = messages_per_gpu(phases, n)
        try:
            prep = cache.get(phases, symmetric)
        except TooManyFlows as exc:
            yield _skipped(spec, topo, nodes, n, label, pair_bytes, alg, msgs, f"skipped: {exc}"), []
            continue
        run = simulate(prep, topo)
        kinds, busiest = _link_rows(topo, run)
        row = _row(spec, topo, nodes, label, pair_bytes, alg, prep, run, busiest, msgs, splits_s)
        yield row, [{"nodes": nodes, "size": label, "algorithm": alg, **k} for k in kinds]


def _time(cache: PreparedCache, phases: list[Phase], symmetric: bool) -> float:
    if not phases:
        return 0.0
    return simulate(cache.get(phases, symmetric), cache.topo).time_s


def _progress(done: int, total: int, row: dict) -> str:
    if row.get("note", "").startswith("skipped"):
        return f"[{done}/{total}] {row['nodes']} nodes, {row['size']}, {row['algorithm']}: {row['note']}"
    return (f"[{done}/{total}] {row['nodes']} nodes, {row['size']}/{row['size_per']}, {row['algorithm']}: "
            f"{row['time_s'] * 1e3:.4g} ms, busbw {row['busbw_bytes_per_s'] / 1e9:.3g} GB/s/GPU, busiest "
            f"{row['busiest_link_kind']} {row['busiest_utilization']:.0%} ({row['network_flows']} flows -> "
            f"{row['simulated_flows']} classes, {row['prepare_s'] + row['simulate_s']:.1f} s)")


def _routing_name(topo: Topology) -> str:
    fabric_spec = getattr(getattr(topo.router, "fabric", None), "spec", None)
    return fabric_spec.routing if fabric_spec is not None else ""


def _row(spec: StudySpec, topo: Topology, nodes: int, label: str, pair_bytes: float, alg: str,
         prep: Prepared, run: CollectiveRun, busiest: dict, msgs: int, splits_s: float) -> dict:
    n, routing = topo.num_gpus, _routing_name(topo)
    time_s = run.time_s + splits_s
    algbw = n * pair_bytes / time_s if time_s > 0 else float("inf")
    return {"nodes": nodes, "gpus": n, "size": label, "size_per": spec.size_per, "bytes_per_pair": pair_bytes,
            "bytes_per_gpu": n * pair_bytes, "algorithm": alg, "routing": routing,
            "valiant": spec.valiant if routing in ("valiant", "adaptive") else "", "time_s": time_s,
            "algbw_bytes_per_s": algbw, "busbw_bytes_per_s": algbw * (n - 1) / n, **busiest,
            "split_exchange_s": splits_s,
            "messages_per_gpu": msgs, "serial_overhead_s": msgs * topo.params.message_overhead_s,
            "pairs": prep.num_pairs, "network_flows": prep.num_sub_flows,
            "simulated_flows": prep.lumped.num_flow_classes, "simulated_links": prep.lumped.num_link_classes,
            "solves": run.num_solves, "prepare_s": prep.prepare_s, "simulate_s": run.simulate_s,
            "note": "; ".join(topo.notes + ([] if prep.lumped.exact_check
                                           else ["lumping fell back to no reduction (hash collision)"]))}


def _skipped(spec: StudySpec, topo: Topology, nodes: int, n: int, label: str, pair_bytes: float, alg: str,
             msgs: int, note: str) -> dict:
    routing = _routing_name(topo)
    return {"nodes": nodes, "gpus": n, "size": label, "size_per": spec.size_per, "bytes_per_pair": pair_bytes,
            "bytes_per_gpu": n * pair_bytes, "algorithm": alg, "routing": routing,
            "valiant": spec.valiant if routing in ("valiant", "adaptive") else "", "messages_per_gpu": msgs,
            "note": note}


def write_study(spec: StudySpec, out: Path, log: Callable[[str], None] | None = None) -> tuple[Path, Path]:
    """Run the study, appending each row to study.csv / link_kinds.csv as it completes; every row is also kept
    in the result store under out/points/, so that a rerun into the same folder recomputes nothing finished while
    its key holds (planning.keys)."""
    out.mkdir(parents=True, exist_ok=True)
    study_path, kinds_path = out / "study.csv", out / "link_kinds.csv"
    t0 = time.perf_counter()
    with study_path.open("w", newline="") as fs, kinds_path.open("w", newline="") as fk:
        ws, wk = csv.DictWriter(fs, STUDY_COLUMNS), csv.DictWriter(fk, KIND_COLUMNS)
        ws.writeheader()
        wk.writeheader()
        store = ResultStore(out)
        for row, kinds in run_study(spec, **({"log": log} if log else {}), store=store):
            ws.writerow(row)
            wk.writerows(kinds)
            fs.flush()
            fk.flush()
    if log:
        for line in store.tally.lines("study all-to-all"):
            log(line)
        log(f"study done in {time.perf_counter() - t0:.1f} s")
    return study_path, kinds_path
