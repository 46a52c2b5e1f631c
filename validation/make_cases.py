"""Write the validation case definitions (validation/cases/NAME/case.yaml). Measurements come from
`piper-sim validate --remeasure` (root: the cases run on the emulated testbeds).

    python validation/make_cases.py
"""

from __future__ import annotations

from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
TOPO = {"2g": "../../../topologies/testbed-2g.yaml", "flat": "../../../topologies/testbed-flat.yaml"}
MODEL = {"preset": "tiny-moe", "num_layers": 8, "seq_len": 128, "dtype": "fp32"}


def case(
    name, bed, *, schedule="1f1b", pp=2, ep=4, dp=1, vpp=1, a2a="flat", routing=None, migration=None, pair="", why=""
):
    config = {
        "model": MODEL,
        "schedule": schedule,
        "topology": TOPO[bed],
        "placement": "contiguous",
        "parallel": {"pp": pp, "ep": ep, "dp": dp, "vpp": vpp, "num_microbatches": 4, "micro_batch_size": 2},
        "collectives": {"all_to_all": a2a, "all_reduce": "ring"},
        "routing": routing or {"kind": "uniform"},
        "migration": migration or {"enabled": False},
        "sim": {"steps": 6, "seed": 0},
    }
    return name, {
        "description": why,
        "config": config,
        "testbed": TOPO[bed],
        "tolerance": {"step_time": 0.20},
        "pair": pair,
    }


CASES = [
    case(
        "2g-1f1b-pp2ep4-flat", "2g", pair="2g-uniform", why="baseline: 1F1B, EP groups span both dragonfly-like groups"
    ),
    case("2g-1f1b-pp2ep4-halo", "2g", a2a="halo", pair="2g-uniform", why="HALO vs flat over the slow global link"),
    case("2g-gpipe-pp2ep4-flat", "2g", schedule="gpipe", why="GPipe: all forwards then all backwards"),
    case("2g-zb-pp2ep4-flat", "2g", schedule="zb-h1", why="ZB-H1: split backward, deferred weight gradients"),
    case("2g-interleaved-pp2ep4-flat", "2g", schedule="interleaved-1f1b", vpp=2, why="interleaved 1F1B, 2 chunks"),
    case("2g-1f1b-pp4ep2-flat", "2g", pp=4, ep=2, why="deeper pipeline, EP group inside one node"),
    case("2g-1f1b-pp2ep2dp2-flat", "2g", ep=2, dp=2, why="data parallel replicas: expert-grad all-reduce over dp"),
    case(
        "2g-1f1b-pp2ep4-zipf-flat",
        "2g",
        routing={"kind": "zipf", "exponent": 1.2},
        pair="2g-zipf",
        why="skewed real router (zipf logit bias): stragglers in expert compute",
    ),
    case(
        "2g-1f1b-pp2ep4-zipf-halo",
        "2g",
        a2a="halo",
        routing={"kind": "zipf", "exponent": 1.2},
        pair="2g-zipf",
        why="skewed routing with HALO",
    ),
    case(
        "2g-1f1b-pp2ep4-zipf-migrate-flat",
        "2g",
        routing={"kind": "zipf", "exponent": 1.2},
        migration={"enabled": True, "policy": "greedy", "threshold": 1.2, "interval": 1},
        why="skewed routing with expert migration (greedy swaps after every step): the migration "
        "all-to-alls and the rebalanced expert loads",
    ),
    case("2g-1f1b-pp8ep1-flat", "2g", pp=8, ep=1, why="pure pipeline: no all-to-all, p2p over every link level"),
    case("flat-1f1b-pp2ep4-flat", "flat", pair="flat-uniform", why="single switch, no taper"),
    case("flat-1f1b-pp2ep4-halo", "flat", a2a="halo", pair="flat-uniform", why="HALO on a single switch"),
    case("flat-zb-pp4ep2-flat", "flat", schedule="zb-h1", pp=4, ep=2, why="ZB-H1 on the single switch"),
    case("flat-1f1b-pp1ep8-flat", "flat", pp=1, ep=8, why="pure expert parallelism over all 4 nodes"),
]


def main() -> None:
    for name, body in CASES:
        path = HERE / "cases" / name
        path.mkdir(parents=True, exist_ok=True)
        (path / "case.yaml").write_text(yaml.safe_dump(body, sort_keys=False))
    print(f"wrote {len(CASES)} cases under {HERE / 'cases'}")


if __name__ == "__main__":
    main()
