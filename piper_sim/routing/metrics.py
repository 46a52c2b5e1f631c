"""Load imbalance metrics (docs/routing.md, "Imbalance").

Load imbalance factor (LIF) of one EP group = max over mean of the tokens (expert rows) per EP rank;
1.0 is perfect balance, EP is the worst case (one rank gets everything). Per layer and step, loads are
summed over the step's microbatches before max/mean ("step LIF", what a migration policy sees); the
"microbatch LIF" is the mean over microbatches of each microbatch's max/mean, which is what paces the
all-to-alls and expert GEMMs. Groups holding the same layer (DP replicas) are averaged.
Must not import simpy or torch.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np


def imbalance_factor(tokens_per_rank: np.ndarray) -> float:
    """max / mean over the last axis; 1.0 when every rank is idle."""
    loads = np.asarray(tokens_per_rank, dtype=np.float64)
    mean = loads.mean()
    return float(loads.max() / mean) if mean > 0 else 1.0


def imbalance_factors(tokens_per_rank: np.ndarray) -> np.ndarray:
    """max / mean along the last axis of an array [..., rank]; 1.0 where the mean is 0."""
    loads = np.asarray(tokens_per_rank, dtype=np.float64)
    mean = loads.mean(axis=-1)
    out = np.ones_like(mean)
    np.divide(loads.max(axis=-1), mean, out=out, where=mean > 0)
    return out


class ImbalanceTracker:
    """Collects tokens per EP rank from the simulator and summarizes imbalance for the report.

    The simulator calls add(step, layer, group, microbatch, tokens_per_rank) once per dispatch (forward
    all-to-all) with tokens_per_rank from migration.dispatch (rows per destination rank).
    """

    def __init__(self) -> None:
        self._step_loads: dict[tuple[int, int, int], np.ndarray] = {}
        self._mb_lif: dict[tuple[int, int], list[float]] = defaultdict(list)

    def add(self, step: int, layer: int, group: int, microbatch: int, tokens_per_rank: np.ndarray) -> None:
        loads = np.asarray(tokens_per_rank, dtype=np.float64)
        key = (step, layer, group)
        acc = self._step_loads.get(key)
        self._step_loads[key] = loads.copy() if acc is None else acc + loads
        self._mb_lif[(step, layer)].append(imbalance_factor(loads))

    def step_loads(self, step: int, layer: int) -> dict[int, np.ndarray]:
        """Tokens per rank summed over the step's microbatches, per EP group."""
        return {g: v for (s, ly, g), v in self._step_loads.items() if s == step and ly == layer}

    def summary(self) -> dict:
        """JSON-ready: per_layer {layer: {lif, lif_max, microbatch_lif}}, per_step [{step, lif, lif_max}], overall."""
        by_layer: dict[int, list[float]] = defaultdict(list)
        by_step: dict[int, list[float]] = defaultdict(list)
        by_pair: dict[tuple[int, int], list[float]] = defaultdict(list)
        for (step, layer, _group), loads in sorted(self._step_loads.items()):
            by_pair[(step, layer)].append(imbalance_factor(loads))
        for (step, layer), values in by_pair.items():
            lif = float(np.mean(values))
            by_layer[layer].append(lif)
            by_step[step].append(lif)
        per_layer = {
            int(layer): {
                "lif": float(np.mean(v)),
                "lif_max": float(np.max(v)),
                "microbatch_lif": float(
                    np.mean([x for (_s, ly), xs in self._mb_lif.items() if ly == layer for x in xs])
                ),
            }
            for layer, v in sorted(by_layer.items())
        }
        per_step = [
            {"step": int(s), "lif": float(np.mean(v)), "lif_max": float(np.max(v))} for s, v in sorted(by_step.items())
        ]
        all_values = [x for v in by_layer.values() for x in v]
        overall = {
            "lif": float(np.mean(all_values)) if all_values else 1.0,
            "lif_max": float(np.max(all_values)) if all_values else 1.0,
            "microbatch_lif": float(np.mean([x for xs in self._mb_lif.values() for x in xs])) if self._mb_lif else 1.0,
        }
        return {"per_layer": per_layer, "per_step": per_step, "overall": overall}


def expert_load_imbalance(counts: np.ndarray) -> float:
    """max over mean of rows per expert (placement-free skew of one [source, expert] or [expert] array)."""
    loads = np.asarray(counts, dtype=np.float64)
    return imbalance_factor(loads.sum(axis=0) if loads.ndim == 2 else loads)
