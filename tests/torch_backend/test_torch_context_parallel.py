"""Context parallelism in the torch backend, in one process: a rank's chunks, RoPE at their positions, and the core
against the gathered keys equal the whole sequence's attention at those tokens (the distributed runs:
tests/torch_backend/test_torch_executor.py, cases cp*)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from piper_sim.torch_backend.context_parallel_attention import ContextShard
from piper_sim.torch_backend.layers import apply_rope


@pytest.mark.parametrize("cp", [2, 4])
def test_each_rank_holds_chunks_i_and_2cp_minus_1_minus_i(cp):
    seq = 16 * cp
    shards = [ContextShard(cp, i, group=None) for i in range(cp)]
    held = torch.cat([s.positions(seq) for s in shards])
    assert sorted(held.tolist()) == list(range(seq))  # every token on one rank
    size = seq // (2 * cp)
    assert shards[0].positions(seq).tolist() == [*range(size), *range(seq - size, seq)]
    tokens = torch.arange(seq).repeat(3, 1)
    assert torch.equal(shards[1].local(tokens), tokens[:, shards[1].positions(seq)])


@pytest.mark.parametrize(("cp", "heads", "kv_heads"), [(2, 4, 4), (4, 4, 2)])
def test_the_core_on_gathered_keys_is_the_whole_sequence_attention_at_the_ranks_tokens(cp, heads, kv_heads):
    torch.manual_seed(0)
    b, seq, d = 2, 8 * cp, 8
    q, k, v = (torch.randn(b, seq, n, d, dtype=torch.float64) for n in (heads, kv_heads, kv_heads))
    q_all, k_all = apply_rope(q).transpose(1, 2), apply_rope(k).transpose(1, 2)
    v_all = v.transpose(1, 2)
    repeat = heads // kv_heads
    whole = F.scaled_dot_product_attention(
        q_all, k_all.repeat_interleave(repeat, 1), v_all.repeat_interleave(repeat, 1), is_causal=True
    )
    shards = [ContextShard(cp, i, group=None) for i in range(cp)]
    mine = [s.positions(seq) for s in shards]
    # each rank's RoPE at its tokens' positions, then the keys and values in the CP ranks' order (the all-gather)
    local_k = [apply_rope(k[:, p], p).transpose(1, 2) for p in mine]
    gathered_k = torch.cat(local_k, dim=2)
    gathered_v = torch.cat([v[:, p].transpose(1, 2) for p in mine], dim=2)
    for shard, p in zip(shards, mine, strict=True):
        local_q = apply_rope(q[:, p], p).transpose(1, 2)
        torch.testing.assert_close(local_q, q_all[:, :, p])
        out = shard.core(local_q, gathered_k, gathered_v)
        torch.testing.assert_close(out, whole[:, :, p], rtol=1e-12, atol=1e-12)
