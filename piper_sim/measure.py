"""The real backend: a Config (and its lowered Schedule) run by torch.distributed ranks, to a RunResult.

Owns turning what the ranks recorded (task rows, losses, memory) into the same RunResult the simulator
returns. The ranks receive the schedule built here; they do not rebuild it. torch is reached only
through piper_sim.torch_backend.training_run (imported when a run starts).
"""

from __future__ import annotations

from pathlib import Path

from piper_sim.analysis.run_report import make_report
from piper_sim.config import Config, for_devices
from piper_sim.errors import ConfigError
from piper_sim.machine import build_machine
from piper_sim.result import RunResult, steps_frame
from piper_sim.schedule.build import build_schedule
from piper_sim.schedule.ir import Schedule
from piper_sim.trace.runtrace import normalize
from piper_sim.workload.deepspeed_zero import DEEPSPEED
from piper_sim.workload.recompute import DEFAULT_SELECTIVE_MODULES, Recompute

# a real run's first step pays one-time costs (allocation, first calls, connections): left out of its figures
# where the run has more steps (analysis/run_report.py)
WARMUP_STEPS = 1
# activations are counted on step 0 only (docs/torch-backend.md)
MEASURED_MEMORY_KIND = "tensor accounting on step 0: params, grads, Adam moments, autograd-saved activations"


def measure(
    cfg: Config,
    work_dir: Path,
    *,
    schedule: Schedule | None = None,
    timeout_s: float = 600.0,
    testbed: str | None = None,
    progress: bool = False,
) -> RunResult | None:
    """Run the config's steps on real ranks (local gloo/nccl, under torchrun, or in the emulated testbed
    named by its prefix); the ranks write their records under work_dir/ranks/ and the real router's
    decisions to work_dir/routing.npz. None on a torchrun rank other than 0 (rank 0 returns the run).
    progress: a progress line of the ranks' steps done on stderr (piper_sim.progress)."""
    from piper_sim.torch_backend.training_run import launch  # torch: loaded only when measuring

    cfg = for_devices(cfg, run_devices())  # a CPU run's MFU is against a CPU profile's peak
    if cfg.model.fp8_recipe:  # its linears are torch's, in the model's dtype
        raise ConfigError(
            "cost.precision",
            "fp8",
            "bf16 for real runs (the torch backend runs no fp8 GEMMs, and this "
            "machine's CPUs have none; simulate prices fp8)",
        )
    if cfg.zero == 3 and cfg.recompute == Recompute.FULL:  # its recompute tasks re-run each unit from the unit's input
        raise ConfigError(
            "recompute",
            "full",
            "none or selective with optimizer.zero 3 for real runs (ZeRO-3 "
            "recomputes each unit inside its backward, from a per-unit checkpoint the torch backend "
            "does not keep; simulate prices it)",
        )
    if cfg.parallel.cp > 1 and cfg.recompute == Recompute.SELECTIVE:  # it re-runs a core without the K/V ring
        raise ConfigError(
            "recompute",
            "selective",
            "none or full with parallel.cp > 1 for real runs (the torch "
            "backend's selective recomputation re-runs the attention core without its K/V ring)",
        )
    if cfg.gradient_reduce == DEEPSPEED:  # its ZeRO shards are the classes the schedule reduce-scatters
        raise ConfigError(
            "optimizer.gradient_reduce",
            cfg.gradient_reduce,
            "reduce-scatter for real runs (the torch backend shards ZeRO-1/2 state by the schedule's "
            "reduce-scatters; simulate prices DeepSpeed's bucket all-reduces)",
        )
    if cfg.model.dropout:  # the real run would not compare, task by task, with a single process or the simulator
        raise ConfigError("model.dropout", cfg.model.dropout, "0 for real runs (the torch backend runs no dropout)")
    if cfg.recompute_checkpoint_layers is not None:  # its recompute tasks re-run whole chunks from their input
        raise ConfigError(
            "recompute_checkpoint_layers",
            cfg.recompute_checkpoint_layers,
            "unset for real runs (the torch backend checkpoints each pipeline chunk's input)",
        )
    if cfg.recompute_modules not in ((), DEFAULT_SELECTIVE_MODULES):  # its selective recompute re-runs the core
        raise ConfigError(
            "recompute_modules",
            list(cfg.recompute_modules),
            "left out or [core_attn] for real runs (the torch backend's selective recomputation re-runs "
            "the attention core only; simulate prices layernorm and moe_act)",
        )
    schedule = schedule or build_schedule(cfg)
    par = cfg.parallel
    machine = build_machine(cfg)  # the ranks' nodes, and the profile whose peak the MFU is over
    launched = launch(cfg, schedule, work_dir, machine=machine, timeout_s=timeout_s, testbed=testbed, progress=progress)
    if launched is None:
        return None
    rows, losses, wall, memory, device = launched
    trace = normalize(rows)
    per_stage = par.num_gpus // par.pp

    def per_stage_max(key: str) -> list[float]:
        return [float(max(m[key] for m in memory[p * per_stage : (p + 1) * per_stage])) for p in range(par.pp)]

    profile = machine.profile
    on_gpus = all(m.get("peak_device_bytes") is not None for m in memory)  # torch.cuda.max_memory_allocated
    report = make_report(
        trace,
        num_gpus=par.num_gpus,
        peak_flops_per_s=profile.peak_flops_per_s,
        tokens_per_step=par.sequences_per_step * cfg.model.seq_len,
        peak_memory_by_stage=per_stage_max("peak_tensor_bytes"),
        backend="torch",
        device=device,
        losses=losses,
        run_wall_s=wall,
        peak_memory_kind=MEASURED_MEMORY_KIND,
        peak_rss_bytes=per_stage_max("peak_rss_bytes"),
        mfu_peak_profile=profile.name,
        testbed=testbed,
        warmup_steps=WARMUP_STEPS if cfg.steps > WARMUP_STEPS else 0,
        peak_device_memory_bytes=per_stage_max("peak_device_bytes") if on_gpus else None,
    )
    return RunResult(
        backend="torch", config=cfg, schedule=schedule, report=report, tasks=trace, steps=steps_frame(report)
    )


def run_devices() -> str | None:
    """What a real run's ranks compute on where it decides the cost profile ("cpu", or None on GPUs)."""
    from piper_sim.torch_backend.training_run import run_devices as devices  # torch: loaded only when measuring

    return devices()
