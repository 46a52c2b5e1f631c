"""The measuring half of `piper-sim calibrate --check PROFILE`: one layer's ops of each model preset,
timed on N ranks at once through the torch backend's forward_op / backward_op as the executor runs them.

Owns the check's job and rank worker and measure_ops, the entry point piper_sim.calibrate.crosscheck
calls (it prices the same ops with the profile and compares). Imports torch; must not import
piper_sim.calibrate.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from piper_sim.torch_backend.local_launch import run_local

from .calibration_inputs import TimingPlan
from .runner import threads_per_rank
from .stage_ops import CHECK_OPS, MICRO_BATCH_SIZE, measure_op, prepare_stage


@dataclass(frozen=True)
class CheckJob:
    profile: str
    presets: tuple[str, ...]
    out_dir: str
    sample_s: float = 0.05


def check_worker(rank: int, world: int, job: CheckJob) -> None:
    torch.manual_seed(0)
    plan = TimingPlan(sample_s=job.sample_s, num_samples=7)
    rows = []
    for name in job.presets:
        spec, stage, before = prepare_stage(name)
        for op in CHECK_OPS:
            state = before[op]
            expert_rows = ()
            if op.startswith("experts:"):
                expert_rows = tuple(torch.bincount(state["recv_expert_ids"], minlength=spec.num_experts).tolist())
            rows.append(
                {
                    "model": name,
                    "op": op,
                    "tokens": MICRO_BATCH_SIZE * spec.seq_len,
                    "expert_rows": list(expert_rows),
                    **measure_op(stage, op, state, plan),
                }
            )
    Path(job.out_dir, f"check-rank{rank}.json").write_text(json.dumps(rows))


def measure_ops(
    profile_spec: str, presets: tuple[str, ...], ranks: int, timeout_s: float, threads: int | None = None
) -> list[list[dict]]:
    """Each rank's rows, one per (preset, op of CHECK_OPS): model, op, tokens, expert_rows (the real
    router's rows per expert, for the experts op), and measure_op's times and ATen op counts."""
    with tempfile.TemporaryDirectory(prefix="piper-check-") as tmp:
        job = CheckJob(profile=str(profile_spec), presets=presets, out_dir=tmp)
        run_local(check_worker, ranks, job, timeout_s=timeout_s, num_threads=threads_per_rank(ranks, threads))
        return [json.loads(Path(tmp, f"check-rank{r}.json").read_text()) for r in range(ranks)]
