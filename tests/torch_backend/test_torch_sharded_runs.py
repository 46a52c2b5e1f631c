"""Real runs of ZeRO-3 / FSDP and context-parallel plans compare with their simulation task by task, as the other
plans do (`piper-sim run`, `piper-sim simulate`, `piper-sim compare`); what a real run cannot do (full recomputation
under ZeRO-3, selective under CP, DeepSpeed's bucket all-reduces) is refused by name."""

from __future__ import annotations

import pytest
import yaml

from piper_sim.analysis.compare import compare_runs
from piper_sim.cli import main
from piper_sim.config import load_config
from piper_sim.errors import ConfigError
from piper_sim.measure import measure
from piper_sim.schedule.build import build_schedule

BASE = {
    "model": "tiny-moe",
    "cost": {"profile": "cpu-dev"},
    "sim": {"steps": 2, "seed": 0},
    "parallel": {"pp": 2, "ep": 2, "num_microbatches": 2, "micro_batch_size": 2},
}
PLANS = {
    "zero-3": {"optimizer": {"zero": 3}},
    "cp2": {"parallel": {**BASE["parallel"], "cp": 2}},
}


@pytest.mark.slow  # two real runs of 4 gloo ranks (about 30 s each on 2 cores)
@pytest.mark.parametrize("name", sorted(PLANS))
def test_a_real_run_and_its_simulation_match_task_by_task(name, tmp_path):
    config = tmp_path / f"{name}.yaml"
    config.write_text(yaml.safe_dump({**BASE, **PLANS[name]}))
    real, sim = tmp_path / "real", tmp_path / "sim"
    assert main(["run", str(config), "--out", str(real)]) == 0
    assert (
        main(
            [
                "simulate",
                str(config),
                "--out",
                str(sim),
                "--set",
                "routing.kind=trace",
                "--set",
                f"routing.path={real / 'routing.npz'}",
            ]
        )
        == 0
    )
    c = compare_runs(sim, real)
    schedule = build_schedule(load_config(config))
    tasks = sum(len(schedule.program(r)) for r in range(schedule.mesh.num_ranks))
    assert c.unmatched_predicted == 0 and c.unmatched_measured == 0
    assert c.matched_tasks == 2 * tasks  # every task of both steps, on both sides
    kinds = set(c.by_kind["kind"])
    assert {"all_gather", "reduce_scatter"} <= kinds  # the units' gathers and gradients, or the K/V ring


@pytest.mark.parametrize(
    ("plan", "key"),
    [
        ({"optimizer": {"zero": 3}, "recompute": "full"}, "recompute"),
        ({"parallel": {**BASE["parallel"], "cp": 2}, "recompute": "selective"}, "recompute"),
        ({"optimizer": {"zero": 1, "gradient_reduce": "deepspeed"}}, "optimizer.gradient_reduce"),
    ],
)
def test_what_a_real_run_cannot_do_is_refused_by_name(plan, key, tmp_path):
    with pytest.raises(ConfigError) as err:
        measure(load_config({**BASE, **plan}), tmp_path)
    assert err.value.key == key
