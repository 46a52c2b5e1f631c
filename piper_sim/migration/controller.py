"""Migration between simulated steps: config, trigger, and the event the simulator turns into traffic.

Config (`migration:` section; unknown keys are ConfigErrors naming migration.<key>):
  enabled                false: no migration at all (the default)
  policy                 none | greedy | lpt (policies.py)
  threshold              migrate a layer when its load imbalance factor (max / mean of rank loads
                         over the window) exceeds this (>= 1)
  interval               check every N steps: after steps N-1, 2N-1, ...; the window is the N steps
                         since the previous check
  max_swaps              swap limit per layer and check (greedy; lpt's refinement uses at least E)
  state_bytes_per_param  bytes moved per expert parameter (16: weight, grad, master, Adam m and v)
  min_gain               keep a layer's map unless the policy lowers its max rank load by at least
                         this fraction (0: Piper's rule, any improvement moves)
Loads are the rows routed to each expert, summed over microbatches, sources and the EP groups that hold
the layer (they share one map). Pure numpy: no simpy, no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from piper_sim.errors import ConfigError
from piper_sim.migration.expert_placement import ExpertPlacement, rank_loads
from piper_sim.migration.moved_bytes import Move, placement_moves, total_bytes
from piper_sim.migration.policies import POLICIES, rebalance
from piper_sim.routing.metrics import imbalance_factor
from piper_sim.units import is_finite_number


@dataclass(frozen=True, kw_only=True)
class MigrationSpec:
    enabled: bool = False
    policy: str = "greedy"
    threshold: float = 1.2
    interval: int = 1
    max_swaps: int = 16
    state_bytes_per_param: int = 16
    min_gain: float = 0.0

    @property
    def active(self) -> bool:
        return self.enabled and self.policy != "none"


def _check(key: str, value: Any, ok: bool, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"migration.{key}", value, allowed)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def migration_from_config(raw: Mapping[str, Any] | None) -> MigrationSpec:
    raw = dict(raw or {})
    defaults = MigrationSpec()
    allowed = sorted(defaults.__dataclass_fields__)
    for key in raw:
        _check(key, raw[key], key in allowed, f"a migration key: one of {', '.join(allowed)}")
    spec = {k: raw.get(k, getattr(defaults, k)) for k in allowed}
    _check("enabled", spec["enabled"], isinstance(spec["enabled"], bool), "true or false")
    _check("policy", spec["policy"], spec["policy"] in POLICIES, f"one of {', '.join(POLICIES.names())}")
    threshold = spec["threshold"]
    _check(
        "threshold",
        threshold,
        is_finite_number(threshold) and threshold >= 1,
        "a finite number >= 1 (load imbalance factor, max / mean)",
    )
    _check("interval", spec["interval"], _is_int(spec["interval"]) and spec["interval"] >= 1, "an integer >= 1")
    _check("max_swaps", spec["max_swaps"], _is_int(spec["max_swaps"]) and spec["max_swaps"] >= 0, "an integer >= 0")
    sbp = spec["state_bytes_per_param"]
    _check("state_bytes_per_param", sbp, _is_int(sbp) and sbp > 0, "a positive integer (16: Piper's convention)")
    gain = spec["min_gain"]
    _check("min_gain", gain, is_finite_number(gain) and 0 <= gain < 1, "a fraction in [0, 1)")
    return MigrationSpec(
        enabled=spec["enabled"],
        policy=str(spec["policy"]),
        threshold=float(threshold),
        interval=spec["interval"],
        max_swaps=spec["max_swaps"],
        state_bytes_per_param=sbp,
        min_gain=float(gain),
    )


@dataclass(frozen=True, kw_only=True)
class LayerDecision:
    layer: int
    lif_before: float  # imbalance factor of the window's loads under the old map
    lif_after: float  # the same loads under the new map
    triggered: bool  # lif_before > threshold
    swaps: int
    moved: int  # experts whose owner changed


@dataclass(frozen=True, kw_only=True)
class MigrationEvent:
    """What happened after `step`: the simulator moves `moves` in every EP group, then uses `placement`."""

    step: int
    checked: bool  # an interval boundary: imbalance was evaluated
    decisions: tuple[LayerDecision, ...]
    moves: tuple[Move, ...]
    placement: ExpertPlacement

    @property
    def bytes_per_group(self) -> int:
        """Bytes moved inside one EP group (every group holding the layers moves the same)."""
        return total_bytes(self.moves)

    @property
    def migrated(self) -> bool:
        return bool(self.moves)


def migration_step(
    spec: MigrationSpec, placement: ExpertPlacement, loads: Mapping[int, np.ndarray], step: int, bytes_per_expert: int
) -> MigrationEvent:
    """Decide one check: for each layer with loads, rebalance if its imbalance exceeds the threshold."""
    decisions = []
    new = placement
    for layer in placement.layers:
        if layer not in loads:
            continue
        expert_loads = np.asarray(loads[layer], dtype=np.float64)
        owners = placement.owners(layer)
        before = imbalance_factor(rank_loads(expert_loads, owners, placement.ep))
        triggered = spec.active and before > spec.threshold
        swaps, after, new_owners = 0, before, owners
        if triggered:
            result = rebalance(spec.policy, expert_loads, owners, placement.ep, spec.max_swaps)
            if result.max_after <= (1 - spec.min_gain) * result.max_before:
                new_owners, swaps = result.owners, result.swaps
            after = imbalance_factor(rank_loads(expert_loads, new_owners, placement.ep))
            if not np.array_equal(new_owners, owners):
                new = new.with_owners(layer, new_owners)
        decisions.append(
            LayerDecision(
                layer=layer,
                lif_before=before,
                lif_after=after,
                triggered=triggered,
                swaps=swaps,
                moved=int(np.count_nonzero(new_owners != owners)),
            )
        )
    moves = placement_moves(placement, new, bytes_per_expert) if new is not placement else ()
    return MigrationEvent(step=step, checked=True, decisions=tuple(decisions), moves=moves, placement=new)


class Migrator:
    """Stateful driver for a multi-step simulation.

    migrator = Migrator(spec, ExpertPlacement.contiguous(model.moe_layer_indices, E, ep), expert_state_bytes(model))
    each dispatch:   migrator.observe(layer, routed.routed.sum(axis=0))      # rows per expert
    after each step: event = migrator.end_of_step(step); move event.moves; placement = event.placement
    """

    def __init__(self, spec: MigrationSpec, placement: ExpertPlacement, bytes_per_expert: int) -> None:
        self.spec, self.placement, self.bytes_per_expert = spec, placement, bytes_per_expert
        self._loads: dict[int, np.ndarray] = {}
        self.events: list[MigrationEvent] = []

    def observe(self, layer: int, expert_rows: np.ndarray) -> None:
        rows = np.asarray(expert_rows, dtype=np.float64)
        acc = self._loads.get(layer)
        self._loads[layer] = rows.copy() if acc is None else acc + rows

    def end_of_step(self, step: int) -> MigrationEvent:
        if (step + 1) % self.spec.interval:
            event = MigrationEvent(step=step, checked=False, decisions=(), moves=(), placement=self.placement)
        else:
            event = migration_step(self.spec, self.placement, self._loads, step, self.bytes_per_expert)
            self._loads = {}
            self.placement = event.placement
        self.events.append(event)
        return event

    def summary(self) -> dict:
        """JSON-ready totals for the report: checks, migrations, experts and bytes moved per EP group."""
        moved = [e for e in self.events if e.migrated]
        policy = self.spec.policy if self.spec.enabled else "none"
        return {
            "policy": policy,
            "checks": sum(e.checked for e in self.events),
            "migrations": len(moved),
            "experts_moved": sum(len(e.moves) for e in moved),
            "bytes_moved_per_group": sum(e.bytes_per_group for e in moved),
            "per_step": [
                {"step": e.step, "experts_moved": len(e.moves), "bytes_per_group": e.bytes_per_group}
                for e in self.events
            ],
        }
