"""DeepEP's normal (training) all-to-all, dispatch and combine, as DeepEP's design runs it (deepseek-ai/DeepEP).

Owns the `deepep` all-to-all model (registered in piper_sim.collectives.phases' registry; algorithms.py imports
this module), its token deduplication (`Fanout`) and its parameters' schema. Pure numpy; no simpy or torch.

What DeepEP does (legacy V1 normal kernels, csrc/kernels/internode.cu and intranode.cu; docs/legacy.md):
- A token is sent once to each GPU that holds at least one of its experts (`is_token_in_rank`), not once per expert
  as a grouped point-to-point all-to-all (flat, nccl) sends it.
- Across nodes, a token goes once over RDMA to each node that holds any of its experts, to the GPU of the sender's
  own local rank on that node (the same rail); that GPU forwards it over NVLink to each of its destination GPUs on
  the node. Tokens for the sender's own node go into its own receive buffer and are forwarded the same way, so
  they cross NVLink directly. The combine is the same path backwards, the forwarder reducing a token's per-GPU
  results into one per node before the RDMA.
- On one node (the intranode kernels) every token goes straight over NVLink to each of its destination GPUs.
- The sends are posted by the GPU (NVSHMEM / IBGDA), not by a host proxy: no per-message host cost.

The model: the data moves in two concurrent phases (one phase "nvl" on one node),
- "rdma": member s -> the member of node B with s's local index (s's local index modulo B's size where B has fewer
  members), for every node B other than s's own, the node's deduplicated bytes over `rdma_efficiency`;
- "forward": each member r -> every other member d of its node, the deduplicated bytes for d of every sender whose
  relay on d's node is r (r's own node's senders of r's local index: r itself), over `nvl_efficiency`.
DeepEP pipelines the two in chunks of tokens (the forwarder forwards a chunk as it lands), so they are taken as
running together: an all-to-all alone takes the slower of its NIC and NVLink loads, one chunk's forwarding (tens
of KiB) optimistic. Flows pay their path latency and no per-message overhead (overhead_s 0). The split sizes go
first by the same phases (split_exchange; DeepEP's notify kernel, whose time the published table leaves out).

Deduplication (`Fanout`): the traffic matrix counts each (token, expert) copy, as the routing produces it. With the
model's top-k and expert count, each source's copies are shared over members by the matrix's row (its diagonal,
the copies that stay, included); a member or node holding the share q of a source's copies holds q x E of the E
experts as that source sees them, and a token with k distinct experts among E misses them with probability
C(E - qE, k) / C(E, k) (exact for uniform routing over experts spread evenly; the same formula at a skewed
share). DeepEP sends the expected number of tokens that hit the member (or node), in place of the k q copies per
token the matrix holds. Under a round-robin gate (`Fanout.adjacent`: token t takes experts (t k + j) mod E, j < k,
as NeMo AutoModel's FakeBalancedGate assigns them) a token's experts are adjacent, so with the experts placed
contiguously by EP rank it reaches only the members and nodes holding its block (DeepSeek-V3 at EP 64: 2 GPUs of
one node): the share of tokens reaching each member and node is counted exactly over the cycle of starts
(`adjacent_hits`). A combine's matrix is the dispatch's
transposed: its shares are taken by column. Without a fanout the matrix's bytes move as they are (each entry
distinct tokens).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

import numpy as np

from piper_sim.collectives.hierarchical import host_groups, local_index
from piper_sim.collectives.params import ParamSchema, algorithm_params, check_fraction, check_units, register_params
from piper_sim.collectives.phases import ALL_TO_ALL, AllToAll, Phase, matrix_phase, split_exchange
from piper_sim.errors import ConfigError
from piper_sim.topology.graph import Topology

DEEPEP_SCHEMA: dict[str, object] = {"nvl_efficiency": ..., "rdma_efficiency": ..., "compute_units": None}


def _check(topo: Topology, p: dict) -> None:
    for key in ("nvl_efficiency", "rdma_efficiency"):
        check_fraction(p[key], f"topology.collectives.deepep.{key}")
    check_units(p["compute_units"], "topology.collectives.deepep.compute_units")


register_params("deepep", ParamSchema(DEEPEP_SCHEMA, check=_check))


@dataclass(frozen=True)
class Fanout:
    """How a token's copies spread: top_k distinct experts of num_experts; combine: the matrix is a combine's (the
    dispatch's transposed); adjacent: a token's experts are top_k adjacent ones (a round-robin gate,
    RoutingKind.adjacent_experts), not a spread over all experts."""

    top_k: int
    num_experts: int
    combine: bool = False
    adjacent: bool = False


def hit_probability(share: np.ndarray, top_k: int, num_experts: int) -> np.ndarray:
    """P(a token with top_k distinct experts of num_experts hits a holder of share x num_experts of them)."""
    held = num_experts * np.asarray(share, dtype=float)[..., None]
    i = np.arange(top_k)
    miss = np.prod(np.clip((num_experts - held - i) / (num_experts - i), 0.0, None), axis=-1)
    return 1.0 - miss


def _deduplicated(copies: np.ndarray, totals: np.ndarray, fanout: Fanout) -> np.ndarray:
    """Bytes of distinct tokens in place of copies (rows: sources, with their whole copies `totals`)."""
    share = np.divide(copies, totals[:, None], out=np.zeros_like(copies), where=totals[:, None] > 0)
    hit = hit_probability(share, fanout.top_k, fanout.num_experts)
    factor = np.divide(hit, fanout.top_k * share, out=np.ones_like(share), where=share > 0)
    return copies * factor


def adjacent_hits(top_k: int, num_experts: int, host: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(hit[d], hit[B]): the share of a source's tokens that reach member d, node B when token t takes experts
    (t top_k + j) mod E, j < top_k, and member d holds experts d E / n to (d + 1) E / n - 1 (contiguous placement):
    exact over the cycle of E / gcd(top_k, E) tokens after which the starts repeat."""
    n, nodes = host.size, int(host.max(initial=-1)) + 1
    if num_experts % n:
        raise ConfigError("parallel.ep", n, f"a divisor of num_experts ({num_experts})")
    cycle = num_experts // math.gcd(top_k, num_experts)
    experts = (top_k * np.arange(cycle)[:, None] + np.arange(top_k)[None, :]) % num_experts
    member = experts // (num_experts // n)  # [token of the cycle, j]: the member holding its j-th expert
    hit_member = (member[:, :, None] == np.arange(n)).any(axis=1).mean(axis=0)
    hit_node = (host[member][:, :, None] == np.arange(nodes)).any(axis=1).mean(axis=0)
    return hit_member, hit_node


def token_bytes(matrix: np.ndarray, host: np.ndarray, fanout: Fanout | None) -> tuple[np.ndarray, np.ndarray]:
    """(bytes[s, d] of the distinct tokens s sends member d, bytes[s, B] of those it sends node B) of a dispatch's
    matrix: the matrix and its per-node sums without a fanout, else deduplicated (module docstring); with adjacent
    experts, each source's tokens (its copies over top_k) times the share of them that reach d or B."""
    m = np.asarray(matrix, dtype=float)
    if fanout is not None and fanout.adjacent:
        hit_member, hit_node = adjacent_hits(fanout.top_k, fanout.num_experts, host)
        tokens = m.sum(axis=1)[:, None] / fanout.top_k
        return tokens * hit_member[None, :], tokens * hit_node[None, :]
    onehot = (host[:, None] == np.arange(int(host.max(initial=-1)) + 1)[None, :]).astype(float)
    per_node = m @ onehot
    if fanout is None:
        return m, per_node
    totals = m.sum(axis=1)
    return _deduplicated(m, totals, fanout), _deduplicated(per_node, totals, fanout)


def relays(host: np.ndarray, groups: list[np.ndarray]) -> np.ndarray:
    """relay[s, B]: the member of node B that receives s's RDMA (s's local index on B); s itself on its own node."""
    local = local_index(host, groups)
    return np.stack([group[local % group.size] for group in groups], axis=1)


def deepep_phases(matrix: np.ndarray, members: list[str], topo: Topology, fanout: Fanout | None = None) -> list[Phase]:
    """DeepEP's data phases for a bytes matrix over the members (module docstring); a combine's are its dispatch's
    (the matrix transposed) run backwards. Without a fanout the matrix is taken as a dispatch's."""
    if fanout is not None and fanout.combine:
        dispatch = deepep_phases(np.asarray(matrix).T, members, topo, replace(fanout, combine=False))
        return [Phase(src=p.dst, dst=p.src, sizes=p.sizes, name=p.name, overhead_s=0.0) for p in dispatch]
    params = algorithm_params(topo, "deepep")
    nvl, rdma = float(params["nvl_efficiency"]), float(params["rdma_efficiency"])
    host, groups = host_groups(members, topo)
    ranks, nodes = token_bytes(matrix, host, fanout)
    if len(groups) == 1:
        return [_charged(matrix_phase(ranks, "nvl"), nvl)]
    n, relay = host.size, relays(host, groups)
    forward = np.zeros((n, n))  # forward[r, d]: what relay r forwards to d over NVLink
    np.add.at(forward, (relay[:, host], np.broadcast_to(np.arange(n), (n, n))), ranks)
    inter = np.zeros((n, n))  # inter[s, r]: what s sends relay r over RDMA
    off = host[:, None] != np.arange(len(groups))[None, :]
    np.add.at(inter, (np.broadcast_to(np.arange(n)[:, None], off.shape)[off], relay[off]), nodes[off])
    return [_charged(matrix_phase(inter, "rdma"), rdma), _charged(matrix_phase(forward, "forward"), nvl)]


def _charged(phase: Phase, efficiency: float) -> Phase:
    """The phase's bytes over DeepEP's achieved share of the link rate; GPU-posted: no per-message overhead."""
    return Phase(src=phase.src, dst=phase.dst, sizes=phase.sizes / efficiency, name=phase.name, overhead_s=0.0)


@ALL_TO_ALL.register("deepep")
@split_exchange(node_gather=False)
def a2a_deepep(matrix: np.ndarray, members: list[str], topo: Topology, fanout: Fanout | None = None) -> list[Phase]:
    """DeepEP's normal kernels: RDMA once per node to the same rail, NVLink forwarding; one node: NVLink direct."""
    return deepep_phases(matrix, members, topo, fanout)


a2a_deepep.takes_fanout = True  # type: ignore[attr-defined]


def bind_fanout(algorithm: AllToAll, fanout: Fanout | None) -> AllToAll:
    """The algorithm with the model's fanout bound where it takes one (deepep), else the algorithm itself; the
    bound form keeps `__wrapped__` (its data phases alone) as the registered one does."""
    if fanout is None or not getattr(algorithm, "takes_fanout", False):
        return algorithm

    def bound(matrix: np.ndarray, members: list[str], topo: Topology) -> list[Phase]:
        return algorithm(matrix, members, topo, fanout=fanout)  # type: ignore[call-arg]

    bound.__wrapped__ = functools.partial(algorithm.__wrapped__, fanout=fanout)  # type: ignore[attr-defined]
    bound.__name__ = getattr(algorithm, "__name__", "a2a")
    return bound
