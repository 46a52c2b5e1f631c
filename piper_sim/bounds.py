"""Upper bounds on the numbers of a config, and the typed reader every section's values go through, checked
before anything is built or allocated.

Every integer in a config is below INT_LIMIT (exact as a float, far beyond any size); the counts that size
the schedule, the simulation or an array have tighter limits, still far beyond any real run (COUNT_LIMITS,
by dotted key; a model's fields: MODEL_LIMITS, whether they come from YAML or an HF config.json). A value
beyond its bound is a ConfigError naming the key, not an OverflowError, a MemoryError or a simulation that
never ends. read_int, read_number and check_value (a nested section against its shape: a profile's measurements)
read a user's values: a wrong type or an out-of-range number is one ConfigError naming the user's dotted key.
"""

from __future__ import annotations

import math

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
# a model's integer fields (ModelSpec), far beyond any published model; fields not named: DIM_LIMIT
DIM_LIMIT = 2**22
MODEL_LIMITS = {
    "num_layers": 2**14,
    "num_dense_layers": 2**14,
    "moe_layer_freq": 2**14,
    "moe_layer_offset": 2**14,
    "num_experts": 2**16,
    "num_shared_experts": 2**10,
    "top_k": 2**10,
    "seq_len": 2**24,
    "vocab_size": 2**24,
    "d_model": 2**20,
    "num_heads": 2**14,
    "num_kv_heads": 2**14,
}
UNITS_LIMIT = 2**20  # a device's compute units (SMs, CUs), or those a collective's kernels hold: far beyond any
NUMBER_LIMIT = 1e18  # a plain number (a factor, a count of bytes per parameter): finite and at most this


def model_limit(field: str) -> int:
    """The largest value of a ModelSpec integer field."""
    return MODEL_LIMITS.get(field, DIM_LIMIT)


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


def read_int(key: str, value: object, *, low: int = 0, limit: int = INT_LIMIT) -> int:
    """An integer (not a bool) from low to limit, or a ConfigError naming key."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= limit:
        raise ConfigError(key, value, f"an integer from {low:,} to {limit:,}")
    return int(value)


def read_number(
    key: str, value: object, *, low: float = 0.0, high: float = NUMBER_LIMIT, low_open: bool = False
) -> float:
    """A finite int or float (not a bool) in [low, high] ((low, high] with low_open), or a ConfigError naming key."""
    number = _as_float(value) if isinstance(value, int | float) and not isinstance(value, bool) else math.nan
    if not (math.isfinite(number) and (low < number if low_open else low <= number) and number <= high):
        raise ConfigError(
            key, value, f"a number {'above' if low_open else 'from'} {low:g} {'up ' if low_open else ''}to {high:g}"
        )
    return number


def _as_float(value: int | float) -> float:
    try:
        return float(value)
    except OverflowError:
        return math.inf


Shape = object  # a type (int, float, str, dict, list), [Shape] (a list of those), {name: Shape} ("*": any name)
_SHAPE_WORDS: dict[Shape, str] = {dict: "a mapping", list: "a list", str: "text"}  # a mismatch's expected value


def check_value(value: object, shape: Shape, key: str) -> None:
    """Check a nested value against a shape (`Shape`), without recursion: a mapping's keys that the shape names
    (or every key, for "*") have the shape's types; keys it does not name are left alone; null stands for a
    value left out. Numbers are finite and within NUMBER_LIMIT. A mismatch is a ConfigError naming the dotted key."""
    stack = [(value, shape, key)]
    while stack:
        node, want, where = stack.pop()
        if node is None:
            continue
        if isinstance(want, dict):
            if not isinstance(node, dict):
                raise ConfigError(where, node, "a mapping")
            for name, sub in node.items():
                inner = want.get(name, want.get("*")) if isinstance(name, str) else None
                if inner is not None:
                    stack.append((sub, inner, f"{where}.{name}"))
        elif isinstance(want, list):
            if not isinstance(node, list):
                raise ConfigError(where, node, "a list")
            stack.extend((item, want[0], where) for item in node)
        elif want is float:
            read_number(where, node, low=-NUMBER_LIMIT)
        elif want is int:
            read_int(where, node, low=-INT_LIMIT)
        elif not isinstance(node, want):  # type: ignore[arg-type]
            raise ConfigError(where, node, _SHAPE_WORDS.get(want, str(want)))
