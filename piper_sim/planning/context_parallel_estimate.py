"""Context parallelism in the planner: the CP degrees its space tries and the estimator's price of the K/V ring.

Owns cp_degrees (the space) and ring_overlap_s (the estimator: a layer's attention and its ring run side by side,
so the pair takes the longer of the two, as the simulator's nonblocking ring tasks do; docs/context-parallel.md).
Pure: no simpy, torch.
"""

from __future__ import annotations

from piper_sim.collectives.sharded import ALL_GATHER, REDUCE_SCATTER
from piper_sim.workload.context_parallel import kv_bytes
from piper_sim.workload.model import ModelSpec

# The space tries CP degrees that leave each rank at least this many tokens of a sequence: Llama 3 405B's 128K
# stage ran CP 16 on sequences of 131,072 tokens, 8,192 a rank (Grattafiori et al. 2024, arXiv 2407.21783, Table 4).
MIN_TOKENS_PER_CP_RANK = 8192


def cp_degrees(model: ModelSpec, fixed: dict[str, tuple]) -> list[int]:
    """The CP degrees a plan may take: 1 and the powers of two whose 2 x cp chunks split the sequence into pieces
    of at least MIN_TOKENS_PER_CP_RANK / 2 (so long sequences only), or what --fix parallel.cp gives."""
    if "cp" in fixed:
        return sorted(c for c in fixed["cp"] if model.seq_len % (2 * c) == 0 or c == 1)
    out, c = [1], 2
    while model.seq_len // c >= MIN_TOKENS_PER_CP_RANK and model.seq_len % (2 * c) == 0:
        out.append(c)
        c *= 2
    return out


def ring_overlap_s(estimator, coster, compute_s: float, forward: bool) -> float:
    """One layer's attention (compute_s) with its CP ring beside it: the longer of the two. The ring's collectives
    run in the first CP group (ranks 0, tp, 2 tp, ...) as ring collectives: forward the K/V all-gather, backward
    the K/V all-gather and the dK/dV reduce-scatter (issued together on the same links: their times add)."""
    split, model = coster.split, estimator.model
    if split.cp == 1:
        return compute_s
    size = split.cp * kv_bytes(model, coster.tokens, split.tp)
    gpus = tuple(estimator.gpus[: split.cp * split.tp : split.tp])

    def ring_s(registry) -> float:
        return estimator._cached(
            ("cp", id(registry), gpus, size),
            lambda: estimator.phases_s(registry.get("ring")(size, list(gpus), estimator.topo), gpus),
        )

    ring = ring_s(ALL_GATHER) + (0.0 if forward else ring_s(REDUCE_SCATTER))
    return max(compute_s, ring)
