"""A Megatron-LM / Megatron-core argument list (optionally with torchrun's --nnodes and --nproc-per-node) ->
a piper-sim config (docs/importing.md).

Owns the translation of the launch line's parallel, batch, recompute, optimizer, dispatcher (and its overlap,
--overlap-moe-expert-parallel-comm) and attention flags,
as Megatron-LM reads them (megatron/training/arguments.py, TransformerConfig); the model's flags are
megatron_model.py's. The plan is written in Megatron's own counting (`parallel.convention: megatron`). What piper-sim
cannot express (context parallelism other than the p2p ring,
FSDP, fp4 and block-scaled fp8, an uneven pipeline split, recompute modules
other than core_attn, layernorm and moe_act, the allgather dispatcher) is refused naming the flag, or approximated
under --lenient and said. No I/O.
"""

from __future__ import annotations

from piper_sim.bounds import GPUS_LIMIT, int_limit
from piper_sim.config import load_config
from piper_sim.errors import ConfigError
from piper_sim.importers.imported import Imported, Translation, config_keys_as, split_unread
from piper_sim.importers.megatron_model import model_section
from piper_sim.importers.source import Source, flag_source
from piper_sim.workload.parallel import parallel_from_section
from piper_sim.workload.recompute import DEFAULT_SELECTIVE_MODULES, RECOMPUTE_MODULES

SOURCE = "a Megatron-LM argument list"
# flags (and prefixes) that set no shape, plan or kernel: data, logging, checkpoints, learning rate, launcher
NO_BEARING = (
    "lr",
    "min-lr",
    "lr-",
    "log-",
    "save",
    "load",
    "eval-",
    "data-",
    "tensorboard-",
    "wandb-",
    "adam-",
    "weight-decay",
    "clip-grad",
    "init-method-std",
    "seed",
    "train-iters",
    "train-samples",
    "split",
    "tokenizer-",
    "vocab-file",
    "merge-file",
    "exit-",
    "distributed-timeout-minutes",
    "num-workers",
    "save-",
    "finetune",
    "auto-detect-ckpt-format",
    "no-load-",
    "dist-ckpt-",
    "ckpt-",
    "use-mcore-models",
    "manual-gc",
    "no-mmap-bin-files",
    "node-rank",
    "master-addr",
    "master-port",
    "rdzv-",
    "max-restarts",
    "mock-data",
    "timing-log",
    "enable-experimental",
    "use-checkpoint-args",
    "no-save-",
    "override-opt",
)
DISPATCHERS = {"alltoall": "flat", "alltoall_seq": "flat"}
FP8_RECIPES = {"delayed": "delayed", "tensorwise": "current"}  # --fp8-recipe -> cost.fp8_recipe
# the flag behind each config key an imported config can be refused on (named beside the key)
FLAG_OF_KEY = {
    "parallel.tp": "--tensor-model-parallel-size",
    "parallel.pp": "--pipeline-model-parallel-size",
    "parallel.ep": "--expert-model-parallel-size",
    "parallel.etp": "--expert-tensor-parallel-size",
    "parallel.dp": "--world-size",
    "parallel.sp": "--sequence-parallel",
    "parallel.cp": "--context-parallel-size",
    "parallel.vpp": "--num-layers-per-virtual-pipeline-stage",
    "parallel.num_microbatches": "--global-batch-size",
    "parallel.micro_batch_size": "--micro-batch-size",
    "model.num_layers": "--num-layers",
    "model.d_model": "--hidden-size",
    "model.num_heads": "--num-attention-heads",
    "model.num_kv_heads": "--num-query-groups",
    "model.head_dim": "--kv-channels",
    "model.expert_ffn_dim": "--moe-ffn-hidden-size",
    "model.num_experts": "--num-experts",
    "model.top_k": "--moe-router-topk",
    "model.seq_len": "--seq-length",
    "model.vocab_size": "--vocab-size",
    "model.moe_layer_freq": "--moe-layer-freq",
    "model.dense_ffn_dim": "--ffn-hidden-size",
    "model.shared_expert_ffn_dim": "--moe-shared-expert-intermediate-size",
    "recompute_modules": "--recompute-modules",
    "collectives.overlap_all_to_all": "--overlap-moe-expert-parallel-comm",
}


def import_megatron(
    argv: list[str], *, world_size: int | None = None, lenient: bool = False, name: str = "megatron-import"
) -> Imported:
    """The config of a Megatron-LM launch line; world_size (or torchrun's --nnodes x --nproc-per-node in argv)
    gives the GPUs, which Megatron takes from the launcher."""
    flags, loose = flag_source(argv, SOURCE)
    t = Translation(lenient)
    tp = flags.integer("tensor-model-parallel-size", 1, limit=GPUS_LIMIT)
    model = model_section(flags, t, tp, name)
    parallel = _parallel(flags, t, model["num_layers"], _world_size(flags, world_size), tp)
    config = {
        "model": model,
        "parallel": parallel,
        "schedule": "interleaved-1f1b" if parallel["vpp"] > 1 else "1f1b",
        **_recompute(flags, t),
        "optimizer": {"zero": _zero(flags, t, parallel)},
        "collectives": {
            "all_to_all": _dispatcher(flags, t, parallel["ep"]),
            **({"overlap_all_to_all": True} if flags.switch("overlap-moe-expert-parallel-comm") else {}),
        },
        "cost": {"flash_attention": _flash_attention(flags), **_precision(flags, t)},
    }
    with config_keys_as(FLAG_OF_KEY):
        load_config(config)
    not_translated, no_bearing = split_unread(
        flags.unread() + [f"{w} (a word, not a flag)" for w in loose], _no_bearing
    )
    return Imported(config, SOURCE, t.notes, not_translated, no_bearing)


def _no_bearing(shown: str) -> bool:
    name = shown.removeprefix("--").split(" ")[0].replace("_", "-")
    return any(name == p or (p.endswith("-") and name.startswith(p)) for p in NO_BEARING)


def _world_size(flags: Source, given: int | None) -> int:
    """The job's GPUs: --world-size, or torchrun's --nnodes x --nproc-per-node (both, when given, agree)."""
    launcher = None
    if flags.given("nnodes") or flags.given("nproc-per-node"):
        nodes = flags.integer("nnodes", 1, limit=GPUS_LIMIT)
        launcher = nodes * flags.integer("nproc-per-node", 1, limit=GPUS_LIMIT)
    if given is not None and launcher is not None and given != launcher:
        raise ConfigError(
            "--world-size", given, f"the launcher's --nnodes x --nproc-per-node ({launcher}), or leave one out"
        )
    world = given if given is not None else launcher
    if world is None:
        raise ConfigError(
            "--world-size",
            None,
            "the job's GPU count: --world-size N, or torchrun's --nnodes and "
            "--nproc-per-node among the arguments (Megatron takes it from the "
            "launcher)",
        )
    if not 0 < world <= GPUS_LIMIT:
        raise ConfigError("--world-size", world, f"a positive number of GPUs up to {GPUS_LIMIT:,}")
    return world


def _parallel(flags: Source, t: Translation, layers: int, world: int, tp: int) -> dict:
    """The plan in Megatron's counting (parallel.convention megatron): DP = world / (TP x PP x CP)."""
    pp = flags.integer("pipeline-model-parallel-size", 1, limit=GPUS_LIMIT)
    cp = flags.integer("context-parallel-size", 1, limit=GPUS_LIMIT)
    if world % (tp * pp * cp):
        raise ConfigError(
            "--world-size", world, f"a multiple of TP x PP x CP ({tp} x {pp} x {cp}), as Megatron requires"
        )
    dp = world // (tp * pp * cp)
    if cp > 1:
        _cp_comm_type(flags, t)
    mbs = flags.integer("micro-batch-size", 1, limit=int_limit("parallel.micro_batch_size"))
    gbs = flags.integer("global-batch-size", mbs * dp)
    if gbs % (mbs * dp):
        raise ConfigError(
            flags.key("global-batch-size"),
            gbs,
            f"a multiple of --micro-batch-size x the data-parallel size ({mbs} x {dp}: world / (TP x PP x CP))",
        )
    return {
        "convention": "megatron",
        "tp": tp,
        "pp": pp,
        "dp": dp,
        **({"cp": cp} if cp > 1 else {}),
        "ep": flags.integer("expert-model-parallel-size", 1, limit=GPUS_LIMIT),
        "etp": flags.integer("expert-tensor-parallel-size", tp, limit=GPUS_LIMIT),
        "sp": flags.switch("sequence-parallel"),
        "vpp": _vpp(flags, t, layers, pp),
        "num_microbatches": gbs // (mbs * dp),
        "micro_batch_size": mbs,
    }


def _cp_comm_type(flags: Source, t: Translation) -> None:
    """--cp-comm-type (Megatron-core's default p2p: the K/V ring, docs/context-parallel.md); all_gather moves the same
    bytes in one collective before the core, priced as the ring; a2a (Ulysses) and its hierarchies are beyond
    piper-sim."""
    kind = flags.text("cp-comm-type", "p2p")
    if kind == "all_gather":
        t.note(
            "--cp-comm-type all_gather: priced as the p2p ring (the same K/V bytes; the ring overlaps them with "
            "the core step by step)"
        )
    elif kind != "p2p":
        t.refuse(
            flags.key("cp-comm-type"),
            kind,
            "p2p or all_gather: piper-sim models the K/V ring",
            "prices the p2p ring (each rank's K/V passed around the CP group) in place of the all-to-all",
        )


def _vpp(flags: Source, t: Translation, layers: int, pp: int) -> int:
    """Virtual stages per pipeline rank: --num-virtual-stages-per-pipeline-rank, or the layers per pipeline rank
    (counting the embedding and the loss where --account-for-*-in-pipeline-split says) over
    --num-layers-per-virtual-pipeline-stage, as Megatron derives it."""
    for uneven in (
        "decoder-first-pipeline-num-layers",
        "decoder-last-pipeline-num-layers",
        "pipeline-model-parallel-layout",
    ):
        if flags.given(uneven):
            t.refuse(
                flags.key(uneven),
                flags.get(uneven),
                "left out: piper-sim splits the layers evenly over the (virtual) stages",
                "splits them evenly",
            )
    slots = layers + sum(flags.switch(f"account-for-{part}-in-pipeline-split") for part in ("embedding", "loss"))
    if slots != layers:
        t.note(
            f"the pipeline split counts {slots - layers} more slot(s) for the embedding and the loss; piper-sim "
            f"splits the {layers} layers as evenly as it can, the embedding on the first stage, the head on the "
            "last"
        )
    if flags.given("num-virtual-stages-per-pipeline-rank"):
        return flags.integer("num-virtual-stages-per-pipeline-rank", limit=int_limit("parallel.vpp"))
    per_stage = flags.integer("num-layers-per-virtual-pipeline-stage", None)
    if per_stage is None:
        return 1
    if slots % pp or (slots // pp) % per_stage:
        raise ConfigError(
            flags.key("num-layers-per-virtual-pipeline-stage"),
            per_stage,
            f"a divisor of the layers per pipeline rank ({slots} / PP {pp}), as Megatron requires",
        )
    return slots // pp // per_stage


def _recompute(flags: Source, t: Translation) -> dict:
    """recompute and its layer counts: --recompute-granularity full with --recompute-method uniform (N layers per
    checkpoint) or block (the first N layers of each chunk, one checkpoint each); selective recomputes the
    attention core; the legacy --checkpoint-activations is full, --checkpoint-num-layers (default 1) per checkpoint."""
    if flags.switch("checkpoint-activations"):
        return {"recompute": "full", "recompute_checkpoint_layers": flags.integer("checkpoint-num-layers", 1)}
    granularity = "selective" if flags.switch("recompute-activations") else None
    granularity = flags.text("recompute-granularity", granularity, ("full", "selective"))
    if granularity == "selective":
        return _selective(flags, t)
    if granularity is None:
        return {"recompute": "none"}
    method = flags.text("recompute-method", None, ("uniform", "block"))
    if method is None:
        raise ConfigError(
            flags.key("recompute-method"),
            None,
            "uniform or block with --recompute-granularity full, as Megatron-core requires",
        )
    layers = flags.integer("recompute-num-layers")
    if method == "uniform":
        return {"recompute": "full", "recompute_checkpoint_layers": layers}
    return {"recompute": "full", "recompute_layers": layers, "recompute_checkpoint_layers": 1}


def _selective(flags: Source, t: Translation) -> dict:
    """recompute selective with --recompute-modules as recompute_modules (Megatron-core's default core_attn
    unsaid); modules piper-sim does not model (workload/recompute.py) refused, or left out under --lenient."""
    modules = list(dict.fromkeys(flags.words("recompute-modules") or DEFAULT_SELECTIVE_MODULES))
    kept = [m for m in modules if m in RECOMPUTE_MODULES]
    others = [m for m in modules if m not in RECOMPUTE_MODULES]
    if others:
        what = f"recomputes {' '.join(kept)} (recompute selective)" if kept else "recomputes nothing (recompute none)"
        t.refuse(
            flags.key("recompute-modules"),
            " ".join(modules),
            f"{', '.join(RECOMPUTE_MODULES)}: the modules piper-sim's selective recomputation models",
            f"{what}: {' '.join(others)} not recomputed, their memory not saved",
        )
    if not kept:
        return {"recompute": "none"}
    return {
        "recompute": "selective",
        **({"recompute_modules": kept} if tuple(kept) != DEFAULT_SELECTIVE_MODULES else {}),
    }


def _zero(flags: Source, t: Translation, parallel: dict) -> int:
    """--use-distributed-optimizer shards the optimizer state over the data-parallel replicas (ZeRO-1); FSDP
    (--use-torch-fsdp2, --use-megatron-fsdp, --use-custom-fsdp) shards the parameters too, beyond piper-sim."""
    zero = 1 if flags.switch("use-distributed-optimizer") else 0
    for fsdp in ("use-torch-fsdp2", "use-megatron-fsdp", "use-custom-fsdp"):
        if flags.switch(fsdp):
            t.refuse(
                flags.key(fsdp),
                True,
                "left out: piper-sim shards no parameters (optimizer.zero 0, 1 or 2)",
                "takes ZeRO-2 (gradients and optimizer state sharded; the parameters whole on every rank, "
                "so more memory and no parameter all-gathers)",
            )
            zero = 2
    with config_keys_as(FLAG_OF_KEY):
        spec = parallel_from_section(parallel)
    if zero and spec.data_parallel == 1 and spec.dp == 1:
        t.note("one data-parallel replica: the distributed optimizer shards nothing (optimizer.zero 0)")
        zero = 0
    return zero


def _precision(flags: Source, t: Translation) -> dict:
    """cost.precision fp8 under --fp8-format (e4m3 or hybrid: Transformer Engine's linears in fp8), with
    --fp8-recipe delayed (Megatron's default) or tensorwise (current scaling); fp4 and the block-scaled recipes
    (mxfp8, blockwise) are beyond piper-sim's cost model."""
    if flags.given("fp4-format"):
        t.refuse(
            flags.key("fp4-format"),
            flags.get("fp4-format"),
            "left out: piper-sim prices GEMMs in bf16 or fp8",
            "prices them in fp8 with current scaling (cost.precision fp8)",
        )
        return {"precision": "fp8", "fp8_recipe": "current"}
    if flags.text("fp8-format", None, ("e4m3", "hybrid")) is None:
        return {}
    recipe = flags.text("fp8-recipe", "delayed")
    if recipe not in FP8_RECIPES:
        t.refuse(
            flags.key("fp8-recipe"),
            recipe,
            f"one of {', '.join(FP8_RECIPES)}: piper-sim prices per-tensor scaling",
            "prices it as tensorwise (current) scaling",
        )
    return {"precision": "fp8", "fp8_recipe": FP8_RECIPES.get(recipe, "current")}


def _dispatcher(flags: Source, t: Translation, ep: int) -> str:
    """The MoE token dispatcher as piper-sim's all-to-all: alltoall -> flat, flex with DeepEP (Megatron-core's
    flex default backend; --moe-enable-deepep) -> deepep. allgather (Megatron's default) gathers every token on
    every EP rank, which piper-sim does not model."""
    deepep = flags.switch("moe-enable-deepep")
    kind = flags.text("moe-token-dispatcher-type", "flex" if deepep else "allgather")
    if kind == "flex":
        backend = flags.text("moe-flex-dispatcher-backend", "deepep")
        if backend == "deepep":
            return "deepep"
        t.refuse(
            flags.key("moe-flex-dispatcher-backend"),
            backend,
            "deepep: piper-sim models DeepEP's kernels",
            "prices the dispatch as DeepEP's",
        )
        return "deepep"
    if kind in DISPATCHERS or ep == 1:  # with one EP rank no tokens leave the GPU
        return DISPATCHERS.get(kind, "flat")
    t.refuse(
        flags.key("moe-token-dispatcher-type"),
        kind,
        "alltoall or flex: piper-sim has no all-gather dispatcher",
        "prices it as the alltoall dispatcher (collectives.all_to_all flat)",
    )
    return "flat"


def _flash_attention(flags: Source) -> bool:
    """FlashAttention unless the attention core runs unfused: --attention-backend unfused or local, or the local
    transformer implementation without --use-flash-attn (Transformer Engine's default backend fuses it)."""
    flash = flags.switch("use-flash-attn")
    backend = flags.text("attention-backend", "auto")
    local = flags.text("transformer-impl", "transformer_engine") == "local"
    return flash or (backend not in ("unfused", "local") and not local)
