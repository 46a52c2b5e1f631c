"""--fix: the values a request pins its plans' knobs and shared settings to.

Owns parse_fixes (--fix KEY=VALUE[,VALUE...] -> {knob: allowed values}, each value checked and typed: a config key
(FIX_KEYS) or a knob name (plan_point.KNOB_NAMES)), the settings every plan of a request shares
(collectives.all_reduce, cost.flash_attention, cost.precision: SETTING_KEYS, one value each, taken out by
split_settings) and all_reduce_names (the all-reduce algorithms a plan can take). Pure: no simpy, torch.
"""

from __future__ import annotations

from piper_sim.collectives.algorithms import ALL_REDUCE, ALL_TO_ALL
from piper_sim.collectives.sharded import ALL_GATHER, REDUCE_SCATTER
from piper_sim.config import ZERO_STAGES
from piper_sim.errors import ConfigError
from piper_sim.planning.plan_point import KNOB_NAMES, SCHEDULE_NAMES
from piper_sim.workload.precision import PRECISIONS
from piper_sim.workload.recompute import RECOMPUTE_MODES

# --fix keys as users write them (config keys) -> knob
FIX_KEYS = {
    "parallel.pp": "pp",
    "parallel.ep": "ep",
    "parallel.dp": "dp",
    "parallel.vpp": "vpp",
    "parallel.tp": "tp",
    "parallel.etp": "etp",
    "parallel.sp": "sp",
    "parallel.cp": "cp",
    "parallel.dp_shard": "dp_shard",
    "parallel.micro_batch_size": "micro_batch_size",
    "parallel.num_microbatches": "num_microbatches",
    "schedule": "schedule",
    "collectives.all_to_all": "all_to_all",
    "collectives.overlap_all_to_all": "overlap_all_to_all",
    "recompute": "recompute",
    "optimizer.zero": "zero",
    "optimizer.reshard_after_forward": "reshard_after_forward",
}
# --fix keys of the settings every plan of a request shares (one value each) -> PlanRequest field
SETTING_KEYS = {
    "collectives.all_reduce": "all_reduce",
    "cost.flash_attention": "flash_attention",
    "cost.precision": "precision",
}
BOOLEAN_KNOBS = ("sp", "flash_attention", "reshard_after_forward", "overlap_all_to_all")


def parse_fixes(items: list[str]) -> dict[str, tuple]:
    """--fix KEY=VALUE[,VALUE...] -> {knob: allowed values}; KEY is a config key (parallel.pp) or a knob (pp);
    the settings (SETTING_KEYS) take one value each (split_settings takes them out)."""
    out: dict[str, tuple] = {}
    for item in items:
        key, sep, value = item.partition("=")
        knob = FIX_KEYS.get(key) or SETTING_KEYS.get(key) or (key if key in KNOB_NAMES else None)
        if not sep or knob is None or not value:
            raise ConfigError(
                "--fix",
                item,
                f"KEY=VALUE[,VALUE...] with KEY one of {', '.join(FIX_KEYS)}, "
                f"or KEY=VALUE with KEY one of {', '.join(SETTING_KEYS)}",
            )
        values = tuple(v.strip() for v in value.split(","))
        if knob in SETTING_KEYS.values() and len(values) != 1:
            raise ConfigError(
                f"--fix {key}",
                value,
                "one value: every plan of a request shares it (run the planner once per value to compare them)",
            )
        out[knob] = _fix_values(f"--fix {key}", knob, values)
    return out


def _fix_values(flag: str, knob: str, values: tuple[str, ...]) -> tuple:
    """One --fix's values, checked and typed."""
    if knob in BOOLEAN_KNOBS:
        flags = {"true": True, "false": False}
        bad = [v for v in values if v.lower() not in flags]
        if bad:
            raise ConfigError(flag, bad[0], "true or false")
        return tuple(flags[v.lower()] for v in values)
    names = {
        "schedule": SCHEDULE_NAMES,
        "all_to_all": tuple(ALL_TO_ALL.names()),
        "recompute": RECOMPUTE_MODES,
        "all_reduce": all_reduce_names(),
        "precision": PRECISIONS,
    }
    if knob in names:
        bad = [v for v in values if v not in names[knob]]
        if bad:
            raise ConfigError(flag, bad[0], f"one of {', '.join(names[knob])}")
        return values
    try:
        ints = tuple(int(v) for v in values)
    except ValueError:
        raise ConfigError(flag, ",".join(values), "positive integers") from None
    if knob == "zero" and any(v not in ZERO_STAGES for v in ints):
        raise ConfigError(flag, ",".join(values), ", ".join(map(str, ZERO_STAGES)))
    if knob != "zero" and any(v <= 0 for v in ints):
        raise ConfigError(flag, ",".join(values), "positive integers")
    return ints


def all_reduce_names() -> tuple[str, ...]:
    """collectives.all_reduce values a plan can take: those that also shard (ZeRO's reduce-scatter and all-gather,
    and sequence parallelism's, use the same algorithm)."""
    return tuple(n for n in ALL_REDUCE.names() if n in REDUCE_SCATTER and n in ALL_GATHER)


def split_settings(fixed: dict[str, tuple]) -> tuple[dict[str, tuple], dict[str, object]]:
    """parse_fixes' result -> (the knobs' fixes, {PlanRequest field: value} of the settings given)."""
    settings = {knob: values[0] for knob, values in fixed.items() if knob in SETTING_KEYS.values()}
    return {k: v for k, v in fixed.items() if k not in settings}, settings
