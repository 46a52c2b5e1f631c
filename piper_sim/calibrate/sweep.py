"""What the calibration measures: shapes taken from the shipped model presets, full or quick.

Owns the Sweep and the TimingPlan (GEMM (k, n) pairs and rows, expert FFN shapes, attention sequence lengths and head
configurations, elementwise sizes, optimizer points, message sizes and group sizes). Pure data: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from piper_sim.workload.cost import NOT_IN_LAYER_KEY
from piper_sim.workload.model import ModelSpec
from piper_sim.workload.presets import load_model

DEFAULT_PRESETS = ("tiny-moe", "small-moe")
KiB = 1024
TINY_OPS = ("add", "mul", "softmax", "linear")  # kernel_launch_us is the median of these (autograd on)
# A model whose ops do next to no arithmetic: its op times are the framework's fixed costs. It runs at
# several (seq_len, micro-batch size) shapes, because index, sort and softmax-type work grows with the
# tokens even when the arithmetic is negligible: 8, 256 and 1024 tokens.
MICRO_MODEL = {"name": "micro-moe", "num_layers": 1, "d_model": 8, "num_heads": 2, "vocab_size": 16, "seq_len": 8,
               "expert_ffn_dim": 8, "num_experts": 4, "top_k": 2, "expert_matrices": 3, "dtype": "fp32"}
MICRO_SHAPES = ((8, 1), (128, 2), (256, 4))
# the experts op also runs with these numbers of experts: a fixed part (sort, split, gather) and a part
# per expert (its GEMMs and activation), fitted as a line over them
MICRO_EXPERTS = (2, 4, 8)


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
    return {**{f.name: getattr(model, f.name) for f in fields(model) if f.name not in NOT_IN_LAYER_KEY},
            "name": model.name, "num_layers": 1, "seq_len": MICRO_MODEL["seq_len"], "num_experts": model.num_experts}


def layer_expert_counts(layer: dict) -> tuple[int, ...]:
    """Numbers of experts the framework benchmark runs the experts op with (MICRO_EXPERTS and the layer's
    own): the line over them prices any number an EP rank holds."""
    return tuple(sorted(set(MICRO_EXPERTS) | {layer["num_experts"]}))


@dataclass(frozen=True, kw_only=True)
class TimingPlan:
    sample_s: float = 0.04  # one sample lasts about this long (a window, or an inner loop of several calls)
    num_samples: int = 5
    warmup_calls: int = 3
    max_calls: int = 20000  # inner-loop cap per sample

    def scaled(self, factor: float) -> TimingPlan:
        return TimingPlan(sample_s=self.sample_s * factor, num_samples=self.num_samples,
                          warmup_calls=self.warmup_calls, max_calls=self.max_calls)


@dataclass(frozen=True, kw_only=True)
class GemmShape:
    k: int
    n: int
    label: str  # where the shape comes from, e.g. "small-moe expert up"


@dataclass(frozen=True, kw_only=True)
class FfnShape:
    d_model: int
    ffn_dim: int
    num_matrices: int
    label: str


@dataclass(frozen=True, kw_only=True)
class AttentionShape:
    batch: int
    heads: int
    head_dim: int
    label: str


@dataclass(frozen=True, kw_only=True)
class Sweep:
    quick: bool
    timing: TimingPlan  # compute benchmarks (CPU: windows long against the scheduler's time slice)
    comm_timing: TimingPlan
    gemm_rows: tuple[int, ...]
    gemm_shapes: tuple[GemmShape, ...]
    ffn_rows: tuple[int, ...]
    ffn_shapes: tuple[FfnShape, ...]
    attention_seq_lens: tuple[int, ...]
    attention_shapes: tuple[AttentionShape, ...]
    elementwise_bytes: tuple[int, ...]
    optimizer_points: tuple[tuple[int, int], ...]  # (parameters, tensors)
    message_bytes: tuple[int, ...]
    # the framework benchmark: the micro model at MICRO_SHAPES, then one layer of each preset at these
    # (seq_len, micro-batch size) shapes
    layers: tuple[dict, ...]
    layer_shapes: tuple[tuple[int, int], ...]
    # the framework benchmark's list runs this many times, each with a share of the samples (pooled per op)
    framework_rounds: int = 1

    def framework_runs(self) -> list[tuple[dict, tuple[int, int]]]:
        """(model dict, (seq_len, micro-batch size)) of every stage the framework benchmark builds."""
        return ([(MICRO_MODEL, shape) for shape in MICRO_SHAPES]
                + [(layer, shape) for layer in self.layers for shape in self.layer_shapes])

    def num_compute_items(self) -> int:
        # per stage: its 7 ops, the 2 exchanges (stage_ops.EXCHANGE_OPS), the experts op at other expert counts
        framework = self.framework_rounds * sum(9 + len(layer_expert_counts(m)) - 1 for m, _ in self.framework_runs())
        return (len(self.gemm_rows) * len(self.gemm_shapes) + len(self.ffn_rows) * len(self.ffn_shapes) * 2
                + len(self.attention_seq_lens) * len(self.attention_shapes) + 5 * len(self.elementwise_bytes)
                + len(self.optimizer_points) + framework)


def model_gemm_shapes(model: ModelSpec) -> list[GemmShape]:
    """The (k, n) of every GEMM one layer and the head of this model run (forward)."""
    d, f, h, kv, hd = model.d_model, model.expert_ffn_dim, model.num_heads, model.kv_heads, model.attn_head_dim
    name = model.name
    return [GemmShape(k=d, n=f, label=f"{name} expert up"), GemmShape(k=f, n=d, label=f"{name} expert down"),
            GemmShape(k=d, n=h * hd, label=f"{name} attn q"), GemmShape(k=d, n=kv * hd, label=f"{name} attn k/v"),
            GemmShape(k=h * hd, n=d, label=f"{name} attn out"),
            GemmShape(k=d, n=model.num_experts, label=f"{name} router"),
            GemmShape(k=d, n=model.vocab_size, label=f"{name} head")]


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
    """The full sweep (minutes) or the quick one (well under a minute on a laptop, for tests and CI)."""
    models = [load_model(name) for name in presets]
    gemms = _dedupe_gemms([s for m in models for s in model_gemm_shapes(m)])
    ffns = tuple(FfnShape(d_model=m.d_model, ffn_dim=m.expert_ffn_dim, num_matrices=nm,
                          label=f"{m.name} {nm}-matrix expert") for m in models for nm in (2, 3))
    attn = tuple(AttentionShape(batch=2, heads=m.num_heads, head_dim=m.attn_head_dim, label=f"{m.name} attention")
                 for m in models)
    attn += (AttentionShape(batch=2, heads=8, head_dim=64, label="head dim 64"),)
    top = 4 if cuda else 1  # GPUs need bigger problems to reach their peak
    layers = tuple(layer for layer in map(model_layer, models) if layer is not None)
    if quick:
        experts = [s for s in gemms if "expert" in s.label]
        return Sweep(quick=True, timing=TimingPlan(sample_s=0.004, num_samples=3, warmup_calls=2),
                     comm_timing=TimingPlan(sample_s=0.002, num_samples=3, warmup_calls=2),
                     gemm_rows=_powers(1, 1024, 4), gemm_shapes=tuple(experts), ffn_rows=(1, 16, 256),
                     ffn_shapes=tuple(s for s in ffns if s.num_matrices == 3), attention_seq_lens=(16, 64, 256),
                     attention_shapes=attn[:2], elementwise_bytes=_powers(KiB, 4096 * KiB, 8),
                     optimizer_points=((4096, 1), (262144, 1), (4096, 16), (262144, 16)),
                     message_bytes=_powers(KiB, 1024 * KiB, 16), layers=layers[:1], layer_shapes=MICRO_SHAPES[:1])
    return Sweep(quick=False, timing=TimingPlan(), comm_timing=TimingPlan(sample_s=0.01, num_samples=7),
                 gemm_rows=_powers(1, 4096 * top), gemm_shapes=gemms, ffn_rows=_powers(1, 4096 * top, 4),
                 ffn_shapes=ffns, attention_seq_lens=_powers(16, 2048 * top), attention_shapes=attn,
                 elementwise_bytes=_powers(KiB, 64 * 1024 * KiB * top, 4),
                 optimizer_points=tuple((p, t) for p in (16384, 262144, 1048576, 4194304) for t in (1, 4, 16, 64)),
                 message_bytes=_powers(KiB, 16 * 1024 * KiB, 4), layers=layers, layer_shapes=MICRO_SHAPES,
                 framework_rounds=3)
