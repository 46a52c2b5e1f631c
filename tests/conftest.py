"""Shared fixtures: configs that make communication negligible, so schedule math is exact."""

from __future__ import annotations

import pytest

FAST_NETWORK = {
    "builder": "uniform",
    "params": {"gpus_per_node": 8, "intra_bandwidth_GBps": 1e9, "intra_latency_us": 0.0,
               "nic_bandwidth_GBps": 1e9, "nic_latency_us": 0.0, "switch_latency_us": 0.0,
               "message_overhead_us": 0.0},
}
EXACT_PROFILE = {
    "name": "exact", "device": "test device", "peak_bf16_TFLOPS": 100.0, "hbm_GiB": 64,
    "hbm_bandwidth_GBps": 1000.0, "memory_efficiency": 1.0, "kernel_launch_us": 0.0,
    "gemm_efficiency": {"rows": [1, 1024], "efficiency": [0.5, 0.5]},
    "attention_efficiency": {"seq_len": [128, 4096], "efficiency": [0.5, 0.5]},
    "optimizer_bytes_per_param": 0,
}
# Layers heavy, embedding and head light (vocab 64): every pipeline stage does the same work.
EQUAL_STAGES_MODEL = {
    "name": "equal-stages", "num_layers": 8, "d_model": 1024, "num_heads": 8, "vocab_size": 64,
    "seq_len": 256, "expert_ffn_dim": 2048, "num_experts": 4, "top_k": 2, "expert_matrices": 3,
}


@pytest.fixture
def negligible_comm_config() -> dict:
    return {
        "model": dict(EQUAL_STAGES_MODEL),
        "parallel": {"pp": 4, "ep": 2, "num_microbatches": 8, "micro_batch_size": 1},
        "schedule": "1f1b",
        "topology": FAST_NETWORK,
        "cost": {"profile": EXACT_PROFILE},
    }
