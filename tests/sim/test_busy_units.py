"""Compute beside an issued collective's kernels runs on the compute units they leave (sim/busy_units.py)."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from piper_sim.config import load_config
from piper_sim.errors import ConfigError
from piper_sim.sim.busy_units import BusyUnits
from piper_sim.simulator import simulate
from piper_sim.workload.profile_load import load_profile


def run(seconds, clock, ends_at: float | None, share: float = 0.5):
    """Members' compute from `clock`, beside a collective holding `share` of the units that ends at ends_at."""
    env = simpy.Environment()
    busy = BusyUnits(env)
    clock = np.array(clock, dtype=float)
    if ends_at is not None:
        done = env.event()
        env.timeout(ends_at).callbacks.append(lambda _ev: done.succeed())
        busy.hold(0, done, share)

    def lane():
        if busy.holding(0):
            yield from busy.compute(0, clock, seconds)
        else:
            clock[:] += seconds

    env.process(lane())
    env.run()
    return clock.tolist()


def test_compute_runs_slower_while_the_collective_runs_then_at_full_rate():
    # 3 s of work from 0: 2 s at half rate (1 s done), then 2 s at full rate
    assert run(3.0, [0.0], ends_at=2.0) == [4.0]
    # 1 s of work ends before the collective: all at half rate
    assert run(1.0, [0.0], ends_at=10.0) == [2.0]
    # members from their own clocks: one starts after the collective ended
    assert run(np.array([3.0, 1.0]), [0.0, 5.0], ends_at=2.0) == [4.0, 6.0]
    # members of different work: one ends beside the collective (its own end kept), the other after it
    assert run(np.array([1.0, 3.0]), [0.0, 0.0], ends_at=4.0) == [2.0, 5.0]
    # nothing held: the work as it is
    assert run(3.0, [1.0], ends_at=None) == [4.0]


def overlapped(units: int | None):
    topology = {"preset": "dgx-h100-superpod", "params": {}}
    raw = {
        "model": {"preset": "small-moe", "num_layers": 8},
        "topology": topology,
        "cost": {"profile": "h100"},
        "schedule": "interleaved-1f1b",
        "parallel": {"pp": 2, "vpp": 2, "ep": 8, "num_microbatches": 8, "micro_batch_size": 2},
        "collectives": {"all_to_all": "nccl", "all_reduce": "nccl", "overlap_all_to_all": True},
    }
    if units is not None:
        raw["topology"] = {"preset": "dgx-h100-superpod", "collectives": {"nccl": {"compute_units": units}}}
    return load_config(raw)


def test_a_library_that_holds_more_units_slows_the_overlapped_pairs_more():
    steps = [simulate(overlapped(units)).report.step_time_s for units in (1, 16, 64)]
    assert steps[0] < steps[1] < steps[2]


def test_compute_units_must_be_a_positive_integer():
    with pytest.raises(ConfigError) as err:
        simulate(overlapped(0))
    assert err.value.key == "topology.collectives.nccl.compute_units"
    with pytest.raises(ConfigError) as err:
        load_profile({"extends": "h100", "compute_units": 1.5})
    assert err.value.key == "cost.profile.compute_units"


@pytest.mark.parametrize("routing", [{"kind": "uniform"}, {"kind": "zipf", "exponent": 1.0}], ids=["uniform", "zipf"])
def test_lanes_time_compute_beside_collectives_as_one_process_per_rank_does(routing):
    """Overlapped pairs on DGX H100 (DeepEP's SMs held), uniform and skewed routing: the lanes' run is the per-rank
    run, task by task."""
    raw = {
        "model": {"preset": "small-moe", "num_layers": 8},
        "topology": "dgx-h100-superpod",
        "cost": {"profile": "h100"},
        "schedule": "interleaved-1f1b",
        "parallel": {"pp": 2, "vpp": 2, "ep": 8, "dp": 2, "num_microbatches": 8, "micro_batch_size": 2},
        "routing": routing,
        "optimizer": {"zero": 1},
        "collectives": {"all_to_all": "deepep", "all_reduce": "nccl", "overlap_all_to_all": True},
    }
    lanes = simulate(load_config(raw))
    ranks = simulate(load_config({**raw, "sim": {"collapse": False}}))
    assert lanes.stats["num_lanes"] < ranks.stats["num_lanes"] == 32
    a, b = (r.trace.sort_values(["rank", "step", "task_id"]).reset_index(drop=True) for r in (lanes, ranks))
    assert np.allclose(a["start_s"], b["start_s"], rtol=1e-12, atol=1e-15)
    assert np.allclose(a["end_s"], b["end_s"], rtol=1e-12, atol=1e-15)
