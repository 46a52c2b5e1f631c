"""One candidate plan of the planner's space: every knob of a parallel plan.

Owns PlanPoint (pp, ep, dp, tp, etp, sp, vpp, micro-batch size, microbatches, schedule, all-to-all, activation
recomputation, ZeRO stage and its FSDP options, context parallelism), its label and the config sections it sets,
KNOB_NAMES, and the names the schedule and all-to-all knobs take by default (SCHEDULE_NAMES, A2A_NAMES). The space
that enumerates points is space.py; --fix parsing plan_fixes.py. Pure: no simpy, torch.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields

from piper_sim.workload.parallel import ParallelSpec
from piper_sim.workload.recompute import Recompute

SCHEDULE_NAMES = ("1f1b", "gpipe", "interleaved-1f1b", "zb-h1", "dualpipe", "dualpipe-v")
A2A_NAMES = ("flat", "halo")


@dataclass(frozen=True, kw_only=True)
class PlanPoint:
    pp: int
    ep: int
    dp: int
    vpp: int
    micro_batch_size: int
    num_microbatches: int
    schedule: str
    all_to_all: str
    recompute: str = "none"
    zero: int = 0
    tp: int = 1
    etp: int = 1
    sp: bool = False
    reshard_after_forward: bool = True  # ZeRO-3: FSDP2's (workload/fsdp.py)
    dp_shard: int = 0  # ZeRO-3 under HSDP: the ranks a shard spans (0: every data-parallel replica)
    cp: int = 1  # context parallelism (docs/context-parallel.md)
    overlap_all_to_all: bool = False  # MoE all-to-alls beside a paired pass's compute (schedule/lower_overlap.py)

    @property
    def num_gpus(self) -> int:
        return self.pp * self.ep * self.dp * self.etp

    @functools.cached_property
    def parallel(self) -> ParallelSpec:
        """The point's ParallelSpec (built once: the estimator and the memory model ask for it many times)."""
        return ParallelSpec(
            pp=self.pp,
            ep=self.ep,
            dp=self.dp,
            tp=self.tp,
            etp=self.etp,
            sp=self.sp,
            vpp=self.vpp,
            num_microbatches=self.num_microbatches,
            micro_batch_size=self.micro_batch_size,
            cp=self.cp,
            dp_shard=self.dp_shard,
        )

    def label(self) -> str:
        """Every knob that differs from its default: two points of one space never share a label."""
        vpp = f" vpp{self.vpp}" if self.vpp > 1 else ""
        tp = (
            (f" tp{self.tp}" if self.tp > 1 else "")
            + (f" etp{self.etp}" if self.etp > 1 else "")
            + (" sp" if self.sp else "")
            + (f" cp{self.cp}" if self.cp > 1 else "")
        )
        extra = (f" rc-{self.recompute}" if self.recompute != Recompute.NONE else "") + self.sharding_label()
        return (
            f"pp{self.pp} ep{self.ep} dp{self.dp}{tp}{vpp} mbs{self.micro_batch_size} x{self.num_microbatches} "
            f"{self.schedule} {self.all_to_all}{' overlapped' if self.overlap_all_to_all else ''}{extra}"
        )

    def sharding_label(self) -> str:
        """The label's ZeRO part: " z3", with " no-reshard" where ZeRO-3 keeps the units gathered after the forward."""
        return (
            (f" z{self.zero}" if self.zero else "")
            + ("" if self.reshard_after_forward else " no-reshard")
            + (f" hsdp{self.dp_shard}" if self.dp_shard else "")
        )

    def config_sections(self) -> dict:
        """The config sections this point sets (merged over the base config)."""
        return {
            "parallel": {
                "pp": self.pp,
                "ep": self.ep,
                "dp": self.dp,
                "tp": self.tp,
                "etp": self.etp,
                "sp": self.sp,
                "vpp": self.vpp,
                **({"cp": self.cp} if self.cp > 1 else {}),
                **({"dp_shard": self.dp_shard} if self.dp_shard else {}),
                "num_microbatches": self.num_microbatches,
                "micro_batch_size": self.micro_batch_size,
            },
            "schedule": self.schedule,
            "collectives": {
                "all_to_all": self.all_to_all,
                **({"overlap_all_to_all": True} if self.overlap_all_to_all else {}),
            },
            "recompute": self.recompute,
            "optimizer": {
                "zero": self.zero,
                **({} if self.reshard_after_forward else {"reshard_after_forward": False}),
            },
        }

    def as_row(self) -> dict:
        """The knobs by name (every field holds a plain value: no copy needed, unlike dataclasses.asdict)."""
        return {name: getattr(self, name) for name in KNOB_NAMES}


KNOB_NAMES = tuple(f.name for f in fields(PlanPoint))
