"""A torchtitan job TOML (torchtitan's TOML configs, up to its 2026 move to Python config registries) -> a piper-sim
config (docs/importing.md).

Owns the translation of [parallelism], [training] and [activation_checkpoint] as torchtitan reads them
(torchtitan/config/job_config.py, distributed/parallel_dims.py, pipeline_parallel.py, activation_checkpoint.py).
torchtitan's device mesh folds the experts out of the dense mesh as Megatron-core does (dense: pp x dp_replicate x
fsdp x tp; experts: pp x dp_replicate x efsdp x ep x etp), so the plan is written in Megatron's counting. The model's
shapes live in torchtitan's code, not the TOML: they come from --model or the HF config.json under
[model] hf_assets_path. No I/O beyond reading that file's existence and the TOML.
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path

from piper_sim.bounds import GPUS_LIMIT, int_limit
from piper_sim.config import load_config
from piper_sim.errors import ConfigError
from piper_sim.importers.imported import Imported, Translation, config_keys_as, split_unread
from piper_sim.importers.source import Source, table_source
from piper_sim.workload.presets import load_model

# sections that set no shape, plan or kernel
NO_BEARING = (
    "job.",
    "profiling.",
    "metrics.",
    "optimizer.",
    "lr_scheduler.",
    "checkpoint.",
    "validation.",
    "dataloader.",
    "fault_tolerance.",
    "comm.",
    "debug.",
    "memory_estimation.",
)
SCHEDULES = {"1F1B": "1f1b", "GPipe": "gpipe", "Interleaved1F1B": "interleaved-1f1b", "DualPipeV": "dualpipe-v"}
SINGLE_STAGE = ("1F1B", "GPipe")
P = "parallelism."
FLAG_OF_KEY = {
    "parallel.tp": f"{P}tensor_parallel_degree",
    "parallel.pp": f"{P}pipeline_parallel_degree",
    "parallel.ep": f"{P}expert_parallel_degree",
    "parallel.etp": f"{P}expert_tensor_parallel_degree",
    "parallel.dp": f"{P}data_parallel_shard_degree",
    "parallel.vpp": f"{P}pipeline_parallel_layers_per_stage",
    "model.seq_len": "training.seq_len",
    "parallel.micro_batch_size": "training.local_batch_size",
}


def read_toml(path: Path) -> dict:
    """A TOML file, or one ConfigError naming it."""
    try:
        return tomllib.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError) as exc:
        raise ConfigError(
            "torchtitan config", str(path), f"a readable TOML file ({' '.join(str(exc).split())[:120]})"
        ) from None


def import_torchtitan(
    path: Path, *, world_size: int | None = None, model: str | None = None, lenient: bool = False
) -> Imported:
    """The config of a torchtitan TOML; world_size gives the GPUs where data_parallel_shard_degree is -1 (the
    ranks left over), and model the shapes (a preset, a model YAML or an HF config.json)."""
    keys, t = table_source(read_toml(path), f"torchtitan config {path}"), Translation(lenient)
    section = _model(keys, t, path, model)
    with config_keys_as(FLAG_OF_KEY):
        spec = load_model(section)
    layers = spec.num_layers
    parallel, zero, cp = _parallel(keys, t, world_size)
    parallel.update(_batches(keys, t, parallel, cp))
    schedule, parallel["vpp"] = _schedule(keys, t, parallel["pp"], layers)
    config = {
        "model": section,
        "parallel": parallel,
        "schedule": schedule,
        **_recompute(keys, t, layers // (parallel["pp"] * parallel["vpp"])),
        "optimizer": {"zero": zero, **_reshard(keys, zero)},
        "collectives": {
            "all_to_all": "deepep"
            if keys.text(f"{P}expert_parallel_comm_backend", "standard", ("standard", "deepep")) == "deepep"
            else "flat"
        },
        "cost": _fp8(keys, t, spec.num_experts > 1),
    }
    with config_keys_as(FLAG_OF_KEY):
        load_config(config)
    inert = NO_BEARING + (() if config["cost"] else ("quantize.",))  # without a converter its tables do nothing
    not_translated, no_bearing = split_unread(keys.unread(), lambda shown: shown.startswith(inert))
    return Imported(config, f"torchtitan config {path.name}", t.notes, not_translated, no_bearing)


def _model(keys: Source, t: Translation, path: Path, given: str | None) -> dict:
    """The model: --model, else [model] hf_assets_path's config.json (from the working folder or the TOML's); its
    sequence length [training] seq_len and precision [training] mixed_precision_param."""
    name, flavor = keys.text("model.name", "llama3"), keys.text("model.flavor", "debugmodel")
    assets = keys.text("model.hf_assets_path", None)
    ref = given
    if ref is None and assets is not None:
        found = [c for c in (Path(assets) / "config.json", path.parent / assets / "config.json") if c.is_file()]
        ref = str(found[0].resolve()) if found else None
    if ref is None:
        raise ConfigError(
            "--model",
            None,
            f"the model's shapes: a preset, a model YAML or an HF config.json "
            f"(torchtitan's {name} {flavor} is defined in its code; [model] hf_assets_path "
            f"{assets!r} holds no config.json here)",
        )
    precision = keys.text("training.mixed_precision_param", "bfloat16", ("bfloat16", "float32"))
    keys.get("training.dtype")  # the optimizer's master copy: piper-sim's memory model keeps fp32 Adam state
    t.note(f"model: torchtitan's {name} {flavor}, shapes from {ref}")
    return {
        "preset": ref,
        "name": f"{name}-{flavor}",
        "seq_len": keys.integer("training.seq_len", 2048),
        "dtype": "bf16" if precision == "bfloat16" else "fp32",
    }


def _fp8(keys: Source, t: Translation, moe: bool) -> dict:
    """cost.precision fp8 under torchao's float8 converters with tensorwise (current) scaling, the linears' and, for
    an MoE model, the experts' grouped GEMMs (piper-sim runs both in fp8); MX and row-wise scaling are beyond it."""
    converters = keys.words("model.converters") or []
    if not any("float8" in c or "mx" in c for c in converters):
        return {}
    if any("mx" in c for c in converters) or (moe and not any("grouped_mm.float8" in c for c in converters)):
        t.refuse(
            "model.converters",
            converters,
            "quantize.linear.float8 (with quantize.grouped_mm.float8 for an "
            "MoE model): piper-sim runs every linear, the experts' included, in fp8 with per-tensor scales",
            "prices every linear in fp8 with current scaling",
        )
    recipe = keys.text("quantize.linear.float8.recipe_name", "tensorwise")
    if recipe != "tensorwise":
        t.refuse(
            "quantize.linear.float8.recipe_name",
            recipe,
            "tensorwise: piper-sim prices per-tensor scaling",
            "prices it as tensorwise (current) scaling",
        )
    return {"precision": "fp8", "fp8_recipe": "current"}


def _parallel(keys: Source, t: Translation, world: int | None) -> tuple[dict, int, int]:
    """Degrees in Megatron's counting (DP = world / (TP x CP x PP)), the ZeRO stage and the CP degree: DDP replicas
    shard nothing, FSDP (data_parallel_shard_degree or context parallelism > 1) is ZeRO-3 over its dp_shard x cp
    ranks (torchtitan's fsdp mesh), and with data_parallel_replicate_degree > 1 too HSDP (parallel.dp_shard; the
    replicate degree is what it leaves; docs/sharding.md). Context parallelism runs as piper-sim's K/V ring
    (docs/context-parallel.md)."""
    degree = {
        k: keys.integer(f"{P}{k}_degree", 1, limit=GPUS_LIMIT)
        for k in (
            "data_parallel_replicate",
            "tensor_parallel",
            "pipeline_parallel",
            "context_parallel",
            "expert_parallel",
            "expert_tensor_parallel",
        )
    }
    rep, tp, pp, cp = (
        degree[k] for k in ("data_parallel_replicate", "tensor_parallel", "pipeline_parallel", "context_parallel")
    )
    shard = _shard_degree(keys, world, rep * tp * pp * cp)
    rotate = keys.text(f"{P}context_parallel_rotate_method", "allgather") if cp > 1 else ""
    if rotate == "allgather":
        t.note(
            "context_parallel_rotate_method allgather: priced as the K/V ring (the same bytes; torch's all-gather "
            "variant gathers them before each attention core)"
        )
    elif rotate:
        t.refuse(
            f"{P}context_parallel_rotate_method",
            rotate,
            "allgather: piper-sim models the K/V ring",
            "prices the K/V ring in place of the all-to-all rotation",
        )
    zero = 3 if shard * cp > 1 else 0
    hsdp = {"dp_shard": shard * cp} if zero == 3 and rep > 1 else {}
    if tp > 1:
        t.note("parallel.sp true: torchtitan's tensor-parallel plans shard the norms' activations by sequence")
    return (
        {
            "convention": "megatron",
            "tp": tp,
            "pp": pp,
            "dp": rep * shard,
            **({"cp": cp} if cp > 1 else {}),
            "ep": degree["expert_parallel"],
            "etp": degree["expert_tensor_parallel"],
            "sp": tp > 1,
            **hsdp,
        },
        zero,
        cp,
    )


RESHARD = {"default": "default", "always": True, "never": False}  # torchtitan/distributed/fsdp.py's policies


def _reshard(keys: Source, zero: int) -> dict:
    """optimizer.reshard_after_forward from fsdp_reshard_after_forward (torchtitan's "default": true without PP,
    false with it; get_fsdp_reshard_after_forward_policy), under FSDP only."""
    policy = keys.text(f"{P}fsdp_reshard_after_forward", "default", tuple(RESHARD))
    return {"reshard_after_forward": RESHARD[policy]} if zero == 3 else {}


def _shard_degree(keys: Source, world: int | None, others: int) -> int:
    """data_parallel_shard_degree, -1 (the default) meaning the ranks the other degrees leave (world / others)."""
    key = f"{P}data_parallel_shard_degree"
    shard = keys.integer(key, -1, low=-1, limit=GPUS_LIMIT)
    if shard == 0:
        raise ConfigError(key, shard, "-1 (the ranks left over) or a positive degree")
    if shard > 0:
        if world is not None and world != shard * others:
            raise ConfigError("--world-size", world, f"the product of the TOML's degrees ({shard * others})")
        return shard
    if world is None:
        raise ConfigError("--world-size", None, f"the job's GPU count: {key} is -1, the ranks left over")
    if world % others:
        raise ConfigError("--world-size", world, f"a multiple of the other degrees' product ({others})")
    return world // others


def _batches(keys: Source, t: Translation, parallel: dict, cp: int) -> dict:
    """micro_batch_size and num_microbatches: a data-parallel rank's local_batch_size (shared by its CP group, each
    rank holding its chunks of every sequence) per accumulation step, as one micro-batch without PP or
    local_batch_size / pipeline_parallel_microbatch_size micro-batches under PP; global_batch_size / (local x
    torchtitan's data-parallel degree) accumulation steps."""
    local = keys.integer("training.local_batch_size", 8, limit=int_limit("parallel.micro_batch_size"))
    dp = parallel["dp"]  # torchtitan's batch degree: dp_replicate x dp_shard
    total = keys.integer("training.global_batch_size", -1, low=-1)
    total = local * dp if total == -1 else total
    if total <= 0 or total % (local * dp):
        raise ConfigError(
            "training.global_batch_size",
            total,
            f"-1 or a multiple of local_batch_size x the data-parallel degree ({local} x {dp})",
        )
    accumulation = total // (local * dp)
    if parallel["pp"] == 1:
        return {"micro_batch_size": local, "num_microbatches": accumulation}
    mbs = keys.integer(f"{P}pipeline_parallel_microbatch_size", 1)
    if local % mbs:
        raise ConfigError(f"{P}pipeline_parallel_microbatch_size", mbs, f"a divisor of local_batch_size ({local})")
    if accumulation > 1:
        t.note(
            f"{accumulation} gradient-accumulation steps run as one pipeline schedule of "
            f"{accumulation * local // mbs} micro-batches (torchtitan flushes the pipeline after each)"
        )
    return {"micro_batch_size": mbs, "num_microbatches": accumulation * local // mbs}


def _schedule(keys: Source, t: Translation, pp: int, layers: int) -> tuple[str, int]:
    """The pipeline schedule and its stages per rank: single-stage schedules 1, looped ones
    ceil((layers + first_stage_less_layers + last_stage_less_layers) / layers_per_stage) / PP, or 2 by default."""
    name = keys.text(f"{P}pipeline_parallel_schedule", "1F1B")
    if pp == 1:
        return "1f1b", 1
    per_stage = keys.integer(f"{P}pipeline_parallel_layers_per_stage", None)
    vpp = 1 if name in SINGLE_STAGE else 2
    if per_stage is not None:
        weights = sum(
            keys.integer(f"{P}pipeline_parallel_{end}_stage_less_layers", 1, low=0) for end in ("first", "last")
        )
        stages = math.ceil((layers + weights) / per_stage)
        if stages % pp:
            raise ConfigError(
                f"{P}pipeline_parallel_layers_per_stage",
                per_stage,
                f"a size giving a multiple of pipeline_parallel_degree ({pp}) stages; it gives {stages}",
            )
        vpp = stages // pp
    if name not in SCHEDULES:
        t.refuse(
            f"{P}pipeline_parallel_schedule",
            name,
            f"one of {', '.join(SCHEDULES)}",
            "runs the interleaved 1F1B schedule with the same stages" if vpp > 1 else "runs 1F1B",
        )
    return SCHEDULES.get(name, "interleaved-1f1b" if vpp > 1 else "1f1b"), vpp


def _recompute(keys: Source, t: Translation, chunk_layers: int) -> dict:
    """[activation_checkpoint]: none, full (each block checkpointed alone), selective with an integer N (every
    N-th block checkpointed whole; 0 or 1: every block), op (per-operator policy) or memory_budget."""
    mode = keys.text("activation_checkpoint.mode", "selective", ("none", "full", "selective", "memory_budget"))
    option = str(keys.get("activation_checkpoint.selective_ac_option", "2")) if mode == "selective" else ""
    if mode == "none":
        return {"recompute": "none"}
    if mode == "full" or option in ("0", "1"):
        return {"recompute": "full", "recompute_checkpoint_layers": 1}
    if mode == "selective" and option.isdigit():
        count = chunk_layers // int(option)
        t.refuse(
            "activation_checkpoint.selective_ac_option",
            option,
            "0 or 1: piper-sim recomputes the first N layers of each chunk, not every N-th",
            f"recomputes the first {count} of each chunk's {chunk_layers} layers (as many as every {option}-th)",
        )
        return (
            {"recompute": "full", "recompute_layers": count, "recompute_checkpoint_layers": 1}
            if count
            else {"recompute": "none"}
        )
    kept = "selective" if mode == "selective" else "none"
    t.refuse(
        "activation_checkpoint.mode",
        f"{mode} {option}".strip(),
        "none, full, or selective with an integer option",
        f"takes recompute {kept} (the attention core's recomputation; torchtitan's per-operator "
        "policy recomputes the elementwise ops and every other matmul)"
        if kept == "selective"
        else "takes recompute none (the compiler's memory budget is not modelled)",
    )
    return {"recompute": kept}
