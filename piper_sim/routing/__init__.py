"""Expert routing: routing models (registry ROUTING), capacity and dropping, routing traces, imbalance metrics."""

from piper_sim.routing.capacity import RoutedCounts, expert_capacity
from piper_sim.routing.metrics import ImbalanceTracker, imbalance_factor, imbalance_factors
from piper_sim.routing.models import ROUTING, RoutingModel, routing_from_config
from piper_sim.routing.trace import RoutingTrace, TraceError, TraceRecorder, read_trace, write_trace

__all__ = [
    "ROUTING",
    "ImbalanceTracker",
    "RoutedCounts",
    "RoutingModel",
    "RoutingTrace",
    "TraceError",
    "TraceRecorder",
    "expert_capacity",
    "imbalance_factor",
    "imbalance_factors",
    "read_trace",
    "routing_from_config",
    "write_trace",
]
