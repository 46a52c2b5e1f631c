"""What the collective studies share (`study all-to-all`, `study collective`): sizes and counts as options, the
machine each point runs on, the use of its links, and the loop that runs a study's points through the result store
and writes its CSVs as rows finish.

A study is a Sweep: machine sizes (node or GPU counts) x algorithms x sizes, each point keyed (points.keys) so a
rerun into the same folder recomputes nothing finished. run_sweep builds each machine once, prepares each
algorithm's flows once per flow structure (studies.prepcache) and yields one row per point, smallest machines
first; write_sweep appends the rows to study.csv and link_kinds.csv as they come. Utilization of a link = bytes it
carried / (capacity x collective time): 1.0 means busy throughout. Must not import torch.
"""

from __future__ import annotations

import csv
import re
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Protocol

import numpy as np

from piper_sim.collectives.algorithms import Phase
from piper_sim.errors import ConfigError, named_by
from piper_sim.points.keys import KeyedPoint
from piper_sim.points.store import ResultStore
from piper_sim.progress import Eta
from piper_sim.studies.prepcache import PreparedCache
from piper_sim.studies.reduced_collective import CollectiveRun, Prepared, simulate
from piper_sim.studies.routes import TooManyFlows
from piper_sim.topology.graph import Topology
from piper_sim.topology.load import load_topology, read_topology_mapping
from piper_sim.topology.placement import PLACEMENTS, place
from piper_sim.units import COUNT_LIMIT

DRAGONFLIES = ("frontier", "lumi", "dragonfly")  # builders with a dragonfly fabric (outside_groups parameter)
SIZE_UNITS = {"B": 1.0, "KiB": 2.0**10, "MiB": 2.0**20, "GiB": 2.0**30, "KB": 1e3, "MB": 1e6, "GB": 1e9}
MAX_SIZE_BYTES = 2.0**50  # a PiB per message: far beyond any buffer
SATURATED = 0.9  # a link busy at least this fraction of the collective counts as saturated
KIND_FIELDS = ["link_kind", "links_used", "bytes", "mean_utilization", "max_utilization", "saturated_links"]

Log = Callable[[str], None]


def stderr_log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def parse_size(text: str, key: str = "--sizes") -> float:
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", text)
    size = float(m.group(1)) * SIZE_UNITS[m.group(2) or "B"] if m and (m.group(2) or "B") in SIZE_UNITS else None
    if size is None or not 0 < size <= MAX_SIZE_BYTES:
        raise ConfigError(
            key, text, f"a size above 0 B, at most 1 PiB, with a unit in {', '.join(SIZE_UNITS)} (e.g. 1MiB)"
        )
    return size


def parse_list(text: str, key: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise ConfigError(key, text, "a comma-separated list")
    return items


def parse_counts(text: str, key: str, least: int = 1) -> list[int]:
    """Node or GPU counts: integers from `least` up to COUNT_LIMIT."""
    out = []
    for item in parse_list(text, key):
        if not item.isdigit() or not least <= int(item) <= COUNT_LIMIT:
            raise ConfigError(key, item, f"integers from {least} up to {COUNT_LIMIT:,}, e.g. {least},{2 * least}")
        out.append(int(item))
    return out


@dataclass(frozen=True, kw_only=True)
class MachineSpec:
    """The machine a study runs on and how its flows are routed and reduced (every study's common options)."""

    topology: str | dict
    placement: str = "contiguous"
    routing: str | None = None  # overrides topology.params.routing (dragonfly machines)
    valiant: str = "spread"  # dragonfly detours: "spread" (mean-field) or "hashed" (as the router does)
    scope: str | None = None  # overrides topology.params.network_scope (dragonfly: "machine" or "job")
    topology_params: dict = field(default_factory=dict)
    lump: bool = True
    max_flows: int | None = 20_000_000  # paths routed per run after the symmetry reductions (memory bound)

    def check_machine(self) -> None:
        if self.valiant not in ("spread", "hashed"):
            raise ConfigError("--valiant", self.valiant, "spread or hashed")
        if self.scope not in (None, "machine", "job"):
            raise ConfigError("--scope", self.scope, "machine or job")
        if self.max_flows is not None and self.max_flows < 1:
            raise ConfigError("--max-flows", self.max_flows, "a positive number of paths")
        with named_by("--topology"):
            read_topology_mapping(self.topology)
        with named_by("--placement"):
            PLACEMENTS.get(self.placement)

    def machine_fields(self) -> dict:
        """What a point's key takes of the machine: these options and the machine's mapping itself (so its file and
        the profile it names are not inputs of the key: a study prices no compute)."""
        names = [f.name for f in fields(MachineSpec) if f.name != "topology"]
        return {**{name: getattr(self, name) for name in names}, "machine": read_topology_mapping(self.topology)}

    def cache(self, topo: Topology, gpus: list[str]) -> PreparedCache:
        return PreparedCache(
            gpus, topo, lump_flows=self.lump, spread=self.valiant == "spread", max_sub_flows=self.max_flows
        )


def study_machine(spec: MachineSpec, nodes: int | None = None, gpus: int | None = None) -> tuple[Topology, list[str]]:
    """The machine of `nodes` nodes (all their GPUs) or of as many nodes as `gpus` GPUs need (the first `gpus`
    placed), a dragonfly's detours as --valiant says. With mean-field detours the outside groups of a dragonfly's
    whole machine are aggregated by class (exact for that routing; piper_sim.topology.dragonfly), unless set."""
    raw = read_topology_mapping(spec.topology)
    params = {**(raw.get("params") or {}), **spec.topology_params, **({"num_nodes": nodes} if nodes else {})}
    if spec.routing is not None:
        params["routing"] = spec.routing
    if spec.scope is not None:
        params["network_scope"] = spec.scope
    if raw.get("builder") in DRAGONFLIES:
        params["valiant"] = spec.valiant  # the topology's own routes agree with the study's route table
        if spec.valiant == "spread" and "outside_groups" not in spec.topology_params:
            params["outside_groups"] = "aggregate"
    topo = load_topology({**raw, "params": params}, gpus)
    return topo, place(topo, gpus or topo.num_gpus, spec.placement)


def messages_per_gpu(phases: list[Phase], n: int) -> int:
    """The most messages any GPU sends over all phases."""
    total = np.zeros(n)
    for ph in phases:
        total += np.bincount(ph.src, minlength=n) * ph.messages
    return int(total.max()) if n else 0


def link_rows(topo: Topology, run: CollectiveRun) -> tuple[list[dict], dict]:
    """Per link kind: usage and utilization; plus the busiest link."""
    util = run.link_bytes / (topo.capacity_bytes_per_s * run.time_s) if run.time_s > 0 else run.link_bytes * 0
    kinds = np.array(topo.link_kinds)
    rows = []
    for kind in sorted(set(kinds.tolist())):
        sel = (kinds == kind) & (run.link_bytes > 0)
        if not sel.any():
            continue
        rows.append(
            {
                "link_kind": kind,
                "links_used": int(sel.sum()),
                "bytes": float(run.link_bytes[sel].sum()),
                "mean_utilization": float(util[sel].mean()),
                "max_utilization": float(util[sel].max()),
                "saturated_links": int((util[sel] >= SATURATED).sum()),
            }
        )
    top = int(np.argmax(util)) if util.size else 0
    busiest = {
        "busiest_link": "->".join(topo.links[top]),
        "busiest_link_kind": topo.link_kinds[top],
        "busiest_utilization": float(util[top]) if util.size else 0.0,
        "saturated_kinds": " ".join(r["link_kind"] for r in rows if r["saturated_links"]),
    }
    return rows, busiest


def routing_fields(spec: MachineSpec, topo: Topology) -> dict:
    """The routing the machine used (a dragonfly's) and, where it detours, how the detours were taken."""
    fabric_spec = getattr(getattr(topo.router, "fabric", None), "spec", None)
    routing = fabric_spec.routing if fabric_spec is not None else ""
    return {"routing": routing, "valiant": spec.valiant if routing in ("valiant", "adaptive") else ""}


def run_fields(prep: Prepared, run: CollectiveRun, topo: Topology) -> dict:
    """What a row says of the simulation itself: flows before and after the reductions, solves, wall times."""
    return {
        "pairs": prep.num_pairs,
        "network_flows": prep.num_sub_flows,
        "simulated_flows": prep.lumped.num_flow_classes,
        "simulated_links": prep.lumped.num_link_classes,
        "solves": run.num_solves,
        "prepare_s": prep.prepare_s,
        "simulate_s": run.simulate_s,
        "note": "; ".join(
            topo.notes + ([] if prep.lumped.exact_check else ["lumping fell back to no reduction (hash collision)"])
        ),
    }


def point(
    cache: PreparedCache,
    phases: list[Phase],
    symmetric: bool,
    head: dict,
    kind_head: dict,
    timing: Callable[[float], dict],
) -> tuple[dict, list[dict]]:
    """One point's row and link-kind rows: the phases simulated on the cache's machine. head: the row's own fields
    (machine, size, algorithm, routing); kind_head: what each link-kind row repeats of them; timing(time of the
    phases) -> the row's time_s and bandwidths. A point that would route more paths than the study allows is a row
    with a note saying so (skipped), and no link-kind rows."""
    msgs = messages_per_gpu(phases, len(cache.gpus))
    try:
        prep = cache.get(phases, symmetric)
    except TooManyFlows as exc:
        return skipped(head, f"skipped: {exc}", msgs), []
    run = simulate(prep, cache.topo)
    kinds, busiest = link_rows(cache.topo, run)
    row = {
        **head,
        **timing(run.time_s),
        **busiest,
        "messages_per_gpu": msgs,
        "serial_overhead_s": msgs * cache.topo.params.message_overhead_s,
        **run_fields(prep, run, cache.topo),
    }
    return row, [{**kind_head, **k} for k in kinds]


def skipped(head: dict, note: str, msgs: int = 0) -> dict:
    return {**head, "messages_per_gpu": msgs, "note": note}


def time_phases(cache: PreparedCache, phases: list[Phase], symmetric: bool) -> float:
    """The phases' time alone on the machine (0 without phases)."""
    if not phases:
        return 0.0
    return simulate(cache.get(phases, symmetric), cache.topo).time_s


class Sweep(Protocol):
    """A study's points: machines (node or GPU counts) x algorithms x sizes."""

    algorithms: tuple[str, ...]
    sizes: tuple[str, ...]

    def check(self) -> None: ...

    def machines(self) -> tuple[int, ...]: ...

    def where(self, machine: int) -> str: ...

    def keyed(self, machine: int, algorithm: str, size: str) -> KeyedPoint: ...

    def build(self, machine: int) -> tuple[Topology, list[str]]: ...

    def cache(self, topo: Topology, gpus: list[str]) -> PreparedCache: ...

    def rows(
        self, topo: Topology, gpus: list[str], algorithm: str, cache: PreparedCache, machine: int, sizes: list[str]
    ) -> Iterator[tuple[dict, list[dict]]]: ...


def run_sweep(
    sweep: Sweep, log: Log = stderr_log, store: ResultStore | None = None
) -> Iterator[tuple[dict, list[dict]]]:
    """Yield (study row, link-kind rows) per (machine, algorithm, size), smallest machines first. With a store,
    rows it holds are yielded from it (nothing finished is recomputed) and new rows are put in it."""
    sweep.check()
    machines = sweep.machines()
    total, done = len(machines) * len(sweep.algorithms) * len(sweep.sizes), 0
    keys = {
        m: {(alg, size): sweep.keyed(m, alg, size) for alg in sweep.algorithms for size in sweep.sizes}
        for m in machines
    }
    stored = {
        m: {point: store.get(k.digest, k.key) if store is not None else None for point, k in ks.items()}
        for m, ks in keys.items()
    }
    eta = Eta(sum(1 for rows in stored.values() for row in rows.values() if row is None))
    for m in machines:
        todo = {point for point in keys[m] if stored[m].get(point) is None}
        if todo:
            topo, gpus = sweep.build(m)
            for note in topo.notes:
                log(f"{sweep.where(m)}: {note}")
            cache = sweep.cache(topo, gpus)
        for alg in sweep.algorithms:
            sizes = [size for size in sweep.sizes if (alg, size) in todo]
            computed: Iterator[tuple[dict, list[dict]]] = iter(())
            if sizes:
                log(f"[{done + 1}/{total}] {sweep.where(m)} ({len(gpus)} GPUs), {alg}: routing and lumping ...")
                computed = sweep.rows(topo, gpus, alg, cache, m, sizes)
            for size in sweep.sizes:
                done += 1
                key = keys[m][(alg, size)]
                if (alg, size) in todo:
                    row, kinds = next(computed)
                    if store is not None:
                        store.put(key.digest, key.key, {"row": row, "kinds": kinds})
                    eta.finished()
                    log(f"{progress_line(done, total, sweep.where(m), row)}; {eta.text()}")
                else:
                    row, kinds = stored[m][(alg, size)]["row"], stored[m][(alg, size)]["kinds"]
                    log(f"[{done}/{total}] {sweep.where(m)}, {size}, {alg}: stored")
                yield row, kinds
        if todo:
            del cache


def progress_line(done: int, total: int, where: str, row: dict) -> str:
    head = f"[{done}/{total}] {where}, {row['size']}, {row['algorithm']}"
    if row.get("note", "").startswith("skipped"):
        return f"{head}: {row['note']}"
    return (
        f"{head}: {row['time_s'] * 1e3:.4g} ms, busbw {row['busbw_bytes_per_s'] / 1e9:.3g} GB/s/GPU, busiest "
        f"{row['busiest_link_kind']} {row['busiest_utilization']:.0%} ({row['network_flows']} flows -> "
        f"{row['simulated_flows']} classes, {row['prepare_s'] + row['simulate_s']:.1f} s)"
    )


def write_sweep(
    sweep: Sweep, out: Path, columns: list[str], kind_columns: list[str], command: str, log: Log | None = None
) -> tuple[Path, Path]:
    """Run the sweep, appending each row to study.csv / link_kinds.csv as it completes; every row is also kept
    in the result store under out/points/, so that a rerun into the same folder recomputes nothing finished while
    its key holds (points.keys)."""
    out.mkdir(parents=True, exist_ok=True)
    study_path, kinds_path = out / "study.csv", out / "link_kinds.csv"
    t0 = time.perf_counter()
    with study_path.open("w", newline="") as fs, kinds_path.open("w", newline="") as fk:
        ws, wk = csv.DictWriter(fs, columns), csv.DictWriter(fk, kind_columns)
        ws.writeheader()
        wk.writeheader()
        store = ResultStore(out)
        for row, kinds in run_sweep(sweep, **({"log": log} if log else {}), store=store):
            ws.writerow(row)
            wk.writerows(kinds)
            fs.flush()
            fk.flush()
    if log:
        for line in store.tally.lines(command):
            log(line)
        log(f"study done in {time.perf_counter() - t0:.1f} s")
    return study_path, kinds_path
