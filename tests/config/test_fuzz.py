"""A bounded run of the fuzz harness (tests/fuzz/run.py): every family of hostile input, each case a piper-sim
subprocess; no traceback, no hang, no invalid input accepted, every refusal one short line naming the key.
`python tests/fuzz/run.py --cases 1000` is the full run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fuzz"))
from cases import FAMILIES, Case, generate  # noqa: E402
from run import DEFECTS, classify, run_cases, summary  # noqa: E402

CASES = len(FAMILIES)  # each family once: the quick loop (about 25 s on 2 cores)
SWEEP_CASES = 6 * len(FAMILIES)  # the slow sweep: each family six times


def _assert_clean(cases: list[Case]) -> None:
    outcomes = run_cases(cases, jobs=2, timeout_s=60.0)
    defects = [
        f"{o.kind}: {o.case.label()}: piper-sim {' '.join(o.case.argv)[:160]}: {o.detail}"
        for o in outcomes
        if o.kind in DEFECTS
    ]
    assert not defects, summary(outcomes) + "\n" + "\n".join(defects)


def test_fuzzed_inputs_give_clean_errors_or_results() -> None:
    _assert_clean(generate(CASES, seed=23, spread=True))


@pytest.mark.slow
def test_a_larger_sweep_gives_clean_errors_or_results() -> None:
    _assert_clean(generate(SWEEP_CASES, seed=41, spread=True))


def test_the_classifier_sees_each_kind_of_defect() -> None:
    invalid = Case("t", ["simulate"], True, "parallel.pp")
    assert classify(invalid, None, "")[0] == "hang"
    assert classify(invalid, 1, "Traceback (most recent call last):\n  ...\nTypeError: x")[0] == "traceback"
    assert classify(invalid, -9, "")[0] == "traceback"
    assert classify(invalid, 0, "")[0] == "accepted"
    assert classify(invalid, 2, "piper-sim: error: sim.steps: got 0; allowed: ...")[0] == "unclear"
    assert classify(invalid, 2, "piper-sim: error: parallel.pp: got 0\nmore")[0] == "unclear"
    assert classify(invalid, 2, "piper-sim: error: parallel.pp: got 0; allowed: a positive integer")[0] == "clean"
    assert classify(Case("t", ["presets"], False), 2, "piper-sim: error: x")[0] == "rejected"
    assert classify(Case("t", ["presets"], False), 0, "")[0] == "ok"
