"""piper-sim import: Megatron-LM argument lists and torchtitan TOMLs -> piper-sim configs (docs/importing.md).

The published runs of validation/published whose notes translate Megatron flags by hand are the reference: their
launch lines (written out below from each run's sources) import to the run's own model, plan, recompute, optimizer,
schedule, dispatcher and attention."""

from __future__ import annotations

import re
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import yaml

from piper_sim.cli import main
from piper_sim.config import load_config
from piper_sim.errors import ConfigError
from piper_sim.importers.megatron import import_megatron
from piper_sim.importers.torchtitan import import_torchtitan
from piper_sim.planning.plan_outputs import format_plan_table, megatron_label
from piper_sim.planning.plan_point import PlanPoint
from piper_sim.workload.parallel import ParallelSpec, megatron_degrees, parallel_from_section

PUBLISHED = Path(__file__).resolve().parents[2] / "validation" / "published"
HF = Path(__file__).resolve().parents[1] / "data" / "hf"

# Megatron MoE Model Zoo, model_configs/benchmarking/Qwen3-235B-A22B.yaml (network size and MoE flags);
# --vocab-size: the Qwen3 tokenizer's 151,669 tokens (any size from 149,563 up pads to 151,936 with 1187 x TP 2 or 4)
QWEN3 = (
    "--swiglu --untie-embeddings-and-output-weights --position-embedding-type rope --normalization RMSNorm "
    "--num-layers 94 --hidden-size 4096 --ffn-hidden-size 12288 --num-attention-heads 64 --kv-channels 128 "
    "--group-query-attention --num-query-groups 4 --qk-layernorm --seq-length 4096 "
    "--max-position-embeddings 40960 "
    "--tokenizer-type HuggingFaceTokenizer --tokenizer-model Qwen/Qwen3-235B-A22B --vocab-size 151669 "
    "--make-vocab-size-divisible-by 1187 --attention-dropout 0.0 --hidden-dropout 0.0 --num-experts 128 "
    "--moe-ffn-hidden-size 1536 --moe-router-topk 8 --moe-grouped-gemm --bf16 --use-flash-attn "
    "--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather --sequence-parallel "
    "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split "
    "--expert-tensor-parallel-size 1 "
    "--micro-batch-size 1 --global-batch-size 2048 --moe-token-dispatcher-type flex --moe-enable-deepep "
    "--lr 3.9e-6 --weight-decay 0.1 "
)
# Model Zoo model_configs/benchmarking/Mixtral-8x22B.yaml; runtime.conf's Mixtral-8x22B plan; run_mixtral_8x22B.sh
MIXTRAL_8X22B = (
    "--swiglu --untie-embeddings-and-output-weights --position-embedding-type rope --num-layers 56 "
    "--hidden-size 6144 "
    "--ffn-hidden-size 16384 --num-attention-heads 48 --group-query-attention --num-query-groups 8 "
    "--seq-length 4096 --tokenizer-type Llama2Tokenizer --make-vocab-size-divisible-by 128 "
    "--attention-dropout 0.0 --hidden-dropout 0.0 --num-experts 8 --moe-router-topk 2 --bf16 "
    "--use-flash-attn --use-distributed-optimizer --tp-comm-overlap --sequence-parallel "
    "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 8 --expert-model-parallel-size 8 "
    "--expert-tensor-parallel-size 1 --num-virtual-stages-per-pipeline-rank 7 --micro-batch-size 1 "
    "--global-batch-size 256 --moe-token-dispatcher-type alltoall --moe-router-force-load-balancing "
    "--nnodes 16 --nproc-per-node 8"
)
# Megatron-LM's MoE README, Mixtral 8x7B's reference mapping (TP 1, EP 8, PP 4, VP 8, MBS 1, GBS 256, 64 GPUs)
MIXTRAL_8X7B = (
    "--swiglu --untie-embeddings-and-output-weights --position-embedding-type rope --num-layers 32 "
    "--hidden-size 4096 "
    "--ffn-hidden-size 14336 --num-attention-heads 32 --group-query-attention --num-query-groups 8 "
    "--seq-length 4096 --tokenizer-type Llama2Tokenizer --attention-dropout 0.0 --hidden-dropout 0.0 "
    "--num-experts 8 --moe-router-topk 2 --bf16 --use-flash-attn --use-distributed-optimizer "
    "--pipeline-model-parallel-size 4 --expert-model-parallel-size 8 "
    "--num-layers-per-virtual-pipeline-stage 1 --micro-batch-size 1 --global-batch-size 256 "
    "--moe-token-dispatcher-type alltoall"
)
# GPT runs of Narayanan et al. 2021 and Korthikanti et al. 2022: GPT-2's BPE vocabulary, FFN 4h with GELU, tied
# embeddings, dropout 0.1 (Megatron's defaults), fp16, the unfused attention core of the local implementation
GPT = (
    "--tokenizer-type GPT2BPETokenizer --vocab-file gpt2-vocab.json --merge-file gpt2-merges.txt --seq-length 2048 "
    "--fp16 --transformer-impl local "
)
FULL_UNIFORM_1 = "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1 "

CASES = {
    "mcore-qwen3-235b-h100-256gpu-tp2-ep32": (
        QWEN3 + "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 8 --expert-model-parallel-size 32 "
        "--num-layers-per-virtual-pipeline-stage 3 --nnodes 32 --nproc-per-node 8 "
        "--recompute-granularity selective --recompute-modules layernorm moe_act",
        False,
    ),
    "mcore-qwen3-235b-h100-256gpu-tp2-ep32-overlap": (
        QWEN3 + "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 8 --expert-model-parallel-size 32 "
        "--num-layers-per-virtual-pipeline-stage 3 --nnodes 32 --nproc-per-node 8 "
        "--recompute-granularity selective --recompute-modules layernorm moe_act --overlap-moe-expert-parallel-comm",
        False,
    ),
    "mcore-qwen3-235b-h100-256gpu-tp4-ep8": (
        QWEN3 + "--tensor-model-parallel-size 4 --pipeline-model-parallel-size 8 --expert-model-parallel-size 8 "
        "--num-layers-per-virtual-pipeline-stage 3 --nnodes 32 --nproc-per-node 8",
        False,
    ),
    "mcore-mixtral-8x22b-h100-128gpu": (MIXTRAL_8X22B, False),
    "mcore-mixtral-8x7b-h100-64gpu": (MIXTRAL_8X7B + " --nnodes 8 --nproc-per-node 8", False),
    "korthikanti2022-22b-selective-sp": (
        GPT + "--num-layers 48 --hidden-size 6144 --num-attention-heads 64 --tensor-model-parallel-size 8 "
        "--sequence-parallel --recompute-activations --micro-batch-size 4 --global-batch-size 4 "
        "--nproc-per-node 8",
        False,
    ),
    "korthikanti2022-175b-full": (
        GPT + FULL_UNIFORM_1 + "--num-layers 96 --hidden-size 12288 --num-attention-heads 96 "
        "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 8 --num-layers-per-virtual-pipeline-stage 4 "
        "--micro-batch-size 1 --global-batch-size 64 --nnodes 8 --nproc-per-node 8",
        False,
    ),
    "megatron2021-t2-174p6b-384gpu": (
        GPT + FULL_UNIFORM_1 + "--num-layers 96 --hidden-size 12288 --num-attention-heads 96 "
        "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 12 --micro-batch-size 1 "
        "--global-batch-size 1536 --nnodes 48 --nproc-per-node 8",
        False,
    ),
    "megatron2021-t1-529p6b": (
        GPT + FULL_UNIFORM_1 + "--num-layers 105 --hidden-size 20480 --num-attention-heads 128 "
        "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 35 --micro-batch-size 1 "
        "--global-batch-size 2520 --nnodes 315 --nproc-per-node 8",
        False,
    ),
}


def model_shape(spec) -> dict:
    """A ModelSpec's fields with each `0 means ...` default resolved and the names and published figures left out."""
    out = asdict(spec)
    for key in ("name", "source", "published_params", "published_active_params"):
        out.pop(key)
    out.update(
        num_kv_heads=spec.kv_heads if spec.mla is None else 0,
        head_dim=spec.attn_head_dim,
        dense_matrices=spec.dense_matrix_count,
        shared_expert_ffn_dim=spec.shared_ffn_dim if spec.num_shared_experts else 0,
    )
    if all(spec.is_moe_layer(i) for i in range(spec.num_layers)):
        out["dense_ffn_dim"] = 0  # no dense layer: its width means nothing
    return out


def plan_of(cfg) -> dict:
    return {
        "parallel": cfg.parallel,
        "schedule": cfg.schedule,
        "recompute": cfg.recompute,
        "recompute_layers": cfg.recompute_layers,
        "recompute_checkpoint_layers": cfg.recompute_checkpoint_layers,
        "recompute_modules": cfg.recompute_modules,
        "zero": cfg.zero,
        "all_to_all": cfg.collectives.all_to_all,
        "overlap_all_to_all": cfg.collectives.overlap_all_to_all,
        "flash_attention": cfg.flash_attention,
    }


@pytest.mark.parametrize("run", sorted(CASES))
def test_a_published_runs_flags_import_to_its_config(run):
    flags, lenient = CASES[run]
    published = load_config(yaml.safe_load((PUBLISHED / f"{run}.yaml").read_text())["config"])
    imported = load_config(import_megatron(flags.split(), lenient=lenient).config)
    assert model_shape(imported.model) == model_shape(published.model)
    assert plan_of(imported) == plan_of(published)


def test_the_lenient_run_says_what_it_approximated_and_strict_refuses_it():
    flags, _ = CASES["mcore-qwen3-235b-h100-256gpu-tp2-ep32"]
    flags = flags.replace("layernorm moe_act", "mlp moe_act")  # Megatron's dense-MLP checkpoint is not modelled
    with pytest.raises(ConfigError) as info:
        import_megatron(flags.split())
    assert info.value.key == "--recompute-modules"
    lenient = import_megatron(flags.split(), lenient=True)
    assert load_config(lenient.config).recompute_modules == ("moe_act",)
    assert any("--recompute-modules mlp moe_act" in note and "recomputes moe_act" in note for note in lenient.notes)


def test_the_all_to_all_overlap_needs_a_plan_that_pairs_its_passes():
    no_vpp = MIXTRAL_8X7B.replace("--num-layers-per-virtual-pipeline-stage 1 ", "")  # pp 4 without virtual stages
    flags = [*no_vpp.split(), "--overlap-moe-expert-parallel-comm"]
    with pytest.raises(ConfigError) as info:
        import_megatron(flags, world_size=64)
    assert "--overlap-moe-expert-parallel-comm" in info.value.key


def test_flags_not_translated_are_listed_in_the_yaml_and_none_is_dropped():
    launcher = "torchrun --nnodes 8 --nproc-per-node 8 pretrain_gpt.py".split()
    imported = import_megatron([*launcher, *MIXTRAL_8X7B.split(), "--frobnicate", "3", "--lr", "1e-4"])
    assert load_config(imported.config).parallel.num_gpus == 64
    assert "--frobnicate 3" in imported.not_translated
    assert "--lr 1e-4" in imported.no_bearing and "--lr 1e-4" not in imported.not_translated
    assert {"torchrun (a word, not a flag)", "pretrain_gpt.py (a word, not a flag)"} <= set(imported.not_translated)
    text = imported.yaml_text()
    header = " ".join(line[2:].strip() for line in text.splitlines() if line.startswith("# "))
    for item in imported.not_translated + imported.no_bearing:
        assert item in header, item
    assert yaml.safe_load(text) == imported.config


@pytest.mark.parametrize(
    "extra, flag, check",
    [
        # CP 2 over Ulysses' all-to-all: priced as the K/V ring (CP 2 kept, DP = world / (TP x PP x CP) = 4)
        ("--context-parallel-size 2 --cp-comm-type a2a", "--cp-comm-type", lambda c: c.parallel.cp == 2),
        ("--use-torch-fsdp2", "--use-torch-fsdp2", lambda c: c.zero == 2),
        ("--fp8-format hybrid --fp8-recipe mxfp8", "--fp8-recipe", lambda c: c.model.fp8_recipe == "current"),
        ("--fp4-format e2m1", "--fp4-format", lambda c: c.model.fp8_recipe == "current"),
        (
            "--moe-token-dispatcher-type allgather",
            "--moe-token-dispatcher-type",
            lambda c: c.collectives.all_to_all == "flat",
        ),
        ("--decoder-first-pipeline-num-layers 6", "--decoder-first-pipeline-num-layers", lambda c: c.parallel.pp == 2),
        (
            "--recompute-granularity selective --recompute-modules core_attn mlp",
            "--recompute-modules",
            lambda c: c.recompute == "selective",
        ),
    ],
)
def test_what_piper_sim_cannot_express_is_refused_by_name_or_approximated(extra, flag, check):
    flags = (
        f"--num-layers 16 --hidden-size 256 --num-attention-heads 8 --seq-length 512 --vocab-size 1000 --bf16 "
        f"--num-experts 8 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
        f"--expert-model-parallel-size 4 --expert-tensor-parallel-size 1 --global-batch-size 64 "
        f"--use-distributed-optimizer --moe-token-dispatcher-type alltoall {extra}"
    ).split()
    with pytest.raises(ConfigError) as info:
        import_megatron(flags, world_size=32)
    assert info.value.key == flag and "--lenient" in info.value.allowed
    imported = import_megatron(flags, world_size=32, lenient=True)
    assert check(load_config(imported.config))
    assert any(flag in note for note in imported.notes)


@pytest.mark.parametrize(
    "extra, recipe",
    [("", None), ("--fp8-format hybrid", "delayed"), ("--fp8-format e4m3 --fp8-recipe tensorwise", "current")],
)
def test_fp8_flags_set_the_cost_models_precision_and_recipe(extra, recipe):
    cfg = load_config(import_megatron([*SMALL.split(), "--bf16", *extra.split()], world_size=1).config)
    assert (cfg.model.fp8_recipe or None, cfg.model.dtype) == (recipe, "bf16")


@pytest.mark.parametrize(
    "extra, rotary",
    [
        ("", False),
        ("--position-embedding-type learned_absolute", False),
        ("--position-embedding-type rope", True),
        ("--position-embedding-type yarn", True),
        ("--use-rotary-position-embeddings", True),
        ("--position-embedding-type none", False),
    ],
)
def test_the_position_embedding_type_says_whether_q_and_k_are_rotated(extra, rotary):
    imported = import_megatron([*SMALL.split(), *extra.split()], world_size=1)
    assert load_config(imported.config).model.rotary is rotary
    assert not any("position" in flag for flag in imported.not_translated + imported.no_bearing)


def test_an_unknown_position_embedding_type_names_the_flag():
    with pytest.raises(ConfigError) as info:
        import_megatron([*SMALL.split(), "--position-embedding-type", "alibi"], world_size=1)
    assert info.value.key == "--position-embedding-type" and "rope" in info.value.allowed


@pytest.mark.parametrize("tp, divisible, vocab", [(8, None, 51200), (1, None, 50304), (2, "1187", 151936)])
def test_the_vocabulary_is_padded_as_megatron_pads_it(tp, divisible, vocab):
    flags = [
        "--num-layers",
        "2",
        "--hidden-size",
        "64",
        "--num-attention-heads",
        "8",
        "--seq-length",
        "64",
        "--tensor-model-parallel-size",
        str(tp),
        "--vocab-size",
        "50257" if divisible is None else "151669",
    ]
    flags += ["--make-vocab-size-divisible-by", divisible] if divisible else []
    assert import_megatron(flags, world_size=8).config["model"]["vocab_size"] == vocab
    with pytest.raises(ConfigError) as info:
        import_megatron([f for f in flags if f not in ("--vocab-size", "50257", "151669")], world_size=8)
    assert info.value.key == "--vocab-size"


SMALL = "--num-layers 8 --hidden-size 64 --num-attention-heads 4 --seq-length 64 --vocab-size 512 --num-experts 4"


@pytest.mark.parametrize(
    "freq, moe_layers",
    [("1", range(8)), ("2", [0, 2, 4, 6]), ("([0]*3+[1]*5)", range(3, 8)), ("[0,1]*4", [1, 3, 5, 7])],
)
def test_the_moe_layer_pattern_follows_moe_layer_freq(freq, moe_layers):
    model = load_config(import_megatron([*SMALL.split(), "--moe-layer-freq", freq], world_size=1).config).model
    assert list(model.moe_layer_indices) == list(moe_layers)


@pytest.mark.parametrize("freq", ["__import__('os')", "[1]*99999999", "[2]*8", "[1]*7", "(" * 5000 + "[1]"])
def test_a_bad_moe_layer_pattern_is_one_error(freq):
    with pytest.raises(ConfigError) as info:
        import_megatron([*SMALL.split(), "--moe-layer-freq", freq], world_size=1)
    assert info.value.key == "--moe-layer-freq"


def test_the_world_size_comes_from_the_launcher_or_the_option_and_they_must_agree():
    launcher = [*SMALL.split(), "--nnodes", "2", "--nproc_per_node", "4"]
    assert load_config(import_megatron(launcher).config).parallel.num_gpus == 8
    assert load_config(import_megatron(SMALL.split(), world_size=8).config).parallel.num_gpus == 8
    for flags, world in ((launcher, 16), (SMALL.split(), None)):  # disagreeing, and neither given
        with pytest.raises(ConfigError) as info:
            import_megatron(flags, world_size=world)
        assert info.value.key == "--world-size"


def test_legacy_checkpoint_activations_is_full_recompute_one_layer_per_checkpoint():
    legacy = import_megatron([*SMALL.split(), "--checkpoint-activations"], world_size=1).config
    modern = import_megatron([*SMALL.split(), *FULL_UNIFORM_1.split()], world_size=1).config
    assert legacy == modern and modern["recompute_checkpoint_layers"] == 1
    block = import_megatron(
        [
            *SMALL.split(),
            "--recompute-granularity",
            "full",
            "--recompute-method",
            "block",
            "--recompute-num-layers",
            "3",
        ],
        world_size=1,
    ).config
    assert (block["recompute_layers"], block["recompute_checkpoint_layers"]) == (3, 1)


def test_a_bad_plan_names_the_megatron_flag():
    with pytest.raises(ConfigError) as info:
        import_megatron(
            [*SMALL.split(), "--expert-model-parallel-size", "3", "--moe-token-dispatcher-type", "alltoall"],
            world_size=3,
        )
    assert info.value.key.startswith("--expert-model-parallel-size")


TOML = """
[job]
dump_folder = "./outputs"
[model]
name = "mixtral"
flavor = "8x7b"
hf_assets_path = "{assets}"
converters = {converters}
[optimizer]
lr = 3e-4
[training]
local_batch_size = 2
global_batch_size = 64
seq_len = 4096
[parallelism]
data_parallel_replicate_degree = 4
data_parallel_shard_degree = {shard}
tensor_parallel_degree = 2
pipeline_parallel_degree = 2
pipeline_parallel_schedule = "Interleaved1F1B"
expert_parallel_degree = 8
expert_tensor_parallel_degree = 1
[activation_checkpoint]
mode = "{ac}"
selective_ac_option = "{option}"
[compile]
enable = true
"""


def _toml(tmp_path, shard=1, ac="full", option="2", assets=None, converters="[]"):
    path = tmp_path / "job.toml"
    path.write_text(
        TOML.format(shard=shard, ac=ac, option=option, assets=assets or HF / "mixtral-8x7b", converters=converters)
    )
    return path


def test_a_torchtitan_toml_imports_with_the_model_of_its_hf_assets(tmp_path):
    imported = import_torchtitan(_toml(tmp_path))
    cfg = load_config(imported.config)
    assert cfg.model.num_layers == 32 and cfg.model.seq_len == 4096 and cfg.model.name == "mixtral-8x7b"
    spec = cfg.parallel  # 4 replicas x TP 2 x PP 2 = 16 GPUs; experts: TP x DP = 8 ranks per stage, EP 8
    assert (spec.num_gpus, spec.tp, spec.pp, spec.ep, spec.etp, spec.dp, spec.sp) == (16, 2, 2, 8, 1, 1, True)
    assert (cfg.schedule, spec.vpp, spec.micro_batch_size, spec.num_microbatches) == ("interleaved-1f1b", 2, 1, 16)
    assert spec.sequences_per_step == 64 and cfg.zero == 0
    assert (cfg.recompute, cfg.recompute_checkpoint_layers) == ("full", 1)
    assert "compile.enable = True" in imported.not_translated and "optimizer.lr = 0.0003" in imported.no_bearing


def test_torchtitan_every_nth_layer_checkpointing_is_refused_or_approximated(tmp_path):
    for kwargs, key in (
        ({"ac": "selective", "option": "4"}, "activation_checkpoint.selective_ac_option"),
        ({"ac": "selective", "option": "op"}, "activation_checkpoint.mode"),
    ):
        path = _toml(tmp_path, **kwargs)
        with pytest.raises(ConfigError) as info:
            import_torchtitan(path)
        assert info.value.key == key
    cfg = load_config(import_torchtitan(_toml(tmp_path, ac="selective", option="4"), lenient=True).config)
    assert (cfg.recompute, cfg.recompute_layers) == ("full", 2)  # 8 layers per chunk, every 4th: 2 of them


def test_torchtitan_float8_converters_set_fp8_with_current_scaling(tmp_path):
    both = '["quantize.linear.float8", "quantize.grouped_mm.float8"]'
    cfg = load_config(import_torchtitan(_toml(tmp_path, converters=both)).config)
    assert cfg.model.fp8_recipe == "current"
    assert load_config(import_torchtitan(_toml(tmp_path)).config).model.fp8_recipe in (None, "")
    with pytest.raises(ConfigError) as info:  # the experts' grouped GEMMs left in bf16: not expressible
        import_torchtitan(_toml(tmp_path, converters='["quantize.linear.float8"]'))
    assert info.value.key == "model.converters"


def test_a_torchtitan_toml_without_a_model_asks_for_one(tmp_path):
    with pytest.raises(ConfigError) as info:
        import_torchtitan(_toml(tmp_path, assets=tmp_path / "nowhere"))
    assert info.value.key == "--model"
    cfg = load_config(import_torchtitan(_toml(tmp_path, assets=tmp_path / "nowhere"), model="mixtral-8x7b").config)
    assert cfg.model.num_experts == 8


def test_the_cli_writes_a_yaml_that_loads_and_simulates(tmp_path, capsys):
    out = tmp_path / "plan.yaml"
    flags = (
        "--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 256 --vocab-size 256 --swiglu "
        "--num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 512 --expert-model-parallel-size 4 "
        "--pipeline-model-parallel-size 2 --micro-batch-size 2 --global-batch-size 16 --bf16 "
        "--moe-token-dispatcher-type alltoall --qk-layernorm"
    ).split()
    assert main(["import", "megatron", "--world-size", "8", "--", *flags, "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "--qk-layernorm" in err and out.read_text().startswith("# piper-sim config imported")
    cfg = load_config(str(out))
    assert cfg.parallel.num_gpus == 8 and cfg.parallel.sequences_per_step == 16 and cfg.model.name == "plan"
    assert main(["simulate", str(out), "--out", str(tmp_path / "sim"), "--outputs", "report"]) == 0
    assert (tmp_path / "sim" / "report.json").exists()


def test_the_cli_refuses_in_one_line_and_prints_the_yaml_without_out(tmp_path, capsys):
    assert main(["import", "megatron", "--world-size", "8", "--", *SMALL.split(), "--use-torch-fsdp2"]) == 2
    assert capsys.readouterr().err.strip().startswith("piper-sim: error: --use-torch-fsdp2")
    assert main(["import", "torchtitan", str(_toml(tmp_path))]) == 0
    assert load_config(yaml.safe_load(capsys.readouterr().out)).parallel.num_gpus == 16


@pytest.mark.parametrize(
    "spec",
    [
        ParallelSpec(pp=8, ep=32, dp=1, tp=2, etp=1, sp=True, vpp=4, num_microbatches=128),
        ParallelSpec(pp=2, ep=4, dp=3, tp=4, etp=4, num_microbatches=6, micro_batch_size=2),
        ParallelSpec(pp=12, dp=4, tp=8, etp=8, num_microbatches=384),
    ],
)
def test_megatron_degrees_invert_the_megatron_convention(spec):
    degrees = megatron_degrees(spec)
    assert degrees["DP"] * degrees["TP"] * degrees["PP"] == spec.num_gpus and degrees["EDP"] == spec.dp
    section = {k.lower(): v for k, v in degrees.items() if k != "EDP"}
    assert (
        parallel_from_section(
            {
                **section,
                "convention": "megatron",
                "sp": spec.sp,
                "micro_batch_size": spec.micro_batch_size,
                "num_microbatches": spec.num_microbatches,
            }
        )
        == spec
    )


def test_a_plan_is_labelled_with_megatrons_flags_as_the_model_zoo_counts_them():
    # the Model Zoo's Qwen3-235B row: TP 2, EP 32, PP 8, ETP 1, VPP 4, DP 16, MBS 1, GBS 2048 (mcore-qwen3-*-tp2-ep32)
    point = PlanPoint(
        pp=8,
        ep=32,
        dp=1,
        tp=2,
        etp=1,
        sp=True,
        vpp=4,
        micro_batch_size=1,
        num_microbatches=128,
        schedule="interleaved-1f1b",
        all_to_all="deepep",
        zero=1,
    )
    label = "TP2 PP8 EP32 ETP1 DP16 VPP4 SP MBS1 GBS2048 interleaved-1f1b deepep z1"
    assert megatron_label(point.as_row()) == label
    row = {
        **point.as_row(),
        "rank": 1,
        "label": point.label(),
        "fits": True,
        "refined": False,
        "peak_memory_bytes": 2**30,
        "est_step_time_s": 20.0,
        "sim_step_time_s": float("nan"),
        "sim_tflops_per_gpu": float("nan"),
        "est_tflops_per_gpu": 200.0,
        "sim_mfu": float("nan"),
        "est_mfu": 0.2,
    }
    result = SimpleNamespace(table=pd.DataFrame([row]))
    assert label in format_plan_table(result, convention="megatron")
    assert point.label() in format_plan_table(result) and label not in format_plan_table(result)


def test_plan_convention_megatron_writes_the_megatron_column(tmp_path, capsys):
    out = tmp_path / "plan"
    assert (
        main(
            [
                "plan",
                "tiny-moe",
                "--gpus",
                "8",
                "--topology",
                "uniform",
                "--global-batch",
                "16",
                "--top",
                "1",
                "--workers",
                "0",
                "--convention",
                "megatron",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    table = pd.read_csv(out / "plans.csv")
    for row in table.itertuples():
        flags = dict(re.findall(r"([A-Z]+)(\d+)", row.megatron))
        assert int(flags["DP"]) == 8 // (row.tp * row.pp) and int(flags["GBS"]) == 16 and int(flags["EP"]) == row.ep
    assert f"chosen: {table.iloc[0]['megatron']}" in capsys.readouterr().out
