"""An emulated multi-node cluster on one Linux machine, built from a topology YAML (builder "testbed").

Nodes and switches become network namespaces; links become veth (or TAP) pairs shaped with tc, so
torch.distributed and plain sockets see the bandwidths and latencies the simulator models.

API (root and iproute2 needed; without them a TestbedUnavailable error says so):
  up(topology_yaml, prefix="pst", *, state_path=None, delay="auto", subnet=...) -> Testbed
  down(prefix="pst", *, state_path=None) -> dict of what was removed (idempotent; works after a crash)
  status(prefix="pst") -> dict
  exec_in(host, argv, prefix="pst") -> argv running inside a node's namespace
  measure_link(prefix, host_a, host_b, num_bytes) -> LinkMeasurement (TCP bandwidth and RTT)
  make_plan(topology, prefix) -> TestbedPlan (pure, no root)

Exports are loaded lazily so the helper processes (delay line, measurement peers) start fast.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "up": "emulator",
    "down": "emulator",
    "status": "emulator",
    "exec_in": "emulator",
    "load": "emulator",
    "Testbed": "emulator",
    "default_state_path": "emulator",
    "measure_link": "tcp_probe",
    "LinkMeasurement": "tcp_probe",
    "make_plan": "cluster_plan",
    "TestbedPlan": "cluster_plan",
    "TestbedError": "shell",
    "TestbedUnavailable": "shell",
    "unavailable_reason": "shell",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"piper_sim.testbed.{_EXPORTS[name]}"), name)
