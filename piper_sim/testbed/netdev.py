"""Commands that build one emulated link or switch: veth/TAP pairs, bridge ports, tc shaping.

Owns the iproute2 argv lists (pure functions, so they can be checked without root) and the order
in which they run. Shaping is on the egress of every link end, per direction, because that is the
only place a qdisc sees the traffic: a bridge forwards between ports, so the switch-side end of a
link shapes switch -> node and the node-side end shapes node -> switch.

Delay modes:
  "netem"  veth pair; root qdisc netem (the delay) with tbf (the rate) as its child.
  "tap"    for kernels without sch_netem: a TAP pair joined by the delay-line process
           (piper_sim.testbed.delayline); tbf on each TAP, the delay in userspace.
  "none"   veth pair with tbf only: no latency emulation.
"""

from __future__ import annotations

from piper_sim.testbed.cluster_plan import LinkEnd, LinkPlan, Shaping, SwitchPlan
from piper_sim.testbed.shell import TestbedError, run, try_run

DELAY_MODES = ("auto", "netem", "tap", "none")
MIN_BURST_BYTES = 68 * 1024  # >= a 64 KiB TSO frame, so TAP links see few large frames
BURST_TIME_S = 2e-3
QUEUE_TIME_S = 0.1  # a deep switch buffer: drops mean 200 ms TCP retransmission timeouts
MIN_LIMIT_BYTES = 256 * 1024


def tbf_args(shaping: Shaping) -> list[str]:
    """tbf parameters: rate in bit/s of Ethernet frames, burst ~2 ms, queue ~100 ms of traffic."""
    rate = shaping.rate_bytes_per_s
    burst = max(MIN_BURST_BYTES, int(rate * BURST_TIME_S))
    limit = max(MIN_LIMIT_BYTES, int(rate * QUEUE_TIME_S)) + burst
    return ["tbf", "rate", f"{round(rate * 8)}bit", "burst", str(burst), "limit", str(limit)]


def shaping_commands(end: LinkEnd, shaping: Shaping, mode: str) -> list[list[str]]:
    """tc commands shaping the egress of one link end."""
    tc = ["tc", "-n", end.namespace, "qdisc", "add", "dev", end.interface]
    if mode == "netem" and shaping.delay_s > 0:
        delay_us = max(1, round(shaping.delay_s * 1e6))
        return [
            [*tc, "root", "handle", "1:", "netem", "delay", f"{delay_us}us", "limit", "100000"],
            [*tc, "parent", "1:1", "handle", "10:", *tbf_args(shaping)],
        ]
    return [[*tc, "root", "handle", "1:", *tbf_args(shaping)]]


def link_uses_tap(link: LinkPlan, mode: str) -> bool:
    return mode == "tap" and link.has_delay


def create_commands(link: LinkPlan, mode: str) -> list[list[str]]:
    """Create both ends of a link directly inside their namespaces (nothing lands in the root netns)."""
    if link_uses_tap(link, mode):
        return [
            ["ip", "-n", end.namespace, "tuntap", "add", "dev", end.interface, "mode", "tap", "vnet_hdr"]
            for end in (link.a, link.b)
        ]
    return [
        [
            "ip",
            "link",
            "add",
            link.a.interface,
            "netns",
            link.a.namespace,
            "type",
            "veth",
            "peer",
            "name",
            link.b.interface,
            "netns",
            link.b.namespace,
        ]
    ]


def link_commands(link: LinkPlan, mode: str, bridges: dict[str, str]) -> list[list[str]]:
    """Everything for one link: create, attach switch ends to their bridge, shape, bring up.

    `bridges` maps a switch namespace to its bridge name; ends in other namespaces are node NICs.
    """
    cmds = create_commands(link, mode)
    for end in (link.a, link.b):
        ip = ["ip", "-n", end.namespace, "link", "set", "dev", end.interface]
        cmds.append([*ip, "addrgenmode", "none"])  # no IPv6 link-local chatter on emulated wires
        if end.namespace in bridges:
            cmds.append([*ip, "master", bridges[end.namespace]])
    cmds += shaping_commands(link.a, link.a_to_b, mode) + shaping_commands(link.b, link.b_to_a, mode)
    for end in (link.a, link.b):
        cmds.append(["ip", "-n", end.namespace, "link", "set", "dev", end.interface, "up"])
    return cmds


def switch_commands(switch: SwitchPlan) -> list[list[str]]:
    ip = ["ip", "-n", switch.namespace, "link"]
    return [
        [*ip, "add", switch.bridge, "type", "bridge", "stp_state", "0"],
        [*ip, "set", "dev", switch.bridge, "addrgenmode", "none"],
        [*ip, "set", "dev", switch.bridge, "up"],
    ]


def namespace_commands(namespace: str) -> list[list[str]]:
    return [["ip", "netns", "add", namespace], ["ip", "-n", namespace, "link", "set", "dev", "lo", "up"]]


def netem_available(namespace: str) -> bool:
    """Whether this kernel has sch_netem: try it on the namespace's loopback, then remove it."""
    ok = try_run(["tc", "-n", namespace, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1us"])
    if ok:
        try_run(["tc", "-n", namespace, "qdisc", "del", "dev", "lo", "root"])
    return ok


def resolve_delay_mode(mode: str, probe_namespace: str, any_delay: bool) -> str:
    """ "auto" picks netem when the kernel has it, else the TAP delay line (else none if no link delays)."""
    if mode not in DELAY_MODES:
        raise TestbedError(f"testbed delay mode {mode!r}: allowed {', '.join(DELAY_MODES)}")
    if mode == "none" or not any_delay:
        return "none"
    if mode in ("auto", "netem") and netem_available(probe_namespace):
        return "netem"
    if mode == "netem":
        raise TestbedError(
            "testbed delay mode 'netem': this kernel has no sch_netem "
            "(CONFIG_NET_SCH_NETEM); use delay='tap' (userspace delay line) or 'auto'"
        )
    return "tap"


def run_all(cmds: list[list[str]]) -> None:
    for cmd in cmds:
        run(cmd)
