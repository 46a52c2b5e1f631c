"""Cross-check piper-sim's flow network against SimGrid's flow-level model on the same links and flows.

    python validation/simgrid/crosscheck.py [--out validation/simgrid/results.md]

SimGrid (Debian's python3-simgrid 3.32, imported from CPython 3.11 by adding Debian's dist-packages
folder to sys.path) runs in a child process per case (its Engine is a per-process singleton). Each flow
becomes one SimGrid host whose route to a common sink is exactly the flow's list of links (a star zone:
route = links(host -> centre) + links(centre -> sink), the latter empty), so sub-flows of one GPU pair may
take different paths, as in piper-sim. Links are explicit, with piper-sim's bandwidth and latency.
SimGrid configuration: CM02 (max-min, bandwidth and latency factors 1.0, unlike LV08's 0.97 and 13.01),
no cross-traffic (LV08/CM02 otherwise load the reverse path with 5% for TCP acknowledgements), no TCP
window bound (TCP-gamma 0). What stays different is in README.md: SimGrid weights the max-min share of
a flow by its round-trip latency, and starts each flow after its own latency, where piper-sim shares
equally and starts a phase's flows together after the phase's largest latency.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import simpy

DEBIAN_DIST_PACKAGES = "/usr/lib/python3/dist-packages"
SIMGRID_CONFIG = ["network/model:CM02", "network/crosstraffic:0", "network/TCP-gamma:0"]


def simgrid_available() -> tuple[bool, str]:
    """(importable, reason) -- checked in a child process, as the import prints to stderr."""
    code = f"import sys; sys.path.append({DEBIAN_DIST_PACKAGES!r}); import simgrid; print(simgrid.simgrid_version)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["unknown error"])[-1]
        return False, f"simgrid cannot be imported ({last}); install Debian's python3-simgrid"
    return True, out.stdout.strip()


@dataclass(frozen=True, kw_only=True)
class FlowCase:
    name: str
    capacity: np.ndarray  # bytes/s per link id
    latency: np.ndarray  # s per link id
    flows: list[tuple[tuple[int, ...], float]]  # (link ids, bytes); every flow starts at time 0
    collective_s: float | None = None  # piper-sim's CollectiveRunner time for the same flows, when a collective


# ---- piper-sim side ------------------------------------------------------------------------------
def ours_finish_times(case: FlowCase) -> np.ndarray:
    """Finish time of every flow under piper-sim's fair-share solver (network.max_min_rates).

    A fluid event loop: flows enter after their own path latency (SimGrid's convention; zero-latency
    cases start all together), rates are re-solved whenever a flow enters or ends. With one start time
    this is what FlowNetwork does for one flow set; the loop only adds per-flow finish times.
    """
    from piper_sim.network import EPS_BYTES, max_min_rates

    links = [np.array(links, dtype=np.int64) for links, _ in case.flows]
    entry_flow = np.concatenate([np.full(a.size, k) for k, a in enumerate(links)]).astype(np.int64)
    entry_link = np.concatenate(links)
    start = np.array([float(case.latency[a].sum()) for a in links])
    remaining = np.array([size for _, size in case.flows], dtype=float)
    finish = np.full(remaining.size, np.nan)
    t = 0.0
    while np.isnan(finish).any():
        live = (start <= t) & np.isnan(finish)
        rate = np.zeros(remaining.size)
        if live.any():
            keep = live[entry_flow]
            rate = max_min_rates(entry_flow[keep], entry_link[keep], live.astype(float), case.capacity)
            rate = np.where(live, rate, 0.0)
        pending = start[start > t]
        with np.errstate(divide="ignore"):
            to_end = np.where(live & (rate > 0), remaining / np.where(rate > 0, rate, 1.0), np.inf)
        dt = min(float(to_end.min(initial=np.inf)), float(pending.min() - t) if pending.size else np.inf)
        remaining = np.where(live, remaining - rate * dt, remaining)
        t += dt
        done = live & (remaining <= EPS_BYTES + 1e-12 * np.maximum(remaining, 1.0))
        done |= live & np.isclose(to_end, dt, rtol=1e-12, atol=0.0)
        finish[done] = t
    return finish


# ---- SimGrid side --------------------------------------------------------------------------------
def simgrid_finish_times(case: FlowCase) -> np.ndarray:
    payload = {
        "capacity": case.capacity.tolist(),
        "latency": case.latency.tolist(),
        "flows": [[list(links), size] for links, size in case.flows],
    }
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(payload, f)
    out = subprocess.run([sys.executable, __file__, "--simgrid-child", f.name], capture_output=True, text=True)
    Path(f.name).unlink(missing_ok=True)
    if out.returncode != 0:
        raise RuntimeError(f"SimGrid child failed: {out.stderr[-2000:]}")
    return np.array(json.loads(out.stdout.strip().splitlines()[-1]))


def _simgrid_child(path: str) -> None:
    sys.path.append(DEBIAN_DIST_PACKAGES)
    from simgrid import Actor, Comm, Engine, LinkInRoute, NetZone

    data = json.loads(Path(path).read_text())
    engine = Engine(["crosscheck", *(f"--cfg={c}" for c in SIMGRID_CONFIG), "--log=root.thres:critical"])
    zone = NetZone.create_star_zone("flows")
    used = sorted({link for links, _ in data["flows"] for link in links})
    links = {i: zone.create_link(f"l{i}", data["capacity"][i]).set_latency(data["latency"][i]).seal() for i in used}
    sink = zone.create_host("sink", 1e9).seal()
    zone.add_route(None, sink.netpoint, None, None, [], False)
    hosts = []
    for k, (route, _) in enumerate(data["flows"]):
        host = zone.create_host(f"f{k}", 1e9).seal()
        zone.add_route(host.netpoint, None, None, None, [LinkInRoute(links[i]) for i in route], False)
        hosts.append(host)
    zone.seal()
    finish: list[float] = []

    def main() -> None:
        sizes = [int(round(size)) for _, size in data["flows"]]
        comms = [Comm.sendto_async(h, sink, size) for h, size in zip(hosts, sizes, strict=True)]
        for c in comms:
            c.wait()
        finish.extend(c.finish_time for c in comms)

    Actor.create("main", sink, main)
    engine.run()
    print(json.dumps(finish))


# ---- cases ---------------------------------------------------------------------------------------
def case_two_flows() -> FlowCase:
    """Two flows on one 1 GB/s link, 0.5 GB and 1.5 GB: 1.0 s and 2.0 s (the second speeds up)."""
    return FlowCase(
        name="two flows share a link",
        capacity=np.array([1e9]),
        latency=np.zeros(1),
        flows=[((0,), 0.5e9), ((0,), 1.5e9)],
    )


def case_max_min() -> FlowCase:
    """Links 10 and 4 GB/s; a on L0, b on L0+L1, c on L1: b = c = 2, a = 8 GB/s, then re-sharing."""
    return FlowCase(
        name="max-min, three flows",
        capacity=np.array([10e9, 4e9]),
        latency=np.zeros(2),
        flows=[((0,), 8e9), ((0, 1), 2e9), ((1,), 4e9)],
    )


def case_rtt() -> FlowCase:
    """Two 1 GB flows on a 1 GB/s link, paths of 1 us and 3 us latency: piper-sim shares equally."""
    return FlowCase(
        name="two flows share a link, path latency 1 us vs 3 us",
        capacity=np.array([1e9, 1e12, 1e12]),
        latency=np.array([0.0, 1e-6, 3e-6]),
        flows=[((0, 1), 1e9), ((0, 2), 1e9)],
    )


def case_incast() -> FlowCase:
    """Eight senders (10 GB/s each) into one 10 GB/s receiver link, sizes 0.25 to 2 GB."""
    cap = np.full(9, 10e9)
    return FlowCase(
        name="incast 8 -> 1", capacity=cap, latency=np.zeros(9), flows=[((k, 8), 0.25e9 * (k + 1)) for k in range(8)]
    )


def collective_case(
    name: str, topology: dict, num_gpus: int, algorithm: str, bytes_per_pair: float, latency: bool
) -> FlowCase:
    """The flows of an all-to-all's first data phase (after the split sizes) exactly as piper-sim's
    CollectiveRunner routes them."""
    from piper_sim.collectives.algorithms import ALL_TO_ALL, split_phases
    from piper_sim.network import CollectiveRunner, FlowNetwork, RouteCache
    from piper_sim.topology.load import load_topology

    params = dict(topology.get("params", {}), message_overhead_us=0.0)
    topo = load_topology({**topology, "params": params}, num_gpus)
    lat = topo.latency_s.copy() if latency else np.zeros(len(topo.links))
    if not latency:
        for edge in topo.graph.edges.values():
            edge["latency_s"] = 0.0
        topo.__dict__.pop("latency_s", None)
    n = topo.num_gpus
    phase = split_phases(ALL_TO_ALL.get(algorithm)(np.full((n, n), bytes_per_pair), topo.gpus, topo))[1][0]
    routes = RouteCache(topo).routes(topo.gpus, phase.src, phase.dst, "x")
    sizes = phase.sizes[routes.sub_flow] * routes.sub_fraction
    flows = [(tuple(routes.entry_link[routes.entry_flow == k].tolist()), float(sizes[k])) for k in range(sizes.size)]
    env = simpy.Environment()
    runner = CollectiveRunner(env, FlowNetwork(env, topo.capacity_bytes_per_s), topo)
    env.run(runner.run([phase], tuple(topo.gpus), "x"))
    return FlowCase(name=name, capacity=topo.capacity_bytes_per_s, latency=lat, flows=flows, collective_s=env.now)


UNIFORM = {"preset": "uniform"}
DRAGONFLY = {"preset": "dragonfly", "params": {"num_groups": 3, "routing": "minimal"}}
DRAGONFLY_ADAPTIVE = {
    "preset": "dragonfly",
    "params": {"num_groups": 3, "routing": "adaptive", "gpus_per_node": 2, "nics_per_node": 1, "nodes_per_switch": 1},
}
FRONTIER = {"preset": "frontier", "params": {"valiant": "hashed"}}  # one detour per pair: SimGrid flows weigh 1 each
CASES: dict[str, Callable[[], FlowCase]] = {
    "two_flows": case_two_flows,
    "max_min": case_max_min,
    "incast": case_incast,
    "rtt": case_rtt,
    "uniform_a2a": lambda: collective_case(
        "flat all-to-all, uniform 2 nodes x 8 GPUs, 1 MiB", UNIFORM, 16, "flat", 2**20, latency=False
    ),
    "dragonfly_a2a": lambda: collective_case(
        "flat all-to-all, dragonfly 3 groups, 12 nodes x 4 GPUs, 256 KiB", DRAGONFLY, 48, "flat", 2**18, latency=False
    ),
    "dragonfly_adaptive_a2a": lambda: collective_case(
        "flat all-to-all, adaptive dragonfly 3 groups, 12 nodes x 2 GPUs, 256 KiB (multipath)",
        DRAGONFLY_ADAPTIVE,
        24,
        "flat",
        2**18,
        latency=False,
    ),
    "frontier_a2a": lambda: collective_case(
        "flat all-to-all, Frontier 2 nodes x 8 GCDs, 1 MiB", FRONTIER, 16, "flat", 2**20, latency=False
    ),
    "uniform_a2a_latency": lambda: collective_case(
        "uniform all-to-all as above, link latencies kept", UNIFORM, 16, "flat", 2**20, latency=True
    ),
    "dragonfly_a2a_latency": lambda: collective_case(
        "dragonfly all-to-all as above, link latencies kept", DRAGONFLY, 48, "flat", 2**18, latency=True
    ),
}


def compare(case: FlowCase) -> dict:
    ours, theirs = ours_finish_times(case), simgrid_finish_times(case)
    rel = np.abs(ours - theirs) / np.maximum(theirs, 1e-30)
    return {
        "case": case.name,
        "flows": len(case.flows),
        "ours_makespan_s": float(ours.max()),
        "simgrid_makespan_s": float(theirs.max()),
        "makespan_rel_diff": float(abs(ours.max() - theirs.max()) / theirs.max()),
        "max_flow_rel_diff": float(rel.max()),
        "mean_flow_rel_diff": float(rel.mean()),
        "collective_runner_s": case.collective_s,
    }


def markdown(rows: list[dict]) -> str:
    head = (
        "| case | flows | piper-sim makespan (s) | SimGrid makespan (s) | makespan diff | max per-flow diff "
        "| mean per-flow diff | CollectiveRunner (s) |\n|---|---|---|---|---|---|---|---|\n"
    )
    body = "".join(
        f"| {r['case']} | {r['flows']} | {r['ours_makespan_s']:.9g} | {r['simgrid_makespan_s']:.9g} | "
        f"{r['makespan_rel_diff']:.2e} | {r['max_flow_rel_diff']:.2e} | {r['mean_flow_rel_diff']:.2e} | "
        f"{'' if r['collective_runner_s'] is None else format(r['collective_runner_s'], '.9g')} |\n"
        for r in rows
    )
    return head + body


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--simgrid-child", help=argparse.SUPPRESS)
    ap.add_argument("--only", default=",".join(CASES))
    ap.add_argument("--out", type=Path, help="write the agreement table (markdown) here")
    args = ap.parse_args()
    if args.simgrid_child:
        _simgrid_child(args.simgrid_child)
        return 0
    ok, why = simgrid_available()
    if not ok:
        print(f"skipped: {why}")
        return 0
    print(f"SimGrid {why}, config {' '.join(SIMGRID_CONFIG)}")
    rows = [compare(CASES[name]()) for name in args.only.split(",")]
    table = markdown(rows)
    print(table)
    if args.out:
        args.out.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
