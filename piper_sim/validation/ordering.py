"""The order of validation cases by step time, as far as their measurements establish it.

A case's measurement is one or more sessions (each a `validate --remeasure` call), each of one or more rounds:
run r of every case of a session ran in round r, minutes apart from the others. Two cases are ordered by the
measurement when one ran faster in every round the two share (same session, same round), in every session
they share. Cases that share no round (measured in different sessions, or once each in one) are ordered when
every run of one was faster than every run of the other. Pairs the measurement does not order are near-ties
on the machine: their order changed from round to round or from session to session, so no prediction can be
held to one order for them. The strict check (any pair the prediction orders unlike the scored medians) is
kept beside this one. Pure: reads score dicts, imports nothing of piper-sim.
"""

from __future__ import annotations

Sessions = dict[str, list[float]]  # session id -> the step time of each round (s)


def shared_rounds(a: Sessions, b: Sessions) -> tuple[list[tuple[float, float]], int]:
    """The (a, b) step times of every round both cases ran, and how many sessions those rounds span.
    Sessions with a different number of rounds (not one remeasure call) are not paired."""
    shared = [s for s in a if s in b and len(a[s]) == len(b[s])]
    return [pair for s in shared for pair in zip(a[s], b[s], strict=True)], len(shared)


def measured_order(a: Sessions, b: Sessions) -> int:
    """-1 when the measurement orders a before b (a faster), +1 when b before a, 0 when it does not order them."""
    rounds, _ = shared_rounds(a, b)
    if rounds:
        if all(x < y for x, y in rounds):
            return -1
        return 1 if all(y < x for x, y in rounds) else 0
    runs_a, runs_b = [t for r in a.values() for t in r], [t for r in b.values() for t in r]
    if not runs_a or not runs_b:
        return 0
    if max(runs_a) < min(runs_b):
        return -1
    return 1 if max(runs_b) < min(runs_a) else 0


def order_swaps(scores: list[dict]) -> list[dict]:
    """Every pair of cases the prediction orders differently from the scored (median) measurements: the
    measured-faster case, the measured-slower one, how far apart they were measured (slower / faster - 1),
    whether their runs in the scored session overlap (the faster case's slowest run slower than the other's
    fastest; False when either was run once), rounds_faster ([rounds in which the faster case was faster,
    rounds both ran] over every session they share, None with no shared round), sessions (how many) and
    ordered (whether the measurement orders the pair at all: measured_order)."""
    out = []
    for i, a in enumerate(scores):
        for b in scores[i + 1 :]:
            fast, slow = (a, b) if a["measured_step_s"] <= b["measured_step_s"] else (b, a)
            if fast["predicted_step_s"] <= slow["predicted_step_s"]:
                continue
            fast_runs, slow_runs = fast.get("measured_runs_s") or [], slow.get("measured_runs_s") or []
            fast_sessions, slow_sessions = _sessions(fast), _sessions(slow)
            rounds, sessions = shared_rounds(fast_sessions, slow_sessions)
            out.append(
                {
                    "faster": fast["case"],
                    "slower": slow["case"],
                    "measured_gap": slow["measured_step_s"] / fast["measured_step_s"] - 1,
                    "runs_overlap": len(fast_runs) > 1 and len(slow_runs) > 1 and max(fast_runs) >= min(slow_runs),
                    "rounds_faster": [sum(f < s for f, s in rounds), len(rounds)] if len(rounds) > 1 else None,
                    "sessions": sessions,
                    "ordered": measured_order(fast_sessions, slow_sessions) != 0,
                }
            )
    return sorted(out, key=lambda x: x["measured_gap"])


def order_summary(scores: list[dict], swaps: list[dict]) -> dict:
    """How many pairs the measurement orders, and which of those the prediction orders the other way."""
    ordered = sum(
        measured_order(_sessions(a), _sessions(b)) != 0 for i, a in enumerate(scores) for b in scores[i + 1 :]
    )
    sessions = {s for score in scores for s in _sessions(score)}
    wrong = [f"{sw['faster']} < {sw['slower']}" for sw in swaps if sw["ordered"]]
    return {
        "pairs": len(scores) * (len(scores) - 1) // 2,
        "ordered_pairs": ordered,
        "swapped": wrong,
        "same": not wrong,
        "sessions": len(sessions),
    }


def _sessions(score: dict) -> Sessions:
    return score.get("measured_sessions") or {"": list(score.get("measured_runs_s") or [score["measured_step_s"]])}
