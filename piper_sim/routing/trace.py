"""Routing traces: the file format (docs/routing.md), writing, reading, validation and capture.

A trace is one .npz file (numpy.savez_compressed, read with allow_pickle=False) holding
  meta           0-d string: JSON {format, version, model, num_experts, top_k, tokens_per_step, source, notes}
  layers         int64 [L]: the model layer index of each traced (MoE) layer, strictly increasing
  counts         int64 [S, L, E]: rows the router sent to each expert (top-k decisions, before capacity)
  steps          int64 [S] (optional): the training step of each traced step, strictly increasing
  source_counts  int64 [S, L, M, R, E] (optional): the same per microbatch and source EP rank;
                 summed over M and R it equals counts
Every counts[s, l] sums to tokens_per_step x top_k and no entry exceeds tokens_per_step.
A file is read only if its arrays declare at most TRACE_BYTES_LIMIT bytes (the zip directory's sizes and each
.npy header's shape, checked before anything is loaded), and every entry and meta count is at most VALUE_LIMIT,
so that no count wraps when cast or summed in int64.
Must not import simpy or torch.
"""

from __future__ import annotations

import json
import math
import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.lib import format as npy_format

from piper_sim.errors import PiperError

FORMAT = "piper-sim-routing-trace"
VERSION = 1
TRACE_BYTES_LIMIT = 2**32  # 4 GiB of arrays, uncompressed: a trace is loaded whole into memory
VALUE_LIMIT = 2**32  # an entry, tokens_per_step: a trace's sums (at most 2^29 entries of this) stay inside int64
_READ_ERRORS = (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error, KeyError)


class TraceError(PiperError):
    """A routing trace file is missing, unreadable or inconsistent."""

    def __init__(self, where: str, message: str) -> None:
        self.where, self.message = where, message
        super().__init__(where, message)  # args rebuild the error (simpy re-raises type(e)(*e.args); pickle)

    def __str__(self) -> str:
        return f"routing trace {self.where}: {' '.join(self.message.split())[:300]}"


@dataclass(frozen=True, kw_only=True, eq=False)
class RoutingTrace:
    model: str
    num_experts: int
    top_k: int
    tokens_per_step: int
    layers: np.ndarray  # int64 [L]
    counts: np.ndarray  # int64 [S, L, E]
    steps: np.ndarray | None = None  # int64 [S]
    source_counts: np.ndarray | None = None  # int64 [S, L, M, R, E]
    source: str = ""  # how the trace was made
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def num_steps(self) -> int:
        return int(self.counts.shape[0])

    @property
    def step_numbers(self) -> np.ndarray:
        return self.steps if self.steps is not None else np.arange(self.num_steps, dtype=np.int64)

    def meta(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "model": self.model,
            "num_experts": self.num_experts,
            "top_k": self.top_k,
            "tokens_per_step": self.tokens_per_step,
            "source": self.source,
            "notes": self.notes,
        }

    def equals(self, other: RoutingTrace) -> bool:
        def same(a: np.ndarray | None, b: np.ndarray | None) -> bool:
            if a is None or b is None:
                return a is b
            return np.array_equal(a, b)

        return (
            self.meta() == other.meta()
            and same(self.layers, other.layers)
            and same(self.counts, other.counts)
            and same(self.steps, other.steps)
            and same(self.source_counts, other.source_counts)
        )

    def validate(self, where: str = "<memory>") -> RoutingTrace:
        """Raise TraceError naming the first inconsistency; returns self."""
        validate_trace(self, where)
        return self


def _int_array(name: str, value: Any, ndim: int, shape_doc: str, where: str) -> np.ndarray:
    arr = np.asarray(value)
    if arr.ndim != ndim:
        raise TraceError(where, f"{name} must have shape {shape_doc}; got shape {list(arr.shape)}")
    if arr.dtype.kind not in "iu":
        if arr.dtype.kind != "f" or not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr)):
            raise TraceError(where, f"{name} must hold integers; got dtype {arr.dtype}")
    if arr.size and arr.min() < 0:
        bad = tuple(int(i) for i in np.argwhere(arr < 0)[0])
        raise TraceError(where, f"{name} has negative counts (first at index {list(bad)}: {arr[bad]})")
    if arr.size and arr.max() > VALUE_LIMIT:  # before the cast, which would wrap it
        bad = tuple(int(i) for i in np.argwhere(arr > VALUE_LIMIT)[0])
        raise TraceError(where, f"{name} has a value beyond {VALUE_LIMIT:,} (first at index {list(bad)}: {arr[bad]})")
    return arr.astype(np.int64)


def validate_trace(trace: RoutingTrace, where: str) -> None:
    for key in ("num_experts", "top_k", "tokens_per_step"):
        value = getattr(trace, key)
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or not 0 < value <= VALUE_LIMIT:
            raise TraceError(where, f"meta.{key} must be an integer from 1 to {VALUE_LIMIT:,}; got {value!r}")
    if trace.top_k > trace.num_experts:
        raise TraceError(where, f"meta.top_k ({trace.top_k}) exceeds meta.num_experts ({trace.num_experts})")
    counts = _int_array("counts", trace.counts, 3, "[steps, layers, experts]", where)
    steps, num_layers, experts = counts.shape
    if steps == 0 or num_layers == 0:
        raise TraceError(where, f"counts has no steps or no layers (shape {list(counts.shape)})")
    if experts != trace.num_experts:
        raise TraceError(
            where, f"experts mismatch: counts has {experts} experts, meta.num_experts is {trace.num_experts}"
        )
    layers = _int_array("layers", trace.layers, 1, "[layers]", where)
    if len(layers) != num_layers:
        raise TraceError(where, f"layers lists {len(layers)} layers but counts has {num_layers}")
    if np.any(np.diff(layers) <= 0):
        raise TraceError(where, f"layers must be strictly increasing; got {layers.tolist()}")
    if trace.steps is not None:
        numbers = _int_array("steps", trace.steps, 1, "[steps]", where)
        if len(numbers) != steps or np.any(np.diff(numbers) <= 0):
            raise TraceError(where, f"steps must list {steps} strictly increasing step numbers; got {numbers.tolist()}")
    expected = trace.tokens_per_step * trace.top_k
    sums = counts.sum(axis=2)
    empty = np.argwhere(sums == 0)
    if len(empty):
        s, li = (int(i) for i in empty[0])
        raise TraceError(where, f"missing layer: step {s} has no counts for layer {int(layers[li])}")
    wrong = np.argwhere(sums != expected)
    if len(wrong):
        s, li = (int(i) for i in wrong[0])
        raise TraceError(
            where,
            f"counts of step {s}, layer {int(layers[li])} sum to {int(sums[s, li])}; expected "
            f"tokens_per_step x top_k = {expected}",
        )
    if counts.max() > trace.tokens_per_step:
        s, li, e = (int(i) for i in np.argwhere(counts > trace.tokens_per_step)[0])
        raise TraceError(
            where,
            f"expert {e} of step {s}, layer {int(layers[li])} got {int(counts[s, li, e])} rows, "
            f"more than the {trace.tokens_per_step} tokens of the step",
        )
    if trace.source_counts is not None:
        per_source = _int_array(
            "source_counts", trace.source_counts, 5, "[steps, layers, microbatches, sources, experts]", where
        )
        if per_source.shape[:2] != counts.shape[:2] or per_source.shape[4] != experts:
            raise TraceError(
                where,
                f"source_counts shape {list(per_source.shape)} does not match counts shape "
                f"{list(counts.shape)} (expected [{steps}, {num_layers}, M, R, {experts}])",
            )
        if not np.array_equal(per_source.sum(axis=(2, 3)), counts):
            raise TraceError(where, "source_counts summed over microbatches and sources differ from counts")


def write_trace(trace: RoutingTrace, path: str | Path) -> Path:
    """Validate and write as a compressed .npz; returns the path written."""
    path = Path(path)
    trace.validate(str(path))
    arrays: dict[str, np.ndarray] = {
        "meta": np.array(json.dumps(trace.meta(), sort_keys=True)),
        "layers": np.asarray(trace.layers, dtype=np.int64),
        "counts": np.asarray(trace.counts, dtype=np.int64),
    }
    if trace.steps is not None:
        arrays["steps"] = np.asarray(trace.steps, dtype=np.int64)
    if trace.source_counts is not None:
        arrays["source_counts"] = np.asarray(trace.source_counts, dtype=np.int64)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as fh:  # a file handle keeps numpy from appending .npz to other suffixes
        np.savez_compressed(fh, **arrays)  # type: ignore[arg-type]  # numpy's stub lets ** fill allow_pickle
    return path


def read_trace(path: str | Path, *, num_experts: int | None = None) -> RoutingTrace:
    """Read and validate a trace; with num_experts, also check it matches the simulated model."""
    path = Path(path)
    where = str(path)
    if not path.is_file():
        raise TraceError(where, "no such file")
    try:
        check_declared_size(path, where)
        with np.load(path, allow_pickle=False) as data:
            arrays = {key: data[key] for key in data.files}
    except _READ_ERRORS as exc:
        raise TraceError(where, f"not a readable .npz file ({type(exc).__name__}: {exc})") from None
    for key in ("meta", "layers", "counts"):
        if key not in arrays:
            raise TraceError(where, f"missing array {key!r} (has {sorted(arrays)})")
    unknown = set(arrays) - {"meta", "layers", "counts", "steps", "source_counts"}
    if unknown:
        raise TraceError(where, f"unknown arrays {sorted(unknown)}")
    try:
        meta = json.loads(str(arrays["meta"]))
    except json.JSONDecodeError as exc:
        raise TraceError(where, f"meta is not JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise TraceError(where, f"meta.format must be {FORMAT!r}")
    if meta.get("version") != VERSION:
        raise TraceError(where, f"meta.version {meta.get('version')!r} is not supported (this reader: {VERSION})")
    missing = [k for k in ("model", "num_experts", "top_k", "tokens_per_step") if k not in meta]
    if missing:
        raise TraceError(where, f"meta lacks {', '.join(missing)}")
    trace = RoutingTrace(
        model=str(meta["model"]),
        num_experts=meta["num_experts"],
        top_k=meta["top_k"],
        tokens_per_step=meta["tokens_per_step"],
        layers=arrays["layers"],
        counts=arrays["counts"],
        steps=arrays.get("steps"),
        source_counts=arrays.get("source_counts"),
        source=str(meta.get("source", "")),
        notes=dict(meta.get("notes") or {}),
    )
    trace.validate(where)
    if num_experts is not None and trace.num_experts != num_experts:
        raise TraceError(where, f"experts mismatch: the trace has {trace.num_experts} experts, the model {num_experts}")
    return _as_int64(trace)


def check_declared_size(path: Path, where: str) -> None:
    """Refuse a file that is not an .npz (a lone .npy array) or whose arrays declare more than TRACE_BYTES_LIMIT
    bytes, from the zip directory and the .npy headers alone: a small file can declare terabytes."""
    with path.open("rb") as fh:
        if fh.read(len(npy_format.MAGIC_PREFIX)) == npy_format.MAGIC_PREFIX:
            raise TraceError(
                where,
                "a single .npy array, not a trace: a trace is one .npz holding the arrays meta, "
                "layers and counts (docs/routing.md; piper_sim.routing.write_trace writes one)",
            )
    total = 0
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            total += max(info.file_size, _npy_bytes(archive, info))
            if total > TRACE_BYTES_LIMIT:
                raise TraceError(
                    where,
                    f"its arrays declare {total:,} bytes by {info.filename!r}, more than the "
                    f"{TRACE_BYTES_LIMIT:,} a trace may hold",
                )


def _npy_bytes(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> int:
    """The bytes an archive member's .npy header declares (its shape times its item size)."""
    readers = {(1, 0): npy_format.read_array_header_1_0, (2, 0): npy_format.read_array_header_2_0}
    with archive.open(info) as fh:
        version = npy_format.read_magic(fh)
        if version not in readers:
            raise ValueError(f"{info.filename}: .npy format version {version} is not read here")
        shape, _, dtype = readers[version](fh)
    return math.prod(shape) * dtype.itemsize


def _as_int64(trace: RoutingTrace) -> RoutingTrace:
    def cast(a: np.ndarray | None) -> np.ndarray | None:
        return None if a is None else np.asarray(a, dtype=np.int64)

    return RoutingTrace(
        model=trace.model,
        num_experts=int(trace.num_experts),
        top_k=int(trace.top_k),
        tokens_per_step=int(trace.tokens_per_step),
        layers=np.asarray(trace.layers, dtype=np.int64),
        counts=np.asarray(trace.counts, dtype=np.int64),
        steps=cast(trace.steps),
        source_counts=cast(trace.source_counts),
        source=trace.source,
        notes=trace.notes,
    )


class TraceRecorder:
    """Capture API: the torch backend calls record() with the router's per-expert counts each step.

    recorder = TraceRecorder(model="tiny-moe", num_experts=8, top_k=2, layers=[0, 1, 2, 3])
    # in each MoE layer's forward, after top-k selection (topk_idx: [tokens, top_k]):
    recorder.record(step, layer, torch.bincount(topk_idx.flatten(), minlength=8).cpu().numpy(),
                    microbatch=mb, source=ep_rank)
    recorder.write("traces/routing/tiny-moe-wikitext.npz")
    Calls for the same (step, layer) add up. With num_microbatches and num_sources given, per-source
    counts are kept too (source_counts); otherwise all microbatches and sources of a step are summed.
    """

    def __init__(
        self,
        *,
        model: str,
        num_experts: int,
        top_k: int,
        layers: Sequence[int],
        source: str = "",
        num_microbatches: int | None = None,
        num_sources: int | None = None,
        notes: dict[str, Any] | None = None,
    ) -> None:
        self.model, self.num_experts, self.top_k, self.source = model, num_experts, top_k, source
        self.layers = [int(x) for x in layers]
        self._layer_index = {layer: i for i, layer in enumerate(self.layers)}
        self.per_source = num_microbatches is not None and num_sources is not None
        self.shape: tuple[int, ...] = (
            (len(self.layers), num_microbatches, num_sources, num_experts)
            if num_microbatches is not None and num_sources is not None  # per_source
            else (len(self.layers), num_experts)
        )
        self.notes = dict(notes or {})
        self._steps: dict[int, np.ndarray] = {}

    def record(self, step: int, layer: int, expert_counts: Any, *, microbatch: int = 0, source: int = 0) -> None:
        counts = np.asarray(expert_counts, dtype=np.int64).reshape(-1)
        if counts.shape != (self.num_experts,):
            raise TraceError("capture", f"expected {self.num_experts} expert counts, got {counts.shape[0]}")
        if layer not in self._layer_index:
            raise TraceError("capture", f"layer {layer} is not among the traced layers {self.layers}")
        buf = self._steps.setdefault(int(step), np.zeros(self.shape, dtype=np.int64))
        if self.per_source:
            if not (0 <= microbatch < self.shape[1] and 0 <= source < self.shape[2]):
                raise TraceError(
                    "capture",
                    f"microbatch {microbatch} or source {source} out of range "
                    f"({self.shape[1]} microbatches, {self.shape[2]} sources)",
                )
            buf[self._layer_index[layer], microbatch, source] += counts
        else:
            buf[self._layer_index[layer]] += counts

    def to_trace(self) -> RoutingTrace:
        if not self._steps:
            raise TraceError("capture", "nothing recorded")
        order = sorted(self._steps)
        stacked = np.stack([self._steps[s] for s in order])
        counts = stacked.sum(axis=(2, 3)) if self.per_source else stacked
        totals = np.unique(counts.sum(axis=2))
        if len(totals) != 1 or totals[0] % self.top_k:
            raise TraceError(
                "capture",
                f"layers and steps saw different token counts (rows {totals.tolist()}); "
                "a trace needs the same tokens per step in every layer",
            )
        return RoutingTrace(
            model=self.model,
            num_experts=self.num_experts,
            top_k=self.top_k,
            tokens_per_step=int(totals[0]) // self.top_k,
            layers=np.array(self.layers, dtype=np.int64),
            counts=counts,
            steps=np.array(order, dtype=np.int64),
            source_counts=stacked if self.per_source else None,
            source=self.source,
            notes=self.notes,
        ).validate("capture")

    def write(self, path: str | Path) -> Path:
        return write_trace(self.to_trace(), path)
