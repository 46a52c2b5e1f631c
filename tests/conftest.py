"""Shared fixtures: configs that make communication negligible, so schedule math is exact."""

from __future__ import annotations

import pytest

FAST_NETWORK = {
    "builder": "uniform",
    "params": {
        "gpus_per_node": 8,
        "intra_bandwidth_GBps": 1e9,
        "intra_latency_us": 0.0,
        "nic_bandwidth_GBps": 1e9,
        "nic_latency_us": 0.0,
        "switch_latency_us": 0.0,
        "message_overhead_us": 0.0,
    },
}
EXACT_PROFILE = {
    "name": "exact",
    "device": "test device",
    "peak_bf16_TFLOPS": 100.0,
    "hbm_GiB": 64,
    "hbm_bandwidth_GBps": 1000.0,
    "memory_efficiency": 1.0,
    "kernel_launch_us": 0.0,
    "gemm_efficiency": {"rows": [1, 1024], "efficiency": [0.5, 0.5]},
    "attention_efficiency": {"seq_len": [128, 4096], "efficiency": [0.5, 0.5]},
    "optimizer_bytes_per_param": 0,
}
# Layers heavy, embedding and head light (vocab 64): every pipeline stage does the same work.
EQUAL_STAGES_MODEL = {
    "name": "equal-stages",
    "num_layers": 8,
    "d_model": 1024,
    "num_heads": 8,
    "vocab_size": 64,
    "seq_len": 256,
    "expert_ffn_dim": 2048,
    "num_experts": 4,
    "top_k": 2,
    "expert_matrices": 3,
}


def one_gpu_nodes(nic_GBps: float) -> dict:
    """The uniform cluster with one GPU a node: every transfer between two ranks crosses their NICs of nic_GBps."""
    return {
        "builder": "uniform",
        "params": {
            "gpus_per_node": 1,
            "intra_bandwidth_GBps": 100,
            "intra_latency_us": 1.0,
            "nic_bandwidth_GBps": nic_GBps,
            "nic_latency_us": 1.5,
            "switch_latency_us": 0.5,
            "message_overhead_us": 2.0,
        },
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


def plot_problems(fig) -> list[str]:
    """What a saved figure lacks: a title (the axes' own or the figure's) and both axis labels on every axes that
    shows data."""
    suptitle = fig._suptitle.get_text() if fig._suptitle is not None else ""
    problems = []
    for i, ax in enumerate(fig.axes):
        if not ax.get_visible() or not (ax.lines or ax.patches or ax.collections or ax.images):
            continue
        for what, text in (
            ("title", ax.get_title() or suptitle),
            ("x label", ax.get_xlabel()),
            ("y label", ax.get_ylabel()),
        ):
            if not text.strip():
                problems.append(f"axes {i} has no {what}")
    return problems


@pytest.fixture(autouse=True, scope="session")
def saved_plots_have_titles_and_labels():
    """Every figure piper-sim saves during the tests is checked by plot_problems first."""
    from matplotlib.figure import Figure

    original = Figure.savefig

    def checked(fig, *args, **kwargs):
        problems = plot_problems(fig)
        assert not problems, f"{args[0] if args else 'a figure'}: {'; '.join(problems)}"
        return original(fig, *args, **kwargs)

    Figure.savefig = checked
    yield
    Figure.savefig = original
