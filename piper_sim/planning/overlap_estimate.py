"""The estimator's overlapped all-to-alls (collectives.overlap_all_to_all; schedule/lower_overlap.py).

Owns pair_s, the time of a forward and a backward of another micro-batch run as one interleaved pass, and
paired_shares, the share of each stage's forwards that run in such a pair (counted in the generator's own order, as
the lowering pairs them). Pure: no simpy, torch.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from piper_sim.schedule.generator_registry import SCHEDULES
from piper_sim.schedule.lower_overlap import combined_order, pairs
from piper_sim.workload.task_kinds import TaskKind


def pair_s(forward: Sequence[float], backward: Sequence[float], a2a_s: float, share: float = 0.0) -> float:
    """Seconds of a pair whose passes compute `forward` and `backward` (seconds of each piece, in the order each
    pass runs them) with one all-to-all of a2a_s between consecutive pieces of a pass. The pieces run in turn, the
    backward's first (lower_overlap.interleaved), one at a time; the all-to-alls run one at a time on the
    communication stream, each issued when the piece before it ends; a pass's next piece waits for its all-to-all.
    A piece runs at (1 - share) of its rate while an all-to-all runs beside it (share: the compute units the
    all-to-all's kernels hold, sim/busy_units.py)."""
    compute = comm = 0.0
    ready = [0.0, 0.0]  # when the backward's and the forward's next piece may start
    for i in range(max(len(forward), len(backward))):
        for x, passes in enumerate((backward, forward)):
            if i < len(passes):
                compute = _piece_end(max(compute, ready[x]), passes[i], comm, share)
                if i + 1 < len(passes):
                    comm = max(comm, compute) + a2a_s
                    ready[x] = comm
    return compute


def _piece_end(start: float, seconds: float, busy_until: float, share: float) -> float:
    """When compute of `seconds` from `start` ends, at (1 - share) of its rate until busy_until."""
    if share <= 0 or busy_until <= start:
        return start + seconds
    rate = 1.0 - share
    if start + seconds / rate <= busy_until:
        return start + seconds / rate
    return busy_until + seconds - (busy_until - start) * rate


@functools.lru_cache(maxsize=1024)
def paired_shares(schedule: str, pp: int, vpp: int, num_microbatches: int) -> tuple[float, ...]:
    """Per stage, the share of its forwards that the lowering pairs with the backward after them."""
    shares = []
    for program in SCHEDULES.get(schedule, "schedule")(pp, vpp, num_microbatches):
        order = combined_order(program) if pp == 1 else program
        forwards = sum(t.kind == TaskKind.FORWARD for t in order)
        paired = sum(pairs(a, b) for a, b in zip(order, order[1:], strict=False))
        shares.append(paired / forwards if forwards else 0.0)
    return tuple(shares)
