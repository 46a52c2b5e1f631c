"""A rank's tensor memory in the torch executor: its training state plus the activations alive, and the
peak of their sum. Activations are what autograd saves (counted by storage, parameters excluded).
Only piper_sim.torch_backend may import torch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import Tensor


class ActivationMeter:
    def __init__(self) -> None:
        self.static_bytes = 0.0  # parameters, their gradients and Adam's moments (the executor sets it)
        self.param_storages: set[int] = set()  # autograd also saves views of weights, which are not activations
        self.live_bytes = 0.0
        self.peak_bytes = 0.0

    def account(self, delta: float) -> None:
        """Activations alive change by delta bytes; the peak follows."""
        self.live_bytes += delta
        self.peak_bytes = max(self.peak_bytes, self.static_bytes + self.live_bytes)

    @contextlib.contextmanager
    def count_saved(self, active: bool, counted: frozenset[int] = frozenset()) -> Iterator[dict[int, int]]:
        """Yields {storage: bytes} of the activations autograd saves inside (parameters and the storages
        already counted excluded) when active (the executor: on step 0).

        Saved-tensor hooks make forward ops 1.4-2.3x slower on CPU (benchmarks/bench_saved_tensor_hooks.py), so
        activations are counted on step 0 only, which validation does not time; later steps keep the same
        tensors for the same shapes (routed rows aside) and run without hooks."""
        saved: dict[int, int] = {}

        def pack(t: Tensor) -> Tensor:
            storage = t.untyped_storage()
            if storage.data_ptr() not in self.param_storages and storage.data_ptr() not in counted:
                saved[storage.data_ptr()] = storage.nbytes()
            return t

        hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t) if active else contextlib.nullcontext()
        with hooks:
            yield saved
