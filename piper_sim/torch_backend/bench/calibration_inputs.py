"""What a calibration run is given: the sweep of shapes and sizes, the timing protocol's parameters and
the job each rank runs. Pure data: imports no torch, so piper_sim.calibrate builds these without it.

Owns TimingPlan, the shape records, Sweep (which calibrate/sweep.py fills from the model presets), the
micro model the framework benchmark runs, and CalibrationJob. Must not import piper_sim.calibrate
(calibrate calls the benchmarks, not the other way round).
"""

from __future__ import annotations

from dataclasses import dataclass

# A model whose ops do next to no arithmetic: its op times are the framework's fixed costs. It runs at
# several (seq_len, micro-batch size) shapes, because index, sort and softmax-type work grows with the
# tokens even when the arithmetic is negligible: 8, 256 and 1024 tokens.
MICRO_MODEL = {
    "name": "micro-moe",
    "num_layers": 1,
    "d_model": 8,
    "num_heads": 2,
    "vocab_size": 16,
    "seq_len": 8,
    "expert_ffn_dim": 8,
    "num_experts": 4,
    "top_k": 2,
    "expert_matrices": 3,
    "dtype": "fp32",
}
MICRO_SHAPES = ((8, 1), (128, 2), (256, 4))
# the experts op also runs with these numbers of experts: a fixed part (sort, split, gather) and a part
# per expert (its GEMMs and activation), fitted as a line over them
MICRO_EXPERTS = (2, 4, 8)
# the communication benchmarks (torch_backend/bench/comm.py), in the order they run: point-to-point, then the
# collectives in disjoint groups of each size
COLLECTIVES = ("all_to_all", "all_reduce", "all_gather", "reduce_scatter")
COMM_BENCHES = ("p2p", *COLLECTIVES)


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
        return TimingPlan(
            sample_s=self.sample_s * factor,
            num_samples=self.num_samples,
            warmup_calls=self.warmup_calls,
            max_calls=self.max_calls,
        )


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
        return [(MICRO_MODEL, shape) for shape in MICRO_SHAPES] + [
            (layer, shape) for layer in self.layers for shape in self.layer_shapes
        ]

    def num_compute_items(self) -> int:
        # per stage: its 7 ops, the 2 exchanges (stage_ops.EXCHANGE_OPS), the experts op at other expert counts
        framework = self.framework_rounds * sum(9 + len(layer_expert_counts(m)) - 1 for m, _ in self.framework_runs())
        return (
            len(self.gemm_rows) * len(self.gemm_shapes)
            + len(self.ffn_rows) * len(self.ffn_shapes) * 2
            + len(self.attention_seq_lens) * len(self.attention_shapes)
            + 5 * len(self.elementwise_bytes)
            + len(self.optimizer_points)
            + framework
        )


@dataclass(frozen=True)
class CalibrationJob:
    """What each rank runs; picklable. The sweep depends on the device a rank finds (GPUs get bigger
    problems), so the job carries both and each rank takes its own (sweep())."""

    records_dir: str
    quick: bool
    presets: tuple[str, ...]
    cpu_sweep: Sweep
    cuda_sweep: Sweep
    compute: bool = True
    comm: bool = True
    levels: dict[str, list[tuple[int, int]]] | None = None
    tag: str = "local"
    max_message_bytes: int | None = None  # emulated networks are slow: cap the message sizes
    benches: tuple[str, ...] | None = None  # the communication benchmarks to run (of COMM_BENCHES; None: all)

    def sweep(self, cuda: bool) -> Sweep:
        return self.cuda_sweep if cuda else self.cpu_sweep
