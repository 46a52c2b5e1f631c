"""Pure pipeline schedule generators: (pp, vpp, num_microbatches) -> one coarse program per stage.

Owns the orders of gpipe, 1f1b, interleaved-1f1b (Megatron), zb-h1 (Qi et al. 2023), dualpipe
(DeepSeek-V3) and dualpipe-v; generator_registry.py names them and gives each its layout (ir.Layout). Must not
import simpy, torch, numpy or anything that runs, nor the registry; generators are pure functions of their arguments.

A coarse program holds forward / backward (or backward_input + backward_weight) tasks per chunk and
microbatch, ids from coarse_task_id, and same-rank deps only (B after its F, W after its B). Chunk c
on stage p is virtual stage c * pp + p. Cross-stage dependencies are implicit (lowering adds
send/recv); each order here runs without deadlock when every task blocks until its neighbours' data
arrived (checked by validate.dry_run_coarse).
"""

from __future__ import annotations

import functools

from piper_sim.errors import ConfigError
from piper_sim.schedule.ir import Task, coarse_task_id
from piper_sim.workload.task_kinds import TaskKind

Program = tuple[Task, ...]
Programs = tuple[Program, ...]
# (kind, chunk, microbatch) of one coarse step, before it becomes a Task.
Step = tuple[TaskKind, int, int]


@functools.lru_cache(maxsize=1 << 16)
def _task(kind: TaskKind, chunk: int, microbatch: int) -> Task:
    """One coarse step as a Task (immutable: the programs of every stage and schedule share it)."""
    if kind == TaskKind.FORWARD:
        deps: tuple[str, ...] = ()
    elif kind == TaskKind.BACKWARD_WEIGHT:
        deps = (coarse_task_id(TaskKind.BACKWARD_INPUT, chunk, microbatch),)
    else:
        deps = (coarse_task_id(TaskKind.FORWARD, chunk, microbatch),)
    return Task(
        task_id=coarse_task_id(kind, chunk, microbatch), kind=kind, microbatch=microbatch, chunk=chunk, deps=deps
    )


def _program(steps: list[Step]) -> Program:
    return tuple(_task(kind, chunk, mb) for kind, chunk, mb in steps)


def _check_sizes(pp: int, vpp: int, num_microbatches: int) -> None:
    for key, value in (("parallel.pp", pp), ("parallel.vpp", vpp), ("parallel.num_microbatches", num_microbatches)):
        if not isinstance(value, int) or value < 1:
            raise ConfigError(key, value, "an integer >= 1")


def _require_vpp_one(name: str, vpp: int) -> None:
    if vpp != 1:
        raise ConfigError("parallel.vpp", vpp, f"1 for schedule {name!r} (use interleaved-1f1b for vpp > 1)")


def gpipe(pp: int, vpp: int, num_microbatches: int) -> Programs:
    """GPipe (Huang et al. 2019): all forwards, then all backwards.

    With vpp > 1 the forwards run chunk by chunk (chunk 0 for every microbatch, then chunk 1, ...)
    and the backwards in reverse chunk order, which is deadlock-free and keeps the bubble at
    (pp - 1) chunk-times; activations of all microbatches are held at the peak.
    """
    _check_sizes(pp, vpp, num_microbatches)
    mbs = range(num_microbatches)
    forwards = [(TaskKind.FORWARD, c, m) for c in range(vpp) for m in mbs]
    backwards = [(TaskKind.BACKWARD, c, m) for c in reversed(range(vpp)) for m in mbs]
    return tuple(_program(forwards + backwards) for _ in range(pp))


def _one_f_one_b_steps(pp: int, stage: int, num_microbatches: int) -> list[Step]:
    warmup = min(pp - stage - 1, num_microbatches)
    steps: list[Step] = [(TaskKind.FORWARD, 0, m) for m in range(warmup)]
    for k in range(num_microbatches - warmup):
        steps += [(TaskKind.FORWARD, 0, warmup + k), (TaskKind.BACKWARD, 0, k)]
    steps += [(TaskKind.BACKWARD, 0, m) for m in range(num_microbatches - warmup, num_microbatches)]
    return steps


def one_f_one_b(pp: int, vpp: int, num_microbatches: int) -> Programs:
    """1F1B (PipeDream-Flush, Narayanan et al. 2021): stage p runs min(pp - p - 1, m) warm-up
    forwards, then alternates one forward and one backward, then drains the backwards.

    At most pp - p microbatches are in flight on stage p.
    """
    _check_sizes(pp, vpp, num_microbatches)
    _require_vpp_one("1f1b", vpp)
    return tuple(_program(_one_f_one_b_steps(pp, p, num_microbatches)) for p in range(pp))


def _interleaved_step(kind: TaskKind, k: int, pp: int, vpp: int) -> Step:
    """The k-th forward (or backward) of a stage in Megatron's interleaved order."""
    group, in_group = divmod(k, pp * vpp)
    chunk = in_group // pp
    if kind == TaskKind.BACKWARD:
        chunk = vpp - 1 - chunk
    return (kind, chunk, group * pp + in_group % pp)


def _interleaved_steps(pp: int, vpp: int, stage: int, num_microbatches: int) -> list[Step]:
    total = num_microbatches * vpp
    if num_microbatches == pp:
        warmup = total
    else:
        warmup = min((pp - stage - 1) * 2 + (vpp - 1) * pp, total)
    steps = [_interleaved_step(TaskKind.FORWARD, k, pp, vpp) for k in range(warmup)]
    for k in range(total - warmup):
        steps.append(_interleaved_step(TaskKind.FORWARD, warmup + k, pp, vpp))
        steps.append(_interleaved_step(TaskKind.BACKWARD, k, pp, vpp))
    steps += [_interleaved_step(TaskKind.BACKWARD, k, pp, vpp) for k in range(total - warmup, total)]
    return steps


def interleaved_one_f_one_b(pp: int, vpp: int, num_microbatches: int) -> Programs:
    """Interleaved 1F1B (Megatron-LM, Narayanan et al. 2021) over vpp chunks per stage.

    Microbatches go in groups of pp: a stage runs forwards of chunk 0 for one group, then chunk 1,
    ...; backwards run the chunks in reverse. Warm-up on stage p is (pp - p - 1) * 2 + (vpp - 1) * pp
    forwards (all of them when num_microbatches == pp). The bubble is (pp - 1) / vpp of 1F1B's.
    """
    _check_sizes(pp, vpp, num_microbatches)
    if vpp < 2:
        raise ConfigError("parallel.vpp", vpp, "an integer >= 2 for interleaved-1f1b (use 1f1b for vpp = 1)")
    if num_microbatches % pp:
        raise ConfigError(
            "parallel.num_microbatches", num_microbatches, f"a multiple of parallel.pp ({pp}) for interleaved-1f1b"
        )
    return tuple(_program(_interleaved_steps(pp, vpp, p, num_microbatches)) for p in range(pp))


def _zb_h1_steps(pp: int, stage: int, num_microbatches: int) -> list[Step]:
    warmup = min(pp - stage - 1, num_microbatches)
    weight_delay = pp - 1 - warmup  # = stage when num_microbatches >= pp
    steps: list[Step] = [(TaskKind.FORWARD, 0, m) for m in range(warmup)]
    next_w = 0
    for k in range(num_microbatches):
        if warmup + k < num_microbatches:
            steps.append((TaskKind.FORWARD, 0, warmup + k))
        steps.append((TaskKind.BACKWARD_INPUT, 0, k))
        if k >= weight_delay:
            steps.append((TaskKind.BACKWARD_WEIGHT, 0, next_w))
            next_w += 1
    steps += [(TaskKind.BACKWARD_WEIGHT, 0, m) for m in range(next_w, num_microbatches)]
    return steps


def zb_h1(pp: int, vpp: int, num_microbatches: int) -> Programs:
    """ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", section 2.1).

    1F1B with the backward split into backward_input (B) and backward_weight (W). Warm-up is as in
    1F1B, so at most pp - p forwards await their B on stage p (1F1B's peak activation memory); W on
    stage p lags p microbatches behind B and the deferred W passes fill the cool-down bubble.
    With equal F, B and W times the bubble is (pp - 1) * (t_F + t_B - t_W), a third of 1F1B's.
    """
    _check_sizes(pp, vpp, num_microbatches)
    _require_vpp_one("zb-h1", vpp)
    return tuple(_program(_zb_h1_steps(pp, p, num_microbatches)) for p in range(pp))


class _DualPipeRank:
    """Builds one rank's program in DualPipe's phases (dualpipe and dualpipe-v).

    phase 0 is the chunk this rank runs first in its pipeline's order (dualpipe: the direction in which
    the rank sits in the first half, so chunk = phase ^ flip, flip for ranks >= pp / 2; dualpipe-v: chunk
    0, the down arm of the V). Each chunk runs its microbatches in order from starts[chunk]; split
    backwards queue their weight pass, which w() runs first in, first out (the reference
    implementation's WeightGradStore).
    """

    def __init__(self, flip: int, starts: tuple[int, int]) -> None:
        self.flip = flip
        self.next_f = list(starts)
        self.next_b = list(starts)
        self.weights: list[tuple[int, int]] = []
        self.steps: list[Step] = []

    def _chunk(self, phase: int) -> int:
        return phase ^ self.flip

    def f(self, phase: int) -> None:
        chunk = self._chunk(phase)
        self.steps.append((TaskKind.FORWARD, chunk, self.next_f[chunk]))
        self.next_f[chunk] += 1

    def b(self, phase: int, split: bool = False) -> None:
        """Backward; split: its weight pass waits in the queue for w(), else it follows at once."""
        chunk = self._chunk(phase)
        mb = self.next_b[chunk]
        self.next_b[chunk] += 1
        self.steps.append((TaskKind.BACKWARD_INPUT, chunk, mb))
        if split:
            self.weights.append((chunk, mb))
        else:
            self.steps.append((TaskKind.BACKWARD_WEIGHT, chunk, mb))

    def w(self) -> None:
        chunk, mb = self.weights.pop(0)
        self.steps.append((TaskKind.BACKWARD_WEIGHT, chunk, mb))


def _dualpipe_phases(r: _DualPipeRank, ranks: int, h: int, per_phase: int) -> list[Step]:
    """The eight phases of `step` in the reference: `ranks` in one direction of the pipeline (pp / 2 for
    dualpipe, pp for dualpipe-v), h the rank's place among them, per_phase microbatches per chunk."""
    n = ranks - h - 1
    for _ in range(2 * n):  # 1: warm-up forwards of phase 0
        r.f(0)
    for _ in range(h + 1):  # 2: forwards of both phases
        r.f(0)
        r.f(1)
    for _ in range(n):  # 3: B1 (split), W, F1
        r.b(1, split=True)
        r.w()
        r.f(1)
    for _ in range(per_phase - 2 * ranks + h + 1):  # 4, steady state: the pairs (F0, B1), (F1, B0)
        r.f(0)
        r.b(1)
        r.f(1)
        r.b(0)
    for _ in range(n):  # 5: B1, then the pair (F1, B0)
        r.b(1)
        r.f(1)
        r.b(0)
    for i in range(h + 1):  # 6: backwards of both phases, split from the middle of the phase on
        r.b(1, split=i > (h + 1) // 2 or (i == (h + 1) // 2 and h % 2 == 1))
        r.b(0, split=i >= (h + 1) // 2)
    for _ in range(n):  # 7: W, B0 (split)
        r.w()
        r.b(0, split=True)
    for _ in range(h + 1):  # 8: the remaining weight passes
        r.w()
    return r.steps


def _dualpipe_steps(pp: int, stage: int, num_microbatches: int) -> list[Step]:
    """Rank `stage` of DualPipe: ranks p and pp - 1 - p are at the same distance h from their ends."""
    half = num_microbatches // 2
    rank = _DualPipeRank(flip=int(stage >= pp // 2), starts=(0, half))
    return _dualpipe_phases(rank, pp // 2, min(stage, pp - 1 - stage), half)


def _check_two_chunks(name: str, vpp: int) -> None:
    if vpp != 2:
        raise ConfigError("parallel.vpp", vpp, f"2 for {name} (each rank holds two chunks)")


def dualpipe(pp: int, vpp: int, num_microbatches: int) -> Programs:
    """DualPipe (DeepSeek-AI 2024, DeepSeek-V3 Technical Report, section 3.2.1 and figure 5; the order of
    github.com/deepseek-ai/DualPipe, dualpipe.py `DualPipe.step`).

    Two pipelines over the same layers, fed from both ends (layout "bidirectional": chunk 0 of stage p
    is stage p of the down pipeline, chunk 1 stage pp - 1 - p of the up pipeline); microbatches
    0..m/2-1 run down, the others up. Rank p and rank pp - 1 - p run the same order with the two
    directions swapped. Backwards are split into backward_input and backward_weight; where the
    reference runs a whole backward, the weight pass follows its input pass at once. The steady state
    alternates forward/backward pairs of the two directions, (F0, B1) and (F1, B0), the pairs whose
    compute and all-to-all DualPipe overlaps. Needs pp even, vpp 2 (two chunks per rank) and
    num_microbatches even and >= 2 pp, as the reference does.
    """
    _check_sizes(pp, vpp, num_microbatches)
    if pp % 2:
        raise ConfigError("parallel.pp", pp, "an even number for dualpipe (ranks pair up from both ends)")
    _check_two_chunks("dualpipe", vpp)
    if num_microbatches % 2 or num_microbatches < 2 * pp:
        raise ConfigError(
            "parallel.num_microbatches", num_microbatches, f"an even number >= 2 * parallel.pp ({2 * pp}) for dualpipe"
        )
    return tuple(_program(_dualpipe_steps(pp, p, num_microbatches)) for p in range(pp))


def dualpipe_v(pp: int, vpp: int, num_microbatches: int) -> Programs:
    """DualPipeV ("cut-in-half" DualPipe, Sea AI Lab; the order of github.com/deepseek-ai/DualPipe,
    dualpipev.py `DualPipeV.step`): DualPipe's eight phases on one pipeline of 2 pp virtual stages in a V
    (layout "v": chunk 0 of stage p is virtual stage p, chunk 1 is 2pp - 1 - p), every microbatch entering
    at rank 0 and running both chunks of each rank; one copy of the parameters. Needs vpp 2 and
    num_microbatches >= 2 pp.
    """
    _check_sizes(pp, vpp, num_microbatches)
    _check_two_chunks("dualpipe-v", vpp)
    if num_microbatches < 2 * pp:
        raise ConfigError(
            "parallel.num_microbatches", num_microbatches, f"a number >= 2 * parallel.pp ({2 * pp}) for dualpipe-v"
        )
    return tuple(
        _program(_dualpipe_phases(_DualPipeRank(flip=0, starts=(0, 0)), pp, p, num_microbatches)) for p in range(pp)
    )
