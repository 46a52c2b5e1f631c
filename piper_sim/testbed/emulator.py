"""Bring an emulated cluster up and down: one network namespace per node and per switch.

Owns up/down/status of a testbed described by a topology YAML (builder "testbed"). Per node a
namespace `<prefix>-n<h>` (loopback up, one interface eth0 with the node's address); per network
switch a namespace `<prefix>-s<i>` holding a Linux bridge br0; every NIC link and switch link a veth
(or TAP) pair shaped per direction on its egress (see piper_sim.testbed.netdev). All bridges form one
L2 broadcast domain, so every node reaches every other through the switch graph (loop-free graphs
only). Nothing is created in the root namespace, and traffic never leaves the namespaces.

The state file (JSON, /run/piper-sim/<prefix>.json unless a path is given; a custom path is noted in
/run/piper-sim/<prefix>.state-path so the prefix alone finds it) records the plan
(namespaces, links with their shaping, host addresses, rank -> namespace and address), the delay
mode and the delay-line pid. `down(prefix)` needs none of it: it finds namespaces by name and the
delay line by its argv, so it also cleans up after a crash. Must not import simpy or torch.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from piper_sim.testbed import netdev, processes
from piper_sim.testbed.cluster_plan import (
    DEFAULT_SUBNET,
    HostPlan,
    RankPlan,
    TestbedPlan,
    check_prefix,
    host_namespace,
    make_plan,
    namespace_pattern,
    plan_from_dict,
)
from piper_sim.testbed.shell import (
    RUN_DIR,
    TestbedError,
    TestbedUnavailable,
    exec_argv,
    list_namespaces,
    namespace_pids,
    require_tools,
    run,
    try_run,
)
from piper_sim.topology.load import load_topology


@dataclass(frozen=True, kw_only=True)
class Testbed:
    """A running (or recorded) emulated cluster, as read from its state file."""

    __test__ = False  # not a pytest test class

    plan: TestbedPlan
    state_path: Path
    delay_mode: str
    delayline_pid: int | None

    @property
    def prefix(self) -> str:
        return self.plan.prefix

    def host(self, host: int) -> HostPlan:
        for h in self.plan.hosts:
            if h.host == host:
                return h
        raise TestbedError(f"testbed {self.prefix} has no host {host} (hosts 0..{len(self.plan.hosts) - 1})")

    def rank(self, rank: int) -> RankPlan:
        if not 0 <= rank < len(self.plan.ranks):
            raise TestbedError(f"testbed {self.prefix} has no rank {rank} (ranks 0..{len(self.plan.ranks) - 1})")
        return self.plan.ranks[rank]

    def rank_map(self) -> dict[int, tuple[str, str]]:
        """rank -> (namespace, ip)."""
        return {r.rank: (r.namespace, r.ip) for r in self.plan.ranks}

    def exec_in(self, host: int, argv: list[str]) -> list[str]:
        return exec_argv(self.host(host).namespace, argv)


def default_state_path(prefix: str) -> Path:
    return RUN_DIR / f"{check_prefix(prefix)}.json"


def _log_path(prefix: str) -> Path:
    return RUN_DIR / f"{prefix}.delayline.log"


def _pointer_path(prefix: str) -> Path:
    """Where a state file written to a custom path is recorded, so load(prefix) finds it."""
    return RUN_DIR / f"{prefix}.state-path"


def locate_state(prefix: str, state_path: str | Path | None = None) -> Path:
    """The state file: the given path, else the default, else the custom path recorded at up()."""
    if state_path is not None:
        return Path(state_path)
    default = default_state_path(prefix)
    pointer = _pointer_path(prefix)
    if not default.exists() and pointer.exists():
        return Path(pointer.read_text().strip())
    return default


def exec_in(host: int | str, argv: list[str], prefix: str = "pst") -> list[str]:
    """The argv running `argv` inside a testbed node: host index (with prefix) or namespace name."""
    if isinstance(host, int):
        return exec_argv(host_namespace(check_prefix(prefix), host), argv)
    if not namespace_pattern(host.rsplit("-", 1)[0]).fullmatch(host):
        raise TestbedError(f"{host!r} is not a testbed namespace (expected <prefix>-n<h> or <prefix>-s<i>)")
    return exec_argv(host, argv)


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def _state(plan: TestbedPlan, mode: str, pid: int | None, source: str) -> dict:
    tap = {link.name for link in plan.links if netdev.link_uses_tap(link, mode)}
    delay_links = [d for d in plan.to_dict()["links"] if d["name"] in tap]
    return {
        "version": 1,
        "prefix": plan.prefix,
        "topology_source": source,
        "delay_mode": mode,
        "delayline_pid": pid,
        "created_unix_s": time.time(),
        "plan": plan.to_dict(),
        "namespaces": plan.namespaces,
        "delay_links": delay_links,
        "rank_map": {str(r.rank): [r.namespace, r.ip] for r in plan.ranks},
    }


def up(
    topology_yaml: str | Path | dict,
    prefix: str = "pst",
    *,
    state_path: str | Path | None = None,
    delay: str = "auto",
    subnet: str = DEFAULT_SUBNET,
) -> Testbed:
    """Create the emulated cluster of a topology (preset name, YAML path or mapping); returns it.

    delay: "auto" (netem if the kernel has it, else the TAP delay line), "netem", "tap" or "none".
    On any failure, Ctrl-C or SIGTERM part-way, everything created so far is removed (with further signals
    ignored until it is) before the error propagates; should that removal fail, or the process be killed
    (SIGKILL), `down(prefix)` removes the rest.
    """
    require_tools()
    check_prefix(prefix)
    leftovers = [ns for ns in list_namespaces() if namespace_pattern(prefix).fullmatch(ns)]
    if leftovers or processes.delayline_pids(prefix):
        raise TestbedError(
            f"testbed {prefix!r} is already up or left over ({', '.join(leftovers) or 'delay line'});"
            f" run `piper-sim testbed down --prefix {prefix}` first"
        )
    topo = load_topology(topology_yaml)
    plan = make_plan(topo, prefix, subnet)
    path = Path(state_path) if state_path is not None else default_state_path(prefix)
    try:
        RUN_DIR.mkdir(parents=True, exist_ok=True)
        for ns in plan.namespaces:
            netdev.run_all(netdev.namespace_commands(ns))
        mode = netdev.resolve_delay_mode(delay, plan.hosts[0].namespace, any(x.has_delay for x in plan.links))
        if mode == "tap" and not Path("/dev/net/tun").exists():
            raise TestbedUnavailable(
                "this kernel has no sch_netem and /dev/net/tun is missing: link latency "
                "cannot be emulated; use delay='none'"
            )
        bridges = {s.namespace: s.bridge for s in plan.switches}
        for switch in plan.switches:
            netdev.run_all(netdev.switch_commands(switch))
        for link in plan.links:
            netdev.run_all(netdev.link_commands(link, mode, bridges))
        for host in plan.hosts:
            prefixlen = plan.subnet.split("/")[1]
            run(["ip", "-n", host.namespace, "addr", "add", f"{host.ip}/{prefixlen}", "dev", host.interface])
        source = str(topology_yaml) if not isinstance(topology_yaml, dict) else topology_yaml.get("name", "inline")
        state = _state(plan, mode, None, source)
        _write_json(path, state)
        if path != default_state_path(prefix):
            _pointer_path(prefix).write_text(f"{path}\n")
        pid = None
        if state["delay_links"]:
            pid = processes.start_delayline(prefix, path, _log_path(prefix))
            state["delayline_pid"] = pid
            _write_json(path, state)
    except BaseException as exc:  # a failure, Ctrl-C or SIGTERM part-way: remove what was created, then re-raise
        # after a Ctrl-C or SIGTERM the signals stay ignored: the process is stopping (the CLI exits 130 or 143)
        with _uninterruptible(release=isinstance(exc, Exception)):
            try:
                down(prefix, state_path=path)
            except Exception as cleanup:
                raise TestbedError(
                    f"testbed {prefix!r} stopped part-way ({type(exc).__name__}) and removing what "
                    f"it had created failed ({cleanup}); run `piper-sim testbed down --prefix "
                    f"{prefix}`"
                ) from exc
        raise
    return Testbed(plan=plan, state_path=path, delay_mode=mode, delayline_pid=pid)


@contextmanager
def _uninterruptible(release: bool = True):
    """SIGINT, SIGTERM and SIGHUP ignored while the block runs, in this process and in the `ip` commands it starts
    (they inherit the ignored signals): a second Ctrl-C must not cut short the removal of a half-built testbed.
    release False: they stay ignored after it (a stopping process: another Ctrl-C must not cut its exit short).
    Only the main thread can change signal handlers; elsewhere the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in held}
    try:
        yield
    finally:
        for sig, handler in previous.items() if release else ():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)  # None: not set from Python


def load(prefix: str = "pst", state_path: str | Path | None = None) -> Testbed | None:
    """The testbed recorded in the state file, or None when there is none."""
    path = locate_state(prefix, state_path)
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return Testbed(
        plan=plan_from_dict(state["plan"]),
        state_path=path,
        delay_mode=state["delay_mode"],
        delayline_pid=state.get("delayline_pid"),
    )


def down(prefix: str = "pst", *, state_path: str | Path | None = None) -> dict[str, list]:
    """Remove everything a testbed with this prefix created; idempotent, works without a state file.

    Ends the delay line and any process still inside the testbed's namespaces (SIGTERM, then SIGKILL),
    deletes the namespaces (with them every veth, TAP, bridge and qdisc), removes interfaces named
    `<prefix>-*` from the root namespace should any exist, and deletes the state and log files.
    Returns what was removed.
    """
    require_tools()
    check_prefix(prefix)
    removed: dict[str, list] = {"processes": [], "namespaces": [], "links": [], "files": []}
    for pid in processes.delayline_pids(prefix):
        processes.terminate(pid)
        removed["processes"].append(pid)
    pattern = namespace_pattern(prefix)
    for ns in list_namespaces():
        if not pattern.fullmatch(ns):
            continue
        for pid in namespace_pids(ns):
            processes.terminate(pid)
            removed["processes"].append(pid)
        run(["ip", "netns", "del", ns])
        removed["namespaces"].append(ns)
    for name in _root_links(prefix):
        if try_run(["ip", "link", "del", "dev", name]):
            removed["links"].append(name)
    paths = {default_state_path(prefix), _log_path(prefix), locate_state(prefix, state_path), _pointer_path(prefix)}
    for path in sorted(paths):
        if path.exists():
            path.unlink()
            removed["files"].append(str(path))
    return removed


def _root_links(prefix: str) -> list[str]:
    out = run(["ip", "-o", "link", "show"])
    names = [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]
    return [n for n in names if n.startswith(f"{prefix}-")]


def status(prefix: str = "pst", *, state_path: str | Path | None = None) -> dict:
    """What exists of a testbed: namespaces, the delay line, the recorded plan; `healthy` when complete."""
    require_tools()
    check_prefix(prefix)
    existing = sorted(ns for ns in list_namespaces() if namespace_pattern(prefix).fullmatch(ns))
    bed = load(prefix, state_path)
    expected = sorted(bed.plan.namespaces) if bed else []
    pids = processes.delayline_pids(prefix)
    needs_delayline = bool(bed and bed.delayline_pid is not None)
    return {
        "prefix": prefix,
        "state_path": str(bed.state_path) if bed else None,
        "up": bool(existing),
        "namespaces": existing,
        "missing_namespaces": sorted(set(expected) - set(existing)),
        "delay_mode": bed.delay_mode if bed else None,
        "delayline_pids": pids,
        "healthy": bool(bed) and set(expected) <= set(existing) and (bool(pids) or not needs_delayline),
        "hosts": [{"host": h.host, "namespace": h.namespace, "ip": h.ip, "switch": h.switch} for h in bed.plan.hosts]
        if bed
        else [],
        "rank_map": bed.rank_map() if bed else {},
    }
