"""A backward's memory-bound traffic is each kernel kind's own (flops.backward_traffic): per kind, the bytes its
backward kernel reads and writes (traces/kernels/backward-traffic.yaml), priced in a backward task in place of twice
the forward's, half of it in each pass of a split backward."""

from __future__ import annotations

import pytest
import yaml

from piper_sim.paths import data_dir
from piper_sim.workload import flops
from piper_sim.workload.cost import TaskCoster
from piper_sim.workload.flops import kind_bytes, op_work
from piper_sim.workload.presets import load_model
from piper_sim.workload.profile_load import load_profile

D, T, F, E, V, HEADS, HD = 64, 128, 256, 4, 1000, 4, 16
PROFILE = {
    "name": "t",
    "device": "t",
    "peak_bf16_TFLOPS": 100,
    "hbm_GiB": 64,
    "hbm_bandwidth_GBps": 1,  # 1e9 B/s at share 1: a term's seconds are its bytes / 1e9
    "memory_efficiency": 1.0,
    "kernel_launch_us": 0,
    "gemm_efficiency": {"rows": [1, 1024], "efficiency": [0.8, 0.8]},
    "attention_efficiency": {"seq_len": [1, 4096], "efficiency": [0.5, 0.5]},
}


def _model(dense_matrices: int = 2):
    return load_model(
        {
            "name": "m",
            "num_layers": 2,
            "d_model": D,
            "num_heads": HEADS,
            "vocab_size": V,
            "seq_len": T,
            "expert_ffn_dim": F,
            "num_experts": E,
            "top_k": 2,
            "expert_matrices": 3,
            "num_dense_layers": 1,
            "dense_ffn_dim": F,
            "dense_matrices": dense_matrices,
            "dropout": 0.1,
        }
    )


def _backward(op: str, rows: tuple[int, ...] = ()):
    work = op_work(_model(), op, T, rows)
    assert work.backward_traffic is not None
    return work.backward_traffic


def test_each_kind_backward_bytes_are_what_its_backward_kernel_reads_and_writes():
    """bf16: norm x, dy read and dx written (3 elements); GeLU the saved input and dy read, dx written (3); SwiGLU
    gate, up and dy read, both gradients written (5); the residual's accumulation of two gradients (3); the dropout
    mask multiply (mask byte, dy and dx); rotary's rotation of dy (2); the router's fp32 softmax (3 x 4 bytes);
    the loss's in-place multiply of the fp32 softmax and its cast to bf16 (12 + 2 bytes per logit)."""
    b = 2
    attn, dense = _backward("attn:0"), _backward("dense:0")
    assert kind_bytes(attn, "norm") == 3 * T * D * b
    assert kind_bytes(attn, "rotary") == 2 * T * (HEADS + HEADS) * HD * b
    assert kind_bytes(attn, "residual") == 3 * T * D * b
    assert kind_bytes(attn, "dropout") == T * D * (1 + 2 * b)
    assert kind_bytes(attn, "copy") == 4 * T * D * b  # as the forward's q, k, v and output layouts
    assert kind_bytes(dense, "activation") == 3 * T * F * b
    rows = (100, 0, 60, 96)
    assert kind_bytes(_backward("experts:1", rows), "activation") == 5 * sum(rows) * F * b
    assert kind_bytes(_backward("moe_act:1", rows), "activation") == 5 * sum(rows) * F * b
    router = _backward("router:1")
    assert kind_bytes(router, "softmax") == 3 * 4 * T * E
    assert kind_bytes(router, "permute") == 2 * T * D * b  # the inverse permutation of the top-2 rows
    assert kind_bytes(_backward("head:0"), "loss") == T * V * (3 * 4 + b)


def test_a_backward_task_prices_its_own_kernels_and_a_split_backward_half_in_each_pass():
    """The backward's memory_bound term is its backward bytes at the shares (the old 2 x forward is not), and a
    zero-bubble input pass and weight pass take half of it each, experts priced per rank as well."""
    model = _model()
    coster = TaskCoster(model, load_profile(PROFILE), T)
    for op, rows in (("dense:0", ()), ("attn:0", ()), ("head:0", ()), ("experts:1", (100, 0, 60, 96))):
        work = op_work(model, op, T, rows)
        assert work.backward_traffic is not None
        backward = flops.traffic_bytes(work.backward_traffic) / 1e9
        kind, split = ("backward_expert", "backward_expert_input") if rows else ("backward", "backward_input")
        assert coster.cost_terms(kind, (op,), rows)["memory_bound"] == pytest.approx(backward, rel=1e-12)
        assert backward != pytest.approx(2 * work.elementwise_bytes / 1e9, rel=1e-3)
        for half in (split, "backward_weight"):
            assert coster.cost_terms(half, (op,), rows)["memory_bound"] == pytest.approx(backward / 2, rel=1e-12)


def test_the_code_counts_are_the_cited_data_file():
    """flops.py's element counts are traces/kernels/backward-traffic.yaml's, kind by kind."""
    data = yaml.safe_load((data_dir("traces") / "kernels" / "backward-traffic.yaml").read_text())

    def elements(kind: str, passes: str) -> float:
        return data[kind][passes]["reads"] + data[kind][passes]["writes"]

    assert flops.NORM_ELEMENTS == (elements("norm", "forward"), elements("norm", "backward"))
    assert flops.RESIDUAL_ELEMENTS == (elements("residual", "forward"), elements("residual", "backward"))
    assert flops.ROTARY_ELEMENTS == (elements("rotary", "forward"), elements("rotary", "backward"))
    assert flops.SOFTMAX_ELEMENTS == (elements("softmax", "forward"), elements("softmax", "backward"))
    assert flops.LOSS_FP32_PASSES == (data["loss"]["forward"]["fp32_passes"], data["loss"]["backward"]["fp32_passes"])
    assert data["dropout"]["backward"]["reads_mask_bytes"] == flops.DROPOUT_MASK_BYTES
    for m in (2, 3):  # activation: m - 1 inputs read, one written; backward m read, m - 1 written
        assert flops.activation_elements(m) == ((m - 1) + 1, m + (m - 1))
