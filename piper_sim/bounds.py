"""Upper bounds on the integers of a config, checked before anything is built or allocated.

Every integer in a config is below INT_LIMIT (exact as a float, far beyond any size); the counts that size
the schedule, the simulation or an array have tighter limits, still far beyond any real run (COUNT_LIMITS,
by dotted key). A value beyond its bound is a ConfigError naming the key, not an OverflowError, a
MemoryError or a simulation that never ends.
"""

from __future__ import annotations

from piper_sim.errors import ConfigError

INT_LIMIT = 2**53
GPUS_LIMIT = 2**20  # a million GPUs: any parallel degree, GPU count or node count
COUNT_LIMITS = {
    **{f"parallel.{k}": GPUS_LIMIT for k in ("pp", "ep", "dp", "tp", "world_size")},
    "parallel.vpp": 2**10,
    "parallel.num_microbatches": 2**16,
    "parallel.micro_batch_size": 2**16,
    "sim.steps": 10**5,
}


def int_limit(key: str) -> int:
    return COUNT_LIMITS.get(key, INT_LIMIT)


def check_int_bounds(raw: object, where: str = "") -> None:
    """Walk a config (mappings and lists, without recursion) and refuse an integer beyond its key's bound."""
    stack = [(where, raw)]
    while stack:
        key, node = stack.pop()
        if isinstance(node, dict):
            stack.extend((f"{key}.{k}" if key else str(k), v) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((key, v) for v in node)
        elif isinstance(node, int) and not isinstance(node, bool):
            limit = int_limit(key)
            if abs(node) > limit:
                raise ConfigError(key, node, f"an integer of magnitude at most {limit:,}")
