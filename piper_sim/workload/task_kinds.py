"""The task vocabulary: what a task does (TaskKind), where it runs on its rank (Stream), what a communication task
moves (Role), and the sets of kinds the layers above test against.

Pure data, shared by the schedule IR (piper_sim.schedule.ir.Task carries these), the cost and memory models (which
price a task by its kind and role; workload must not import schedule) and everything that reads a schedule or a
trace. StrEnums: a member is equal to, hashes as and prints as its value, the string of schedules' JSON/CSV and of
the RunTrace.
"""

from __future__ import annotations

from enum import StrEnum


class TaskKind(StrEnum):
    """What a task does. Values are the strings of schedules' JSON/CSV and of the RunTrace."""

    FORWARD = "forward"
    FORWARD_EXPERT = "forward_expert"
    BACKWARD = "backward"
    BACKWARD_EXPERT = "backward_expert"
    BACKWARD_INPUT = "backward_input"
    BACKWARD_EXPERT_INPUT = "backward_expert_input"
    BACKWARD_WEIGHT = "backward_weight"
    OPTIMIZER = "optimizer"
    RECOMPUTE = "recompute"  # a forward re-run before a backward (activation recomputation)
    RECOMPUTE_EXPERT = "recompute_expert"
    SEND = "send"
    RECV = "recv"
    ALL_TO_ALL = "all_to_all"
    ALL_REDUCE = "all_reduce"
    REDUCE_SCATTER = "reduce_scatter"  # sharded optimizer state (ZeRO): gradients
    ALL_GATHER = "all_gather"  # sharded optimizer state (ZeRO): updated parameters; ZeRO-3: a unit's parameters


class Stream(StrEnum):
    """Where a task runs on its rank (docs/execution-contract.md)."""

    COMPUTE = "compute"
    P2P = "p2p"
    COLLECTIVE = "collective"


class Role(StrEnum):
    """What a communication task moves ("" for compute tasks)."""

    NONE = ""
    ACT = "act"
    GRAD = "grad"
    DISPATCH = "dispatch"
    COMBINE = "combine"
    GRAD_DENSE = "grad_dense"
    GRAD_EXPERT = "grad_expert"
    PARAM_DENSE = "param_dense"
    PARAM_EXPERT = "param_expert"
    GRAD_REPLICATED = "grad_replicated"  # tp > 1: parameters the stage's ranks hold whole (norms, router)
    PARAM_REPLICATED = "param_replicated"
    GRAD_MIRROR = "grad_mirror"  # DualPipe (bidirectional layout): the two copies of a stage's layers summed
    TP = "tp"  # a tensor-parallel collective on the layer's activations (forward) or their gradients
    CP = "cp"  # a layer's context-parallel ring: keys and values (all-gather), their gradients (reduce-scatter)
    MIGRATE = "migrate"


K = TaskKind
COMPUTE_KINDS = frozenset(
    {
        K.FORWARD,
        K.FORWARD_EXPERT,
        K.BACKWARD,
        K.BACKWARD_EXPERT,
        K.BACKWARD_INPUT,
        K.BACKWARD_EXPERT_INPUT,
        K.BACKWARD_WEIGHT,
        K.OPTIMIZER,
        K.RECOMPUTE,
        K.RECOMPUTE_EXPERT,
    }
)
RECOMPUTE_KINDS = frozenset({K.RECOMPUTE, K.RECOMPUTE_EXPERT})  # hardware FLOPs, not model FLOPs
FORWARD_KINDS = frozenset({K.FORWARD, K.FORWARD_EXPERT})
BACKWARD_KINDS = frozenset({K.BACKWARD, K.BACKWARD_EXPERT, K.BACKWARD_INPUT, K.BACKWARD_EXPERT_INPUT})  # input grads
BACKWARD_INPUT_KINDS = frozenset({K.BACKWARD_INPUT, K.BACKWARD_EXPERT_INPUT})  # a split backward's input pass
SPLIT_BACKWARD_KINDS = BACKWARD_INPUT_KINDS | {K.BACKWARD_WEIGHT}  # a split backward's two passes
P2P_KINDS = frozenset({K.SEND, K.RECV})
COLLECTIVE_KINDS = frozenset({K.ALL_TO_ALL, K.ALL_REDUCE, K.REDUCE_SCATTER, K.ALL_GATHER})
COARSE_KINDS = frozenset({K.FORWARD, K.BACKWARD, K.BACKWARD_INPUT, K.BACKWARD_WEIGHT})
STREAM_OF_KIND = {
    **{k: Stream.COMPUTE for k in COMPUTE_KINDS},
    **{k: Stream.P2P for k in P2P_KINDS},
    **{k: Stream.COLLECTIVE for k in COLLECTIVE_KINDS},
}
