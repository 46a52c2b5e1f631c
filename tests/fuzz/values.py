"""What the fuzz harness knows about config keys: each key's kind, the values of that kind that must be refused
and the values that must be accepted in the base config the key is mutated in.

A key is named by its dotted path in a config (model keys under a `{preset: ...}` mapping). The bad values of a
kind are wrong for every key of that kind; `good` values are valid in the base config named in BASES.
"""

from __future__ import annotations

import io
import math
import zipfile
from dataclasses import dataclass

import numpy as np
from numpy.lib import format as npy_format

NAN, INF = math.nan, math.inf
HUGE = (10**30, 2**64, 10**12)  # beyond any plausible size: must be refused before anything is allocated
NOT_A_NUMBER = ("fast", [], {}, [1, 2], True, None)

BAD = {
    "posint": (0, -1, 1.5, NAN, INF, "8", *HUGE, *NOT_A_NUMBER),
    "int": (1.5, NAN, INF, "x", None, True, [], 2**64),
    "rate": (0, -1, NAN, INF, -INF, 1e30, *NOT_A_NUMBER),  # bandwidths, FLOP/s: positive and finite
    "duration": (-1, NAN, INF, -INF, 1e30, *NOT_A_NUMBER),  # latencies, overheads: >= 0 and finite
    "fraction": (0, -0.1, 1.5, NAN, INF, *NOT_A_NUMBER),  # in (0, 1]
    "bool": (1, "maybe", None, [], {}, 0.5),
    "enum": ("bogus-name", 5, None, [], {}, True, 1.5),
    "mapping": (5, [1, 2], True, None, 1.5),
    "positive": (0, -1, NAN, INF, "x", None, True, []),  # a positive finite number without a unit
}


@dataclass(frozen=True)
class Key:
    path: str
    kind: str
    good: tuple = ()


# keys of the simulate configs (examples/small-moe.yaml and tiny-moe.yaml share every key below)
CONFIG_KEYS = (
    Key("parallel.pp", "posint", (1, 2, 4)),
    Key("parallel.ep", "posint", (1, 2, 8)),
    Key("parallel.dp", "posint", (1, 2)),
    Key("parallel.tp", "posint", (1,)),
    Key("parallel.vpp", "posint", (1,)),
    Key("parallel.num_microbatches", "posint", (2, 4, 16)),
    Key("parallel.micro_batch_size", "posint", (1, 2)),
    Key("schedule", "enum", ("gpipe", "1f1b", "zb-h1")),
    Key("sim.steps", "posint", (1, 2)),
    Key("sim.seed", "int", (0, 7)),
    Key("sim.trace_format", "enum", ("parquet", "csv")),
    Key("sim.collapse", "bool", (True, False)),
    Key("collectives.all_to_all", "enum", ("flat", "halo")),
    Key("collectives.all_reduce", "enum", ("ring",)),
    Key("routing.kind", "enum", ("uniform", "zipf")),
    Key("cost.profile", "enum", ("mi250x", "h100")),
    Key("cost.flash_attention", "bool", (True, False)),
    Key("recompute", "enum", ("none", "selective", "full")),
    Key("optimizer.zero", "enum", (0, 1)),
    Key("placement", "enum", ("contiguous", "scattered", {})),  # {}: a mapping of the default policy
    Key("placement.policy", "enum", ("contiguous", "scattered")),
    Key("placement.seed", "int"),  # the base's policy (contiguous) takes no seed: every value is refused
    Key("migration.enabled", "bool", (False,)),
    Key("migration.policy", "enum", ("greedy", "lpt", "none")),
    Key("migration.threshold", "positive", (1.2, 2)),
    Key("migration.interval", "posint", (1, 2)),
    Key("topology", "enum", ("uniform", "frontier", "fat-tree")),
    Key("topology.params.intra_bandwidth_GBps", "rate", (50, 100.5)),
    Key("topology.params.nic_bandwidth_GBps", "rate", (12.5, 25)),
    Key("topology.params.intra_latency_us", "duration", (0, 1.0)),
    Key("topology.params.nic_latency_us", "duration", (0, 2)),
    Key("topology.params.switch_latency_us", "duration", (0, 0.5)),
    Key("topology.params.message_overhead_us", "duration", (0, 2.0)),
    Key("topology.params.gpus_per_node", "posint", (4, 8)),
    Key("topology.params.num_nodes", "posint", (1, 2, None)),  # null: the default (nodes follow the plan)
    Key("model.num_layers", "posint", (4, 8)),
    Key("model.d_model", "posint", (256, 512)),
    Key("model.num_heads", "posint", (4, 8)),
    Key("model.num_experts", "posint", (8, 16)),
    Key("model.top_k", "posint", (1, 2)),
    Key("model.seq_len", "posint", (128, 256)),
    Key("model.vocab_size", "posint", (1000, 4096)),
    Key("model.expert_ffn_dim", "posint", (256, 512)),
)

# keys of a device profile (traces/profiles/mi250x.yaml)
PROFILE_KEYS = (
    Key("peak_bf16_TFLOPS", "rate", (100, 191.5)),
    Key("hbm_GiB", "rate", (16, 64)),
    Key("hbm_bandwidth_GBps", "rate", (800, 1600)),
    Key("memory_efficiency", "fraction", (0.5, 1)),
    Key("kernel_launch_us", "duration", (0, 8)),
    Key("optimizer_bytes_per_param", "positive", (0, 16, 36)),  # 0: no optimizer traffic (test profiles)
    Key("gemm_efficiency.efficiency", "fraction-list", ()),
    Key("attention_efficiency.efficiency", "fraction-list", ()),
    Key("gemm_efficiency.rows", "posint-list", ()),
)
LIST_BAD = {
    "fraction-list": ([0.5, -0.1, 0.6, 0.7, 0.7, 0.7, 0.7], [1.5] * 7, [NAN] * 7, [0.5], "x", None, []),
    "posint-list": ([0, 16, 64, 256, 1024, 4096, 16384], [1, 16, 8, 256, 1024, 4096, 16384], [NAN] * 7, None),
}

# keys of a topology file (topologies/uniform.yaml)
TOPOLOGY_KEYS = (
    Key("params.intra_bandwidth_GBps", "rate", (100,)),
    Key("params.nic_bandwidth_GBps", "rate", (12.5,)),
    Key("params.nic_latency_us", "duration", (1.5,)),
    Key("params.gpus_per_node", "posint", (8,)),
    Key("builder", "enum", ("uniform", "fat-tree")),
    Key("params", "mapping", ()),
)

# mappings where an unknown key must be refused by name
MAPPINGS = (
    "",
    "parallel",
    "sim",
    "cost",
    "collectives",
    "routing",
    "migration",
    "optimizer",
    "model",
    "topology",
    "topology.params",
    "placement",
)

# text that is not valid YAML, or YAML that must not reach a reader unchecked
BAD_YAML_TEXT = (
    "[1, 2",
    "{a: 1",
    "a: b: c",
    "'unterminated",
    "!!python/object/apply:os.system ['true']",
    "*undefined_alias",
    "@x",
    "`x`",
    "\t- 1",
    "key: [}",
    "%YAML 9.9\n---\n1",
)


def anchor_bomb(levels: int = 9) -> str:
    """A 'billion laughs' YAML document: small text, 10**levels leaves once expanded."""
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        refs = ",".join([f"*a{i - 1}"] * 10)
        lines.append(f"a{i}: &a{i} [{refs}]")
    return "\n".join(lines) + "\n"


def npz_bomb(arrays: dict[str, np.ndarray], key: str, shape: tuple[int, ...]) -> bytes:
    """An .npz of `arrays` whose `key` member's .npy header declares `shape` (int64) over 64 bytes of data:
    a file of under a kilobyte that declares as many bytes as the shape says."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, array in arrays.items():
            member = io.BytesIO()
            if name == key:
                npy_format.write_array_header_1_0(member, {"descr": "<i8", "fortran_order": False, "shape": shape})
                member.write(bytes(64))
            else:
                np.save(member, array)
            archive.writestr(f"{name}.npy", member.getvalue())
    return buf.getvalue()


def wrapping_counts(counts: np.ndarray) -> np.ndarray:
    """A trace's counts as uint64 whose first row still sums to the step's total once cast to int64: one entry
    2^64 - 1 (-1 in int64) and its neighbour one more."""
    wrapped = counts.astype(np.uint64)
    wrapped[0, 0, 1] += wrapped[0, 0, 0] + np.uint64(1)
    wrapped[0, 0, 0] = np.uint64(2**64 - 1)
    return wrapped


def deep_nesting(depth: int = 20000) -> str:
    return "[" * depth + "]" * depth
