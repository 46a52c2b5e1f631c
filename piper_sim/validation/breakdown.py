"""Published breakdowns of a run's time, beside the prediction of the same pieces: what an error budget is checked on.

Owns BREAKDOWN_TERMS and predicted_breakdown(). A published run may carry `breakdown` (validation/published/
README.md): where it is published, `set` (overrides of the run's config for the measured setting, e.g. no
recomputation), `layer` (the layer index it times) and `terms_ms`, times in milliseconds of these terms:
- layer_forward, layer_backward: one transformer layer of one micro-batch, its tensor-parallel collectives and MoE
  all-to-alls included (the estimator's chunk walk over that layer alone);
- router_forward, experts_forward, moe_out_forward: one MoE layer's router (gate and dispatch permutation), local
  experts and combine ops (TaskCoster.op_s, balanced routing);
- all_to_all_forward: the layer's forward dispatch and combine all-to-alls;
- unmodelled: time the source names that piper-sim has no term for (predicted 0).
Must not import simpy or torch.
"""

from __future__ import annotations

from piper_sim.config import load_config
from piper_sim.errors import ConfigError
from piper_sim.planning.compute_estimate import _routed
from piper_sim.planning.estimate import config_estimator

BREAKDOWN_TERMS = (
    "layer_forward",
    "layer_backward",
    "router_forward",
    "experts_forward",
    "moe_out_forward",
    "all_to_all_forward",
    "unmodelled",
)


def predicted_breakdown(run_config: dict, breakdown: dict, name: str) -> list[dict]:
    """Rows (term, published_s, predicted_s) of one run's published breakdown."""
    terms = breakdown.get("terms_ms")
    if not isinstance(terms, dict) or not terms or not set(terms) <= set(BREAKDOWN_TERMS):
        raise ConfigError(f"{name}: breakdown.terms_ms", terms, f"a mapping of {', '.join(BREAKDOWN_TERMS)} to ms")
    cfg = load_config(run_config, [str(s) for s in breakdown.get("set", [])])
    estimator, point = config_estimator(cfg)
    layer = int(breakdown.get("layer", 0))
    coster = estimator.coster(point.micro_batch_size * cfg.model.seq_len, point.parallel.split)
    predicted = _predicted(estimator, point, coster, layer)
    return [
        {
            "name": name,
            "term": term,
            "published_s": float(ms) / 1e3,
            "predicted_s": predicted[term],
            "where": breakdown.get("where", ""),
        }
        for term, ms in terms.items()
    ]


def _predicted(estimator, point, coster, layer: int) -> dict[str, float]:
    forward, backward, weight, _, moe = estimator._chunk(coster, point.ep, (layer,), False, False, False)
    a2a = 2 * moe * estimator._all_to_all_s(point, coster.tokens)  # dispatch and combine
    out = {
        "layer_forward": forward + a2a,
        "layer_backward": backward + weight + a2a,
        "all_to_all_forward": a2a,
        "unmodelled": 0.0,
    }
    rows = estimator._expert_rows(point.ep, f"experts:{layer}", _routed(coster)) if moe else ()
    for op in ("router", "experts", "moe_out"):
        out[f"{op}_forward"] = coster.op_s(f"{op}:{layer}", rows if op == "experts" else ())[0] if moe else 0.0
    return out
