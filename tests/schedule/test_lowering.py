"""Every generator, lowered with MoE all-to-alls and p2p, validates and runs without deadlock."""

from __future__ import annotations

import pytest

from piper_sim.config import load_config
from piper_sim.schedule.validate import check_schedule, dry_run
from piper_sim.simulator import build_schedule

GRID = [
    (sched, pp, vpp, m)
    for sched, vpps in (
        ("gpipe", (1, 2)),
        ("1f1b", (1,)),
        ("interleaved-1f1b", (2, 3)),
        ("zb-h1", (1,)),
        ("dualpipe", (2,)),
        ("dualpipe-v", (2,)),
    )
    for pp in (1, 2, 4)
    for vpp in vpps
    for m in (1, 4, 8)
    if not (sched == "interleaved-1f1b" and m % pp)
    and not (sched == "dualpipe" and (pp % 2 or m < 2 * pp))
    and not (sched == "dualpipe-v" and m < 2 * pp)
]


@pytest.mark.parametrize("schedule,pp,vpp,m", GRID)
def test_generators_lower_validate_and_dry_run(schedule, pp, vpp, m):
    cfg = load_config(
        {
            "model": {"preset": "small-moe", "num_layers": 12},
            "schedule": schedule,
            "parallel": {"pp": pp, "vpp": vpp, "ep": 2, "dp": 2, "num_microbatches": m},
        }
    )
    lowered = build_schedule(cfg)
    check_schedule(lowered)
    assert dry_run(lowered) > 0
    program = lowered.stage_programs[0]
    kinds = {t.kind for t in program}
    assert "all_to_all" in kinds and "optimizer" in kinds and "all_reduce" in kinds
    # four all-to-alls per MoE layer per microbatch (dispatch and combine, forward and backward)
    a2a = sum(t.kind == "all_to_all" for t in program)
    stages = lowered.stages  # a microbatch runs the chunks of its pipeline (all of them but in dualpipe)
    assert a2a == 4 * sum(
        len(lowered.stage_layers[stages.of(0, c)]) * stages.runs(0, c, mb, m) for c in range(vpp) for mb in range(m)
    )
