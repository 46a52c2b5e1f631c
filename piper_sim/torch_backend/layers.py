"""Torch building blocks of the MoE transformer: norms, attention, FFN experts, router, seeded init.

Owns the layer math and the deterministic parameter initialisation. Every parameter is drawn from a
torch.Generator seeded from (seed, the parameter's global name, e.g. "layers.3.experts.17.w1"), so a
shard holding any subset of the model has exactly the weights of the full single-process model.
Only piper_sim.torch_backend may import torch.
"""

from __future__ import annotations

import contextlib
import hashlib
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from piper_sim.workload.model import ModelSpec

from .context_parallel_attention import RingAttention
from .tensor_parallel import NO_SHARD, TensorShard

NORM_EPS = 1e-6
ROPE_BASE = 10000.0


def name_seed(seed: int, name: str) -> int:
    """A 63-bit generator seed from the run seed and a parameter's global name."""
    digest = hashlib.sha256(f"{seed}/{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def init_std(name: str, shape: torch.Size, num_layers: int) -> float:
    """Normal std of a parameter: 1/sqrt(fan_in), output projections shrunk by 1/sqrt(2 L)."""
    leaf = name.rsplit(".", 1)[-1]
    if name == "embed.weight":
        return 1.0
    std = 1.0 / math.sqrt(shape[-1])
    if leaf in ("wo", "w2"):
        std /= math.sqrt(2 * num_layers)
    return std


@torch.no_grad()
def init_parameters(module: nn.Module, seed: int, num_layers: int, shard: TensorShard = NO_SHARD) -> None:
    """Fill every parameter from its own generator; norms (names with 'norm') start at one.

    Values are drawn in float32 on the CPU and then copied, so every dtype and device sees the same
    numbers (up to the cast). A tensor-parallel shard draws the full parameter and keeps its slice.
    """
    for name, param in module.named_parameters():
        if "norm" in name:
            param.fill_(1.0)
            continue
        gen = torch.Generator().manual_seed(name_seed(seed, name))
        full = shard.full_shape(name, param.shape)
        values = torch.randn(full, generator=gen, dtype=torch.float32)
        param.copy_(shard.take(name, values * init_std(name, full, num_layers)))


def _param(*shape: int, device: torch.device | str | None, dtype: torch.dtype) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, device=device, dtype=dtype))


class DeferredWeightGrads:
    """The zero-bubble split of a backward into B (input gradients) and W (weight gradients).

    When the rank's schedule splits its backward (`enabled`), every linear layer runs through
    LinearFunction. A backward run inside `collect(queue)` then computes input gradients (and the cheap
    norm and embedding weight gradients) at once and queues each linear's (weight, input, output
    gradient); `apply(queue)` computes the queued weight gradients later, as ZB-H1's W pass does.
    Process-wide, like autograd's own state: one executor per rank process.
    """

    enabled = False
    collecting: list | None = None

    @staticmethod
    @contextlib.contextmanager
    def collect(queue: list):
        previous, DeferredWeightGrads.collecting = DeferredWeightGrads.collecting, queue
        try:
            yield queue
        finally:
            DeferredWeightGrads.collecting = previous

    @staticmethod
    def apply(queue: list) -> None:
        for weight, x, grad in queue:
            dw = _weight_grad(x, grad)
            weight.grad = dw if weight.grad is None else weight.grad + dw
        queue.clear()


def _weight_grad(x: Tensor, grad: Tensor) -> Tensor:
    return grad.reshape(-1, grad.shape[-1]).t() @ x.reshape(-1, x.shape[-1])


class LinearFunction(torch.autograd.Function):
    """y = x W^T whose weight gradient can be deferred (DeferredWeightGrads); saves what F.linear saves."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor) -> Tensor:  # noqa: ANN001
        ctx.save_for_backward(x, weight)
        # the parameter object itself: what comes out of the saved tensors may be another tensor object
        # on its storage (it is under saved-tensor hooks), and the deferred gradient must land on the parameter
        ctx.param = weight
        return F.linear(x, weight)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None]:  # noqa: ANN001
        x, weight = ctx.saved_tensors
        grad_x = grad @ weight if ctx.needs_input_grad[0] else None
        grad_w = None
        if ctx.needs_input_grad[1]:
            if DeferredWeightGrads.collecting is not None:
                DeferredWeightGrads.collecting.append((ctx.param, x, grad))
            else:
                grad_w = _weight_grad(x, grad)
        return grad_x, grad_w


def linear(x: Tensor, weight: Tensor) -> Tensor:
    """F.linear, or LinearFunction when this process's schedule splits the backward."""
    return LinearFunction.apply(x, weight) if DeferredWeightGrads.enabled else F.linear(x, weight)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, *, device: torch.device | str | None, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = _param(dim, device=device, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        return RMSNormFunction.apply(x, self.weight)


class RMSNormFunction(torch.autograd.Function):
    """x * rsqrt(mean(x^2) + eps) * weight, saving only x and the per-row rsqrt for backward (as fused norm
    kernels do); autograd on the expression would also keep x * rsqrt, one more activation per norm."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor) -> Tensor:  # noqa: ANN001
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + NORM_EPS)
        ctx.save_for_backward(x, rstd, weight)
        return x * rstd * weight

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor]:  # noqa: ANN001
        x, rstd, weight = ctx.saved_tensors
        normed = x * rstd
        grad_weight = (grad * normed).reshape(-1, x.shape[-1]).sum(0)
        g = grad * weight
        grad_x = rstd * (g - normed * (g * normed).mean(-1, keepdim=True))
        return grad_x, grad_weight


def apply_rope(x: Tensor, positions: Tensor | None = None) -> Tensor:
    """Rotary position embedding (rotate-half form) on (batch, seq, heads, head_dim); odd dims pass. positions: the
    tokens' places in the sequence (context parallelism), 0..seq-1 by default.

    Token-major layout, so that attention's output transposed back is contiguous and the output
    projection keeps a view of what attention saved, not a copy."""
    head_dim, seq = x.shape[-1], x.shape[1]
    if head_dim % 2:
        return x
    half = head_dim // 2
    freqs = ROPE_BASE ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    where = torch.arange(seq, device=x.device) if positions is None else positions
    angles = (where.to(torch.float32)[:, None] * freqs[None, :])[:, None, :]
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Attention(nn.Module):
    """Causal self-attention with grouped-query heads (kv heads < heads) via scaled_dot_product_attention; under
    tensor parallelism the rank's 1/tp of the heads (its rows of q, k, v, its columns of the output)."""

    def __init__(self, spec: ModelSpec, *, device: torch.device | str | None, dtype: torch.dtype, tp: int = 1) -> None:
        super().__init__()
        self.num_heads, self.kv_heads, self.head_dim = spec.num_heads // tp, spec.kv_heads // tp, spec.attn_head_dim
        d, hd = spec.d_model, self.head_dim
        self.wq = _param(self.num_heads * hd, d, device=device, dtype=dtype)
        self.wk = _param(self.kv_heads * hd, d, device=device, dtype=dtype)
        self.wv = _param(self.kv_heads * hd, d, device=device, dtype=dtype)
        self.wo = _param(d, self.num_heads * hd, device=device, dtype=dtype)
        self.selective = False  # selective recomputation of the core (set by the executor from its schedule)
        self.context = None  # CP: the rank's context_parallel_attention.ContextShard (set by the executor)

    def _heads(self, x: Tensor, weight: Tensor, heads: int) -> Tensor:
        """(batch, seq, heads, head_dim), token-major."""
        b, s, _ = x.shape
        return linear(x, weight).view(b, s, heads, self.head_dim)

    def forward(self, x: Tensor, core: CoreRecompute | None = None) -> Tensor:
        """With core (selective recomputation) the attention core keeps only q, k, v for its backward."""
        b, s, _ = x.shape
        where = None if self.context is None else self.context.positions(s * self.context.cp, device=x.device)
        q = apply_rope(self._heads(x, self.wq, self.num_heads), where).transpose(1, 2)
        k = apply_rope(self._heads(x, self.wk, self.kv_heads), where).transpose(1, 2)
        v = self._heads(x, self.wv, self.kv_heads).transpose(1, 2)
        if self.context is not None:  # the whole sequence's K/V gathered over CP (context_parallel_attention.py)
            out = RingAttention.apply(q, k, v, self.context)
            return linear(out.transpose(1, 2).reshape(b, s, -1), self.wo)
        if self.kv_heads != self.num_heads:
            repeat = self.num_heads // self.kv_heads
            k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        out = attention_core(q, k, v) if core is None else AttentionCore.apply(q, k, v, core)
        return linear(out.transpose(1, 2).reshape(b, s, -1), self.wo)


def attention_core(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """softmax(q k^T / sqrt(d)) v, causal: the part selective recomputation re-runs."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class CoreRecompute:
    """Selective recomputation of one attention core (Korthikanti et al. 2022, section 5): the forward keeps
    q, k and v only (AttentionCore); `recompute()`, the schedule's recompute task, re-runs the core with grad
    before the backward, and the backward then runs through that graph."""

    def __init__(self) -> None:
        self.node = None  # AttentionCore's autograd node: its saved q, k, v
        self.graph: tuple[tuple[Tensor, ...], Tensor] | None = None

    def kept(self) -> tuple[Tensor, ...]:
        """q, k, v as the forward kept them."""
        if self.node is None:
            raise RuntimeError("attention core recomputed before its forward ran")
        return self.node.saved_tensors

    def recompute(self) -> None:
        inputs = tuple(t.detach().requires_grad_(True) for t in self.kept())
        with torch.enable_grad():
            self.graph = inputs, attention_core(*inputs)


class AttentionCore(torch.autograd.Function):
    """The attention core without its autograd state: saves q, k, v; its backward needs CoreRecompute's graph."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, core: CoreRecompute) -> Tensor:  # noqa: ANN001
        ctx.save_for_backward(q, k, v)
        ctx.core, core.node = core, ctx  # ctx is the autograd node: the recompute reads its saved q, k, v
        return attention_core(q, k, v)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:  # noqa: ANN001
        if ctx.core.graph is None:
            raise RuntimeError("attention core backward before its recompute task ran")
        inputs, out = ctx.core.graph
        ctx.core.graph = ctx.core.node = None
        return (*torch.autograd.grad(out, inputs, grad), None)


class FFN(nn.Module):
    """One expert (routed, shared) or a dense FFN: W2(gelu(W1 x)), or SwiGLU W2(silu(W1 x) * W3 x)."""

    def __init__(
        self, d_model: int, ffn_dim: int, num_matrices: int, *, device: torch.device | str | None, dtype: torch.dtype
    ) -> None:
        super().__init__()
        self.w1 = _param(ffn_dim, d_model, device=device, dtype=dtype)
        self.w2 = _param(d_model, ffn_dim, device=device, dtype=dtype)
        self.w3 = _param(ffn_dim, d_model, device=device, dtype=dtype) if num_matrices == 3 else None

    def forward(self, x: Tensor) -> Tensor:
        if self.w3 is None:
            return linear(F.gelu(linear(x, self.w1)), self.w2)
        return linear(SwiGLU.apply(linear(x, self.w1), linear(x, self.w3)), self.w2)


class SwiGLU(torch.autograd.Function):
    """silu(a) * b that saves only a and b for backward (silu is recomputed), as fused SwiGLU kernels do.

    Autograd on the unfused expression would also keep silu(a): d + 4 f saved values per row through a
    SwiGLU FFN instead of the d + 3 f (input, both up-projections, the product) of the memory model."""

    @staticmethod
    def forward(ctx, a: Tensor, b: Tensor) -> Tensor:  # noqa: ANN001
        ctx.save_for_backward(a, b)
        return F.silu(a) * b

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor]:  # noqa: ANN001
        a, b = ctx.saved_tensors
        sig = torch.sigmoid(a)
        silu = a * sig
        return grad * b * sig * (1 + a * (1 - sig)), grad * silu


class Router(nn.Module):
    """Linear gate, softmax over all routed experts, top-k, top-k weights renormalised to sum to one."""

    def __init__(
        self, d_model: int, num_experts: int, top_k: int, *, device: torch.device | str | None, dtype: torch.dtype
    ) -> None:
        super().__init__()
        self.top_k = top_k
        self.weight = _param(num_experts, d_model, device=device, dtype=dtype)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x (tokens, d) -> (weights (tokens, k), expert ids (tokens, k))."""
        logits = linear(x, self.weight)
        bias = getattr(self, "logit_bias", None)  # set by the executor to make the real router skewed
        if bias is not None:
            logits = logits + bias
        probs = torch.softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), ids


class Layer(nn.Module):
    """One transformer layer's parameters: norms, attention and either a dense FFN or the MoE parts.

    An MoE layer holds the router, the shared experts and only the routed experts in
    [expert_begin, expert_end), keyed by their global expert id. A tensor-parallel shard holds its slice of
    attention and the dense FFN (1/tp) and of every expert (1/etp).
    """

    def __init__(
        self,
        spec: ModelSpec,
        layer_index: int,
        expert_range: range,
        *,
        device: torch.device | str | None,
        dtype: torch.dtype,
        shard: TensorShard = NO_SHARD,
    ) -> None:
        super().__init__()
        d, kw = spec.d_model, {"device": device, "dtype": dtype}
        self.is_moe = spec.is_moe_layer(layer_index)
        self.norm1 = RMSNorm(d, **kw)
        self.attn = Attention(spec, tp=shard.tp, **kw)
        self.norm2 = RMSNorm(d, **kw)
        if not self.is_moe:
            width = spec.dense_ffn_dim or spec.expert_ffn_dim
            self.dense = FFN(d, width // shard.tp, spec.dense_matrix_count, **kw)
            return
        self.router = Router(d, spec.num_experts, spec.top_k, **kw)
        self.shared = nn.ModuleList(
            FFN(d, spec.shared_ffn_dim // shard.etp, spec.expert_matrices, **kw) for _ in range(spec.num_shared_experts)
        )
        self.experts = nn.ModuleDict(
            {str(e): FFN(d, spec.expert_ffn_dim // shard.etp, spec.expert_matrices, **kw) for e in expert_range}
        )
