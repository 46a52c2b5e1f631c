"""Multi-phase collectives run as reservations (one recorded run standing in for their phases while their links
stay otherwise idle) give the result of running every phase, up to float rounding, also when other flows
break into them."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from piper_sim.config import load_config
from piper_sim.network import CollectiveRunner
from piper_sim.simulator import simulate

CASES = {
    # HALO's sliced phases; the stages' nodes share a chassis' switches, and zero bubble's backward passes
    # overlap one stage's all-to-alls with another's, so some reservations are broken into
    "halo-frontier": {
        "model": {"preset": "small-moe", "num_experts": 16},
        "topology": "frontier",
        "collectives": {"all_to_all": "halo"},
        "schedule": "zb-h1",
        "parallel": {"pp": 4, "ep": 16, "num_microbatches": 8, "micro_batch_size": 8},
    },
    "ring-all-reduce-dp4": {"model": "small-moe", "parallel": {"pp": 2, "ep": 2, "dp": 4, "num_microbatches": 4}},
    "halo-zipf-migration": {
        "model": {"preset": "small-moe", "num_experts": 16},
        "topology": "frontier",
        "collectives": {"all_to_all": "halo"},
        "routing": {"kind": "zipf", "exponent": 1.2},
        "migration": {"enabled": True, "policy": "greedy"},
        "sim": {"steps": 2},
        "parallel": {"pp": 2, "ep": 16, "num_microbatches": 4},
    },
    # mean-field dragonfly detours (flows of weight 1/K); two EP groups on one chassis' switches start their
    # all-to-alls together, layer after layer (one reservation of their run together)
    "flat-frontier-spread": {
        "model": {"preset": "small-moe", "num_experts": 16},
        "topology": {"preset": "frontier", "params": {"valiant": "spread"}},
        "collectives": {"all_to_all": "flat"},
        "parallel": {"pp": 1, "ep": 16, "dp": 2, "num_microbatches": 4},
    },
    # a stage's tensor-parallel groups start their collectives together, each alone on its links, layer after
    # layer and micro-batch after micro-batch (a recurring batch: the runner's _batches)
    "tp-frontier-batches": {
        "model": "small-moe",
        "topology": "frontier",
        "parallel": {"pp": 2, "tp": 2, "sp": True, "ep": 4, "dp": 4, "num_microbatches": 6},
    },
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_reservations_give_the_run_of_every_phase(name, monkeypatch):
    reserved = simulate(load_config(CASES[name]))
    monkeypatch.setattr(CollectiveRunner, "reserves", False)
    every_phase = simulate(load_config(CASES[name]))
    assert reserved.stats["num_reserved"] > 0 and every_phase.stats["num_reserved"] == 0
    assert reserved.stats["num_solves"] < every_phase.stats["num_solves"]
    pd.testing.assert_frame_equal(reserved.trace, every_phase.trace, rtol=1e-9)
    assert reserved.stats["num_flows"] == every_phase.stats["num_flows"]
    pd.testing.assert_frame_equal(reserved.links, every_phase.links, rtol=1e-9)


def test_a_reservation_is_broken_when_other_flows_need_its_links():
    result = simulate(load_config(CASES["halo-frontier"]))
    assert 0 < result.stats["num_broken"] < result.stats["num_reserved"]


def test_a_recorded_phase_counts_every_rate_it_ran_at():
    import numpy as np

    from piper_sim.network.phase_run import PhaseFlows
    from piper_sim.network.recording import PhaseRecord

    flows = PhaseFlows(np.array([0, 1]), np.array([0, 0]), np.array([100.0, 10.0]))
    # 5 B/s each until t = 2, when flow 1 ends; two solves at that instant set 10, then 20 B/s for flow 0
    rec = PhaseRecord(
        start_s=0.0,
        end_s=6.5,
        flows=flows,
        finish_s=np.array([6.5, 2.0]),
        rates=[(0.0, np.array([5.0, 5.0])), (2.0, np.array([10.0, 0.0])), (2.0, np.array([20.0, 0.0]))],
    )
    remaining, finish = rec.state_at(4.0, np.array([10.0]))
    assert remaining.tolist() == [100.0 - 10.0 - 40.0, 0.0]
    assert np.isnan(finish[0]) and finish[1] == 2.0


def test_recorded_runs_are_kept_under_a_bound_on_their_sub_flows(monkeypatch):
    """RunMemo drops the oldest runs once the sub-flows they hold together pass the bound (or they pass the count):
    many small runs stay where a few large ones would not."""
    import numpy as np

    from piper_sim.network import recording
    from piper_sim.network.phase_run import PhaseFlows

    def run(sub_flows: int) -> recording.IsolatedRun:
        flows = PhaseFlows(np.zeros(sub_flows, dtype=np.int64), np.zeros(sub_flows, dtype=np.int64), np.ones(sub_flows))
        return recording.IsolatedRun(
            duration_s=1.0,
            links=np.zeros(1, dtype=np.int64),
            link_bytes=np.ones(1),
            num_flows=sub_flows,
            phases=[recording.PhaseRecord(flows=flows)],
        )

    monkeypatch.setattr(recording, "RECORDED_SUB_FLOWS", 1000)
    monkeypatch.setattr(recording, "RECORDED_RUNS", 50)
    memo = recording.RunMemo()
    for key in range(40):  # 40 runs of 9 sub-flows (10 with the entry's own weight): all kept
        memo.put(key, key, run(9))
    assert all(memo.get(key) == key for key in range(40))
    memo.put("large", "large", run(700))  # 400 + 701 held: the oldest go until the bound holds again
    assert memo.get("large") == "large"
    assert [memo.get(key) for key in range(11)] == [None] * 11 and memo.get(11) == 11
    for key in range(100, 160):  # the count bound: at most 50 runs
        memo.put(key, key, run(0))
    assert memo.get("large") is None and memo.get(159) == 159 and memo.get(109) is None and memo.get(110) == 110


def test_collectives_starting_together_are_grouped_by_shared_links_transitively():
    from piper_sim.network.recording import overlapping

    rng = np.random.default_rng(0)
    for _ in range(300):
        links = [
            np.unique(rng.integers(0, int(rng.integers(5, 120)), int(rng.integers(0, 6))))
            for _ in range(int(rng.integers(0, 10)))
        ]
        share = [[bool(np.intersect1d(a, b).size) for b in links] for a in links]
        reach = [{i} for i in range(len(links))]  # the transitive closure of sharing a link, by brute force
        for _ in links:
            reach = [set().union(*({j for j in range(len(links)) if share[k][j]} | {k} for k in r)) for r in reach]
        expected = sorted({tuple(sorted(r)) for r in reach})
        assert [tuple(g) for g in overlapping(links)] == expected


def test_a_replayed_run_lets_go_of_its_joined_incidences():
    """Recorder.replay runs collectives in a private flow network and stops it mid-run; the stopped network stays in
    reference cycles of its suspended processes until Python's cyclic collector runs (which counts objects, not the
    arrays they hold), so it must hold no joined incidence (fairshare.Structure) by then: DSV3-512F-rccl's replays of
    all-to-alls of mean-field detours held several GiB of them at once."""
    import gc

    from piper_sim.network import fairshare

    recorder, members = _two_members_on_a_shared_link()

    def structures() -> int:
        return sum(type(o) is fairshare.Structure for o in gc.get_objects())

    gc.collect()
    before = structures()
    gc.disable()
    try:
        state = recorder.replay(members)(5.0)
        assert len(state) == 2 and all(np.isnan(finish).all() for _, finish in state.values())
        assert structures() == before
    finally:
        gc.enable()


def _two_members_on_a_shared_link():
    """A recorder whose phases' flow i crosses link 0 (shared) and a link of its own, and two collectives of three
    flows each starting together on it."""
    from piper_sim.collectives.phases import Phase
    from piper_sim.network.phase_run import PhaseFlows
    from piper_sim.network.recording import Recorder, Starting

    def phase_flows(phase, gpus, key):
        n = phase.src.size
        links = np.stack([np.zeros(n, dtype=np.int64), 1 + phase.src], 1).ravel()
        flows = PhaseFlows(np.repeat(np.arange(n), 2), links, phase.sizes.astype(float), key=(key, phase.src.tobytes()))
        return None, flows, 0.0

    members = [
        Starting(
            [Phase(src=np.arange(3) + 3 * m, dst=np.arange(3), sizes=np.array([100.0, 200.0, 300.0]))],
            ("a", "b", "c", "d", "e", "f"),
            ("group", m),
            None,
        )
        for m in range(2)
    ]
    return Recorder(np.full(8, 100.0), phase_flows), members


def test_a_replayed_state_is_kept_by_the_collectives_contents_and_the_time(monkeypatch):
    """A reservation broken at the same moment of the same collectives' course (micro-batch after micro-batch) takes
    the state replayed before; the arrays are the caller's own (adopted flow sets send from them)."""
    from piper_sim.network.recording import Recorder, Starting

    recorder, members = _two_members_on_a_shared_link()
    fresh, _ = _two_members_on_a_shared_link()
    replays = []
    record_events = Recorder._record_events

    def counted(self, *args, **kwargs):
        replays.append(kwargs.get("until_s"))
        return record_events(self, *args, **kwargs)

    monkeypatch.setattr(Recorder, "_record_events", counted)
    first = recorder.replay(members)(2.5)
    for left, finish in first.values():
        left[:] = -1.0
        finish[:] = -1.0
    again = [Starting(list(c.phases), c.gpus, c.key, None) for c in members]  # the next micro-batch's: equal contents
    second = recorder.replay(again)(2.5)
    expected = fresh.replay(members)(2.5)
    assert replays == [2.5, 2.5]  # the recorder's first, then the fresh recorder's: the second came from the first
    assert second.keys() == expected.keys() == {(0, 0), (1, 0)}
    for where, (left, finish) in expected.items():
        assert (left > 0).all()
        np.testing.assert_array_equal(second[where][0], left)
        np.testing.assert_array_equal(second[where][1], finish)
    recorder.replay(members)(3.0)  # another moment: replayed
    assert replays == [2.5, 2.5, 3.0]


@pytest.mark.parametrize("kept_floats", [1 << 20, 4])
def test_collectives_run_together_keep_their_rates_where_few(kept_floats, monkeypatch):
    """A course of collectives run together keeps its solves' rates where they hold at most KEPT_COURSE_FLOATS
    values: a reservation of them that breaks finds each phase's state in its record, as a replay of the course
    finds it; past the bound the records keep none and the state is replayed."""
    from piper_sim.network import recording

    monkeypatch.setattr(recording, "KEPT_COURSE_FLOATS", kept_floats)
    recorder, members = _two_members_on_a_shared_link()
    runs, replay = recorder.run_together(members)
    assert (replay is None) == (kept_floats > 4)
    fresh, _ = _two_members_on_a_shared_link()
    for t in (3.0, 7.0, 11.0):  # the flows of 100 bytes end at 6 s, of 200 at 10 s, of 300 at 12 s (link 0 shared)
        replayed = fresh.replay(members)(t)
        for m, run in enumerate(runs):
            rec = run.phases[0]
            if replay is None:
                left, finish = rec.state_at(t, recorder.capacity)
                np.testing.assert_allclose(left, replayed[(m, 0)][0], rtol=1e-12, atol=1e-9)
                np.testing.assert_allclose(finish, replayed[(m, 0)][1], rtol=1e-12)  # NaN where not ended, in both
            else:
                assert rec.rates == []
                np.testing.assert_array_equal(replay(t)[(m, 0)][0], replayed[(m, 0)][0])


def test_a_recurring_batch_of_collectives_each_alone_is_found_whole(monkeypatch):
    """A stage's tensor-parallel groups start their collectives together, each alone on its links, layer after layer
    and micro-batch after micro-batch: the batch is found whole (the runner's _batches) and gives the run of
    finding each collective's recorded run anew."""
    from piper_sim.network import collective_runner

    cfg = CASES["tp-frontier-batches"]
    hits = []

    class Counted(collective_runner.RunMemo):
        def get(self, key):
            hit = super().get(key)
            hits.append(hit is not None)
            return hit

    class Never(collective_runner.RunMemo):
        def get(self, key):
            return None

    monkeypatch.setattr(collective_runner, "RunMemo", Counted)
    found = simulate(load_config(cfg))
    assert sum(hits) > len(hits) / 2  # most batches recur
    monkeypatch.setattr(collective_runner, "RunMemo", Never)
    anew = simulate(load_config(cfg))
    assert found.stats["num_reserved"] == anew.stats["num_reserved"] > 0
    pd.testing.assert_frame_equal(found.trace, anew.trace)
    pd.testing.assert_frame_equal(found.links, anew.links)
