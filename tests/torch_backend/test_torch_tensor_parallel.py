"""Tensor-parallel split layers in one process (docs/tensor-parallel.md): each rank's slice of a parameter is the
slice of the single-process model's parameter, and a split region's outputs over the TP ranks (h / tp + partial
each) sum to the whole region's output, their input gradients to its input gradient; every sliced parameter's
gradient is the slice of the whole one, and the whole (replicated) parameters' gradients sum to it."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from piper_sim.torch_backend.corpus import VOCAB_SIZE  # noqa: E402
from piper_sim.torch_backend.stage_modules import StageModule, run_without_exchange  # noqa: E402
from piper_sim.torch_backend.tensor_parallel import TensorShard  # noqa: E402
from piper_sim.workload.model import ModelSpec  # noqa: E402

SEQ, BATCH, TP = 16, 2, 2
# a dense first layer, then MoE with a shared expert; GQA (4 heads, 2 kv heads), SwiGLU experts
SPEC = ModelSpec(
    num_layers=2,
    d_model=32,
    num_heads=4,
    num_kv_heads=2,
    vocab_size=VOCAB_SIZE,
    seq_len=SEQ,
    expert_ffn_dim=16,
    num_experts=4,
    top_k=2,
    num_shared_experts=1,
    num_dense_layers=1,
    dense_ffn_dim=48,
)
REGIONS = {
    "attention": ("attn:0",),
    "dense FFN": ("dense:0",),
    "MoE block, experts split (etp == tp)": ("router:1", "shared:1", "experts:1", "moe_out:1"),
}


def stages(tp: int = TP) -> tuple[StageModule, list[StageModule]]:
    """The whole stage and its tp shards (experts split too: etp == tp), float64."""
    kw = {"first": True, "last": False, "seed": 5, "dtype": torch.float64}
    whole = StageModule(SPEC, range(SPEC.num_layers), **kw)
    shards = [
        StageModule(SPEC, range(SPEC.num_layers), shard=TensorShard(tp=tp, index=i, etp=tp), **kw) for i in range(tp)
    ]
    return whole, shards


def test_shards_hold_slices_of_the_reference_parameters():
    whole, shards = stages()
    full = dict(whole.named_parameters())
    for module in shards:
        for name, param in module.named_parameters():
            assert torch.equal(param, module.shard.take(name, full[name])), name
    wq = [dict(m.named_parameters())["layers.0.attn.wq"] for m in shards]
    assert wq[0].shape == (SPEC.num_heads // TP * SPEC.attn_head_dim, SPEC.d_model)
    assert not torch.equal(wq[0], wq[1])


def run_region(stage: StageModule, ops: tuple[str, ...], h: torch.Tensor, grad: torch.Tensor) -> tuple:
    """The region's output on a leaf copy of h, and the gradients of h and of the parameters for grad."""
    stage.zero_grad(set_to_none=True)
    leaf = h.clone().requires_grad_(True)
    state = {"h": leaf}
    run_without_exchange(stage, ops, state)
    state["h"].backward(grad)
    params = {n: p.grad for n, p in stage.named_parameters() if p.grad is not None}
    return state["h"].detach(), leaf.grad, params


@pytest.mark.parametrize("region", sorted(REGIONS))
def test_split_region_outputs_and_gradients_sum_to_the_whole(region):
    ops = REGIONS[region]
    whole, shards = stages()
    gen = torch.Generator().manual_seed(1)
    h = torch.randn(BATCH, SEQ, SPEC.d_model, generator=gen, dtype=torch.float64)
    grad = torch.randn(BATCH, SEQ, SPEC.d_model, generator=gen, dtype=torch.float64)
    want_out, want_grad, want_params = run_region(whole, ops, h, grad)
    outs, grads, params = zip(*(run_region(m, ops, h, grad) for m in shards), strict=True)
    torch.testing.assert_close(sum(outs), want_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(sum(grads), want_grad, rtol=1e-12, atol=1e-12)
    assert set(params[0]) == set(want_params)
    for name, want in want_params.items():
        shard = shards[0].shard
        if shard.param_class(name) == "replicated":  # partial per TP rank: the stage's all-reduce sums them
            torch.testing.assert_close(sum(p[name] for p in params), want, rtol=1e-12, atol=1e-12, msg=name)
        else:
            for module, p in zip(shards, params, strict=True):
                torch.testing.assert_close(p[name], module.shard.take(name, want), rtol=1e-12, atol=1e-12, msg=name)


def test_vocabulary_parallel_embedding_lookups_sum_to_the_whole():
    whole, shards = stages()
    tokens = torch.randint(0, VOCAB_SIZE, (BATCH, SEQ), generator=torch.Generator().manual_seed(2))
    lookups = []
    for stage in (whole, *shards):
        state = {"tokens": tokens}
        stage.run_op("embed", state)
        lookups.append(state["h"])
    assert torch.equal(lookups[1] + lookups[2], lookups[0])
    assert all((part != 0).any(dim=-1).sum() < tokens.numel() for part in lookups[1:])  # each misses some tokens


def test_parameter_classes_name_the_gradient_groups():
    split, whole_experts = TensorShard(tp=2, etp=2), TensorShard(tp=2, etp=1)
    assert split.param_class("layers.1.experts.3.w1") == "expert"
    assert split.param_class("layers.1.shared.0.w2") == "dense"
    assert whole_experts.param_class("layers.1.shared.0.w2") == "replicated"
    for shard in (split, whole_experts):
        assert shard.param_class("layers.0.attn.wo") == "dense"
        assert shard.param_class("head.weight") == "dense"
        assert shard.param_class("layers.1.router.weight") == "replicated"
        assert shard.param_class("layers.1.norm2.weight") == "replicated"
    assert TensorShard().param_class("layers.1.router.weight") == "dense"  # tp 1: every rank holds all of it
