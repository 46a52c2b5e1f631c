"""What the calibration measures: shapes taken from the shipped model presets, full or quick.

Owns the choice of what is swept (GEMM (k, n) pairs and rows, expert FFN shapes, attention sequence lengths and
head configurations, elementwise sizes, optimizer points, message sizes, the preset layers the framework benchmark
builds); the records that carry it (Sweep, TimingPlan, the shapes) are the benchmarks' input types
(piper_sim.torch_backend.bench.calibration_inputs). Pure data: must not import torch.
"""

from __future__ import annotations

from dataclasses import fields

from piper_sim.torch_backend.bench.calibration_inputs import (
    MICRO_MODEL,
    MICRO_SHAPES,
    AttentionShape,
    FfnShape,
    GemmShape,
    Sweep,
    TimingPlan,
)
from piper_sim.workload.model import SET_BY_CONFIG, ModelSpec
from piper_sim.workload.presets import load_model
from piper_sim.workload.profile import NOT_IN_LAYER_KEY

DEFAULT_PRESETS = ("tiny-moe", "small-moe")
KiB = 1024
TINY_OPS = ("add", "mul", "softmax", "linear")  # kernel_launch_us is the median of these (autograd on)
# the framework benchmark builds one layer of a preset (with embedding and head) on the CPU: only where
# that stage is at most this many parameters (tiny-moe 0.25M, small-moe 3.5M, switch-base 32M) and the
# torch backend runs the layer as specified (not MLA); larger presets are priced from the micro model
LAYER_BENCH_MAX_PARAMS = 50_000_000


def model_layer(model: ModelSpec) -> dict | None:
    """One layer of a model preset at its own dimensions, as a model dict the framework benchmark runs
    (its op times then include the memory traffic and cache misses of the model's real tensor sizes);
    None where that is out of the benchmark's reach (LAYER_BENCH_MAX_PARAMS, MLA)."""
    stage_params = max(model.layer_params(i) for i in range(model.num_layers)) + model.embedding_params()
    if model.mla is not None or stage_params > LAYER_BENCH_MAX_PARAMS:
        return None
    # every field the cost model matches layers on (cost.layer_key), so the preset's own runs find this layer
    # (not the fields a config sets from its cost section: a model mapping may not give them)
    return {
        **{f.name: getattr(model, f.name) for f in fields(model) if f.name not in NOT_IN_LAYER_KEY | SET_BY_CONFIG},
        "name": model.name,
        "num_layers": 1,
        "seq_len": MICRO_MODEL["seq_len"],
        "num_experts": model.num_experts,
    }


def model_gemm_shapes(model: ModelSpec) -> list[GemmShape]:
    """The (k, n) of every GEMM one layer and the head of this model run (forward)."""
    d, f, h, kv, hd = model.d_model, model.expert_ffn_dim, model.num_heads, model.kv_heads, model.attn_head_dim
    name = model.name
    return [
        GemmShape(k=d, n=f, label=f"{name} expert up"),
        GemmShape(k=f, n=d, label=f"{name} expert down"),
        GemmShape(k=d, n=h * hd, label=f"{name} attn q"),
        GemmShape(k=d, n=kv * hd, label=f"{name} attn k/v"),
        GemmShape(k=h * hd, n=d, label=f"{name} attn out"),
        GemmShape(k=d, n=model.num_experts, label=f"{name} router"),
        GemmShape(k=d, n=model.vocab_size, label=f"{name} head"),
    ]


def _dedupe_gemms(shapes: list[GemmShape]) -> tuple[GemmShape, ...]:
    seen: dict[tuple[int, int], GemmShape] = {}
    for s in shapes:
        seen.setdefault((s.k, s.n), s)
    return tuple(seen.values())


def _powers(lo: int, hi: int, step: int = 2) -> tuple[int, ...]:
    out, v = [], lo
    while v <= hi:
        out.append(v)
        v *= step
    return tuple(out)


def make_sweep(quick: bool = False, presets: tuple[str, ...] = DEFAULT_PRESETS, cuda: bool = False) -> Sweep:
    """The full sweep (tens of minutes) or the quick one (about 5 minutes on 2 cores: fewer shapes and samples)."""
    models = [load_model(name) for name in presets]
    gemms = _dedupe_gemms([s for m in models for s in model_gemm_shapes(m)])
    ffns = tuple(
        FfnShape(d_model=m.d_model, ffn_dim=m.expert_ffn_dim, num_matrices=nm, label=f"{m.name} {nm}-matrix expert")
        for m in models
        for nm in (2, 3)
    )
    attn = tuple(
        AttentionShape(batch=2, heads=m.num_heads, head_dim=m.attn_head_dim, label=f"{m.name} attention")
        for m in models
    )
    attn += (AttentionShape(batch=2, heads=8, head_dim=64, label="head dim 64"),)
    top = 4 if cuda else 1  # GPUs need bigger problems to reach their peak
    layers = tuple(layer for layer in map(model_layer, models) if layer is not None)
    if quick:
        experts = [s for s in gemms if "expert" in s.label]
        return Sweep(
            quick=True,
            timing=TimingPlan(sample_s=0.004, num_samples=3, warmup_calls=2),
            comm_timing=TimingPlan(sample_s=0.002, num_samples=3, warmup_calls=2),
            gemm_rows=_powers(1, 1024, 4),
            gemm_shapes=tuple(experts),
            ffn_rows=(1, 16, 256),
            ffn_shapes=tuple(s for s in ffns if s.num_matrices == 3),
            attention_seq_lens=(16, 64, 256),
            attention_shapes=attn[:2],
            elementwise_bytes=_powers(KiB, 4096 * KiB, 8),
            optimizer_points=((4096, 1), (262144, 1), (4096, 16), (262144, 16)),
            message_bytes=_powers(KiB, 1024 * KiB, 16),
            layers=layers[:1],
            layer_shapes=MICRO_SHAPES[:1],
        )
    return Sweep(
        quick=False,
        timing=TimingPlan(),
        comm_timing=TimingPlan(sample_s=0.01, num_samples=7),
        gemm_rows=_powers(1, 4096 * top),
        gemm_shapes=gemms,
        ffn_rows=_powers(1, 4096 * top, 4),
        ffn_shapes=ffns,
        attention_seq_lens=_powers(16, 2048 * top),
        attention_shapes=attn,
        elementwise_bytes=_powers(KiB, 64 * 1024 * KiB * top, 4),
        optimizer_points=tuple((p, t) for p in (16384, 262144, 1048576, 4194304) for t in (1, 4, 16, 64)),
        message_bytes=_powers(KiB, 16 * 1024 * KiB, 4),
        layers=layers,
        layer_shapes=MICRO_SHAPES,
        framework_rounds=3,
    )
