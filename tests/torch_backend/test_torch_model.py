"""The torch MoE model: shards equal the single-process reference in weights, loss and gradients (also
with per-op backward, as the executor runs it), it learns real text, and the stdlib corpus is
deterministic."""

from __future__ import annotations

import dataclasses
import math

import pytest

torch = pytest.importorskip("torch")

from piper_sim.torch_backend.corpus import VOCAB_SIZE, ByteCorpus  # noqa: E402
from piper_sim.torch_backend.emulate import build_grid, combine, dispatch, local_all_to_all, run_grid  # noqa: E402
from piper_sim.torch_backend.op_autograd import backward_op, forward_op  # noqa: E402
from piper_sim.torch_backend.stage_modules import ReferenceModel, StageModule, stage_ops  # noqa: E402
from piper_sim.workload.model import ModelSpec  # noqa: E402

SEQ = 16
# A: dense first layer, then MoE with a shared expert, GQA, SwiGLU experts.
SPEC_A = ModelSpec(
    num_layers=3,
    d_model=32,
    num_heads=4,
    num_kv_heads=2,
    vocab_size=VOCAB_SIZE,
    seq_len=SEQ,
    expert_ffn_dim=16,
    num_experts=4,
    top_k=2,
    num_shared_experts=1,
    num_dense_layers=1,
    dense_ffn_dim=48,
)
# B: alternating MoE / dense layers, 2-matrix GELU experts, no shared expert, 8 experts top 3.
SPEC_B = ModelSpec(
    num_layers=2,
    d_model=32,
    num_heads=2,
    vocab_size=VOCAB_SIZE,
    seq_len=SEQ,
    expert_ffn_dim=24,
    num_experts=8,
    top_k=3,
    expert_matrices=2,
    moe_layer_freq=2,
)
# (spec, layers per pipeline stage, ep)
GRIDS = [(SPEC_A, [[0, 1], [2]], 2), (SPEC_A, [[0, 1, 2]], 4), (SPEC_B, [[0], [1]], 4)]
GRID_IDS = ["A-pp2-ep2", "A-pp1-ep4", "B-pp2-ep4"]


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny GEMMs: one intra-op thread is much faster than several fighting over busy cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def batch(ep: int, seed: int = 0) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB_SIZE, (ep, 2, SEQ + 1), generator=gen)
    return list(tokens[..., :-1]), list(tokens[..., 1:])


def reference_grads(spec: ModelSpec, tokens: list, targets: list) -> tuple[torch.Tensor, dict]:
    ref = ReferenceModel(spec, seed=7, dtype=torch.float64)
    loss = ref.loss(torch.cat(tokens), torch.cat(targets))
    loss.backward()
    return loss.detach(), {n.removeprefix("stage."): p.grad for n, p in ref.named_parameters()}


def shard_grads(grid: list[list[StageModule]]) -> dict[str, torch.Tensor]:
    """Gradients summed over all shards holding a parameter (replicated ones are summed, as the
    data-parallel reduction over EP ranks would)."""
    total: dict[str, torch.Tensor] = {}
    for stages in grid:
        for stage in stages:
            for name, param in stage.named_parameters():
                grad = param.grad if param.grad is not None else torch.zeros_like(param)
                total[name] = total[name] + grad if name in total else grad.clone()
    return total


def assert_grads_close(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for name, grad in want.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-9, atol=1e-12, msg=name)


@pytest.mark.parametrize("spec,stage_layers,ep", GRIDS, ids=GRID_IDS)
def test_shard_weights_equal_reference(spec: ModelSpec, stage_layers: list, ep: int) -> None:
    ref = dict(ReferenceModel(spec, seed=7).named_parameters())
    seen: list[str] = []
    for stages in build_grid(spec, stage_layers, ep, seed=7):
        for stage in stages:
            for name, param in stage.named_parameters():
                assert torch.equal(param, ref["stage." + name]), name
                seen.append(name)
    experts = [n for n in seen if ".experts." in n]
    assert len(experts) == len(set(experts))  # every routed expert lives on exactly one shard
    assert {"stage." + n for n in seen} == set(ref)
    assert not torch.equal(ref["stage.layers.0.attn.wq"], ReferenceModel(spec, seed=8).stage.layers["0"].attn.wq)


@pytest.mark.parametrize("spec,stage_layers,ep", GRIDS, ids=GRID_IDS)
def test_sharded_loss_and_grads_match_reference(spec: ModelSpec, stage_layers: list, ep: int) -> None:
    tokens, targets = batch(ep)
    want_loss, want_grads = reference_grads(spec, tokens, targets)
    grid = build_grid(spec, stage_layers, ep, seed=7, dtype=torch.float64)
    states = run_grid(grid, tokens, targets)
    loss = sum(s["loss"] for s in states) / ep
    loss.backward()
    torch.testing.assert_close(loss.detach(), want_loss, rtol=1e-12, atol=0)
    assert_grads_close(shard_grads(grid), want_grads)


def run_grid_op_by_op(grid: list[list[StageModule]], tokens: list, targets: list) -> torch.Tensor:
    """Forward op by op with per-op records, then backward op by op in reverse, moving gradients across
    the emulated exchanges as the executor will (see op_autograd)."""
    ep = len(tokens)
    states = [{"tokens": t, "targets": y} for t, y in zip(tokens, targets, strict=True)]
    tapes: list[list] = [[] for _ in range(ep)]
    for stages in grid:
        for op in stages[0].forward_ops():
            if op.startswith("experts:"):
                dispatch(states)
            for stage, state, tape in zip(stages, states, tapes, strict=True):
                tape.append(forward_op(stage, op, state))
            if op.startswith("experts:"):
                combine(states)
    grads = [{"loss": torch.tensor(1.0 / ep, dtype=torch.float64)} for _ in range(ep)]
    for step in reversed(range(len(tapes[0]))):
        records = [tape[step] for tape in tapes]
        is_experts = records[0].op.startswith("experts:")
        if is_experts:  # combine, reversed
            rows, _ = local_all_to_all(
                [g.pop("combined_rows") for g in grads], [r.splits["send_splits"] for r in records]
            )
            for g, r in zip(grads, rows, strict=True):
                g["return_rows"] = r
        for record, g in zip(records, grads, strict=True):
            backward_op(record, g)
        if is_experts:  # dispatch, reversed
            rows, _ = local_all_to_all([g.pop("recv_rows") for g in grads], [r.splits["recv_splits"] for r in records])
            for g, r in zip(grads, rows, strict=True):
                g["send_rows"] = r
    assert all(not g for g in grads)  # every gradient was consumed; embed has no differentiable input
    return sum(s["loss"].detach() for s in states) / ep


@pytest.mark.parametrize("spec,stage_layers,ep", GRIDS, ids=GRID_IDS)
def test_per_op_backward_matches_reference(spec: ModelSpec, stage_layers: list, ep: int) -> None:
    tokens, targets = batch(ep, seed=3)
    want_loss, want_grads = reference_grads(spec, tokens, targets)
    grid = build_grid(spec, stage_layers, ep, seed=7, dtype=torch.float64)
    loss = run_grid_op_by_op(grid, tokens, targets)
    torch.testing.assert_close(loss, want_loss, rtol=1e-12, atol=0)
    assert_grads_close(shard_grads(grid), want_grads)


def test_router_groups_rows_by_destination_and_counts_experts() -> None:
    spec = SPEC_B
    stage = StageModule(spec, [0, 1], first=True, last=True, ep_rank=1, ep_size=4, seed=7)
    tokens, targets = batch(1)
    state = {"tokens": tokens[0], "targets": targets[0]}
    for op in ["embed", "attn:0", "router:0"]:
        stage.run_op(op, state)
    num_rows = tokens[0].numel() * spec.top_k
    ids = state["send_expert_ids"]
    assert state["send_rows"].shape == (num_rows, spec.d_model) and ids.shape == (num_rows,)
    assert sum(state["send_splits"]) == num_rows and len(state["send_splits"]) == 4
    owners = torch.div(ids, spec.num_experts // 4, rounding_mode="floor")
    assert torch.equal(owners, torch.repeat_interleave(torch.arange(4), torch.tensor(state["send_splits"])))
    assert torch.all(ids[1:] >= ids[:-1])  # grouped by expert inside each destination
    assert int(state["expert_counts"][0].sum()) == num_rows
    torch.testing.assert_close(state["gate_weights"].sum(-1), torch.ones(tokens[0].numel()))
    assert list(stage.layers["0"].experts.keys()) == ["2", "3"]
    with pytest.raises(ValueError):
        stage.run_op("dense:0", state)  # layer 0 is an MoE layer
    with pytest.raises(ValueError):
        StageModule(spec, [1], first=False, last=False).run_op("embed", state)
    assert stage_ops(spec, [0, 1], first=True, last=True) == [
        "embed",
        "attn:0",
        "router:0",
        "experts:0",
        "moe_out:0",
        "attn:1",
        "dense:1",
        "head",
    ]


@pytest.fixture(scope="module")
def corpus() -> ByteCorpus:
    return ByteCorpus.from_stdlib(max_bytes=1_000_000)


def test_corpus_is_deterministic_and_split_by_file(corpus: ByteCorpus) -> None:
    again = ByteCorpus.from_stdlib(max_bytes=1_000_000)
    assert torch.equal(corpus.train, again.train) and torch.equal(corpus.val, again.val)
    assert corpus.train.numel() + corpus.val.numel() == 1_000_000
    assert corpus.val.numel() > 0 and not set(corpus.train_files) & set(corpus.val_files)
    assert list(corpus.train_files) == sorted(corpus.train_files)
    first = list(corpus.batches(32, 4, seed=5, num_batches=3))
    second = list(corpus.batches(32, 4, seed=5, num_batches=3))
    other = next(corpus.batches(32, 4, seed=6))
    for (x, y), (x2, y2) in zip(first, second, strict=True):
        assert torch.equal(x, x2) and torch.equal(y, y2)
        assert x.dtype == torch.int64 and x.shape == (4, 32) and int(x.max()) < VOCAB_SIZE
        assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the next bytes
    assert not torch.equal(first[0][0], other[0])
    val_x, _ = next(corpus.batches(32, 4, seed=5, split="val"))
    assert not torch.equal(val_x, first[0][0])


def test_small_model_learns_stdlib_text(corpus: ByteCorpus) -> None:
    torch.manual_seed(0)
    spec = ModelSpec(
        num_layers=2,
        d_model=64,
        num_heads=4,
        vocab_size=VOCAB_SIZE,
        seq_len=64,
        expert_ffn_dim=128,
        num_experts=4,
        top_k=2,
        num_shared_experts=1,
    )
    model = ReferenceModel(spec, seed=0)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for tokens, targets in corpus.batches(64, 16, seed=0, num_batches=100):
        loss = model.loss(tokens, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    with torch.no_grad():
        val = [model.loss(x, y).item() for x, y in corpus.batches(64, 16, seed=1, split="val", num_batches=4)]
    assert losses[0] > math.log(VOCAB_SIZE) - 0.5  # starts near uniform over bytes
    assert sum(losses[-10:]) / 10 < losses[0] - 2.0
    assert sum(val) / len(val) < losses[0] - 2.0


def test_swiglu_matches_the_unfused_expression_and_saves_d_plus_3f_per_row():
    from piper_sim.torch_backend.layers import FFN, SwiGLU

    a = torch.randn(5, 7, dtype=torch.float64, requires_grad=True)
    b = torch.randn(5, 7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(SwiGLU.apply, (a, b))
    torch.testing.assert_close(SwiGLU.apply(a, b), torch.nn.functional.silu(a) * b)

    rows, d, f = 16, 8, 24
    ffn = FFN(d, f, 3, device="cpu", dtype=torch.float32)
    x = torch.randn(rows, d, requires_grad=True)
    saved: dict[int, int] = {}
    weights = {p.untyped_storage().data_ptr() for p in ffn.parameters()}

    def pack(t):
        if t.untyped_storage().data_ptr() not in weights:  # activations, not the weights
            saved[t.untyped_storage().data_ptr()] = t.numel()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = ffn(x)
    assert sum(saved.values()) == rows * (d + 3 * f)
    out.sum().backward()
    assert x.grad is not None and ffn.w1.grad is not None and ffn.w3.grad is not None


@pytest.mark.parametrize("spec", [SPEC_A, SPEC_B], ids=["A-swiglu-shared-dense", "B-gelu-alternating"])
def test_activation_formula_matches_the_tensors_autograd_saves(spec):
    """workload.memory.activation_bytes against what the real model keeps for backward (deduplicated by
    storage, as the executor accounts it). The formula leaves out only small tensors (RoPE tables, int64
    expert ids and orders, per-row norm scales): 5% of these toy layers (d 32, 16 tokens per sequence),
    under 3% for tiny-moe."""
    from piper_sim.workload.memory import activation_bytes

    model = ReferenceModel(spec, seed=3)
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in weights:
            saved[ptr] = t.untyped_storage().nbytes()
        return t

    batch = 4
    tokens = torch.randint(0, VOCAB_SIZE, (batch, SEQ))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.loss(tokens, tokens)
    fp32 = dataclasses.replace(spec, dtype="fp32")  # the reference model runs float32
    predicted = activation_bytes(fp32, tuple(range(spec.num_layers)), batch, last=True)
    assert predicted <= sum(saved.values()) <= 1.06 * predicted


@pytest.mark.parametrize("spec", [SPEC_A, SPEC_B], ids=["A", "B"])
def test_parameter_tensor_count_matches_the_model(spec):
    """The optimizer's per-tensor cost is charged per parameter tensor the memory model counts."""
    from piper_sim.workload.memory import rank_param_tensors

    model = ReferenceModel(spec)
    layers = tuple(range(spec.num_layers))
    assert len(list(model.parameters())) == rank_param_tensors(spec, layers, first=True, last=True, ep=1)
