"""All-to-all algorithms on gloo, 4 processes: every algorithm returns exactly what flat returns, and
flat returns what an independent single-process reference computes, for uneven splits including ranks
that send or receive nothing. HALO on 2 and 4 nodes of 2 ranks (4 and 8 processes) also sends, phase by
phase, the messages and bytes the simulator's HALO phases say (collectives/halo.py), in their order."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402

from piper_sim.errors import ConfigError  # noqa: E402
from piper_sim.torch_backend.a2a_algorithms import ALGORITHMS, all_to_all  # noqa: E402
from piper_sim.torch_backend.groups import DEFAULT_GROUPS  # noqa: E402
from piper_sim.torch_backend.local_launch import run_local  # noqa: E402

WORLD = 4
TWO_NODES = {r: r // 2 for r in range(WORLD)}
# (name, EP groups (global ranks, EP order), node_of, algorithms to compare)
Case = tuple[str, list[list[int]], dict[int, int], tuple[str, ...]]
ALL = ("flat", "pairwise", "halo", "2dh")
NO_2DH = ("flat", "pairwise", "halo")
CASES: list[Case] = [
    ("two nodes", [[0, 1, 2, 3]], TWO_NODES, ALL),
    ("unsorted group", [[2, 0, 3, 1]], TWO_NODES, ALL),
    ("two groups across nodes", [[0, 2], [1, 3]], TWO_NODES, ALL),
    ("one rank per node", [[0, 1, 2, 3]], {r: r for r in range(WORLD)}, ALL),
    ("one node", [[0, 1, 2, 3]], {r: 0 for r in range(WORLD)}, ALL),
    ("three nodes, uneven", [[0, 1, 2, 3]], {0: 0, 1: 0, 2: 1, 3: 2}, NO_2DH),
    ("3 + 1 ranks per node", [[0, 1, 2, 3]], {0: 0, 1: 0, 2: 0, 3: 1}, NO_2DH),
]


def split_matrix(group: list[int], seed: int) -> dict[tuple[int, int], int]:
    """Random uneven sizes; the 2nd member sends nothing, the 3rd (if any) receives nothing."""
    gen = torch.Generator().manual_seed(seed)
    sizes = {(s, d): int(torch.randint(0, 6, (), generator=gen)) for s in group for d in group}
    for d in group:
        sizes[(group[1], d)] = 0
    if len(group) > 2:
        for s in group:
            sizes[(s, group[2])] = 0
    return sizes


def make_rows(source: int, group: list[int], sizes: dict, seed: int, one_dim: bool) -> torch.Tensor:
    n = sum(sizes[(source, d)] for d in group)
    gen = torch.Generator().manual_seed(1000 * seed + source)
    if one_dim:
        return torch.randint(0, 1 << 40, (n,), generator=gen)
    return torch.randn(n, 3, 2, generator=gen)


def expected(me: int, group: list[int], sizes: dict, seed: int, one_dim: bool) -> torch.Tensor:
    """What `me` must receive, computed from every source's regenerated rows."""
    parts = []
    for s in group:
        chunks = torch.split(make_rows(s, group, sizes, seed, one_dim), [sizes[(s, d)] for d in group])
        parts.append(chunks[group.index(me)])
    return torch.cat(parts)


PADDING_CHECK = {"on": False, "messages": 0}


def install_padding_check() -> None:
    """Wrap the collectives (in a child process) to assert every message of the non-flat algorithms
    carries at least one row, i.e. no rank is ever sent or receives zero rows."""
    all_to_all_single, batch_isend_irecv = dist.all_to_all_single, dist.batch_isend_irecv

    def checked_all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, **kw):
        if PADDING_CHECK["on"] and output_split_sizes is not None:  # None: even split (the split-size counts)
            assert min(output_split_sizes) >= 1 and min(input_split_sizes) >= 1
            PADDING_CHECK["messages"] += len(output_split_sizes)
        return all_to_all_single(output, input, output_split_sizes, input_split_sizes, **kw)

    def checked_batch_isend_irecv(ops):
        if PADDING_CHECK["on"]:
            assert all(op.tensor.shape[0] >= 1 for op in ops)
            PADDING_CHECK["messages"] += len(ops)
        return batch_isend_irecv(ops)

    dist.all_to_all_single = checked_all_to_all_single
    dist.batch_isend_irecv = checked_batch_isend_irecv


def check_case(rank: int, case_index: int, seed: int, one_dim: bool) -> None:
    _, groups, node_of, algorithms = CASES[case_index]
    group = next(g for g in groups if rank in g)
    sizes = split_matrix(group, seed)
    rows = make_rows(rank, group, sizes, seed, one_dim)
    send_splits = [sizes[(rank, d)] for d in group]
    want = expected(rank, group, sizes, seed, one_dim)
    want_splits = [sizes[(s, rank)] for s in group]
    one_node = len({node_of[r] for r in group}) == 1
    for algorithm in algorithms:
        PADDING_CHECK["on"] = algorithm != "flat" and not (algorithm == "halo" and one_node)  # halo: flat there
        got, got_splits = all_to_all(rows, send_splits, group, node_of, algorithm)
        PADDING_CHECK["on"] = False
        assert got_splits == want_splits, (algorithm, CASES[case_index][0], rank)
        assert got.dtype == want.dtype and got.shape == want.shape, (algorithm, CASES[case_index][0])
        assert torch.equal(got, want), (algorithm, CASES[case_index][0], rank)


def worker(rank: int, world_size: int) -> None:
    install_padding_check()
    for case_index in range(len(CASES)):
        for seed in (1, 2):
            check_case(rank, case_index, seed, one_dim=seed == 2)
    assert PADDING_CHECK["messages"] > 0
    dist.barrier()
    zero_rows = torch.empty(0, 4)
    for algorithm in ALL:  # nobody sends anything
        got, splits = all_to_all(zero_rows, [0] * WORLD, list(range(WORLD)), TWO_NODES, algorithm)
        assert got.shape == (0, 4) and splits == [0] * WORLD
    rows = torch.randn(5, 4)
    for algorithm in ALL:  # a group of one: the rows stay, and no library call is made (not even a group)
        got, splits = all_to_all(rows, [5], [rank], TWO_NODES, algorithm)
        assert torch.equal(got, rows) and splits == [5]
    assert (rank,) not in DEFAULT_GROUPS._groups
    with pytest.raises(ConfigError):  # 2dh needs equal EP ranks per node; raised before any collective
        all_to_all(torch.zeros(4, 1), [1] * 4, list(range(4)), {0: 0, 1: 0, 2: 0, 3: 1}, "2dh")


def test_algorithms_match_flat_and_reference() -> None:
    run_local(worker, WORLD, timeout_s=90)


def test_registry_lists_algorithms_and_rejects_unknown() -> None:
    assert set(ALL) <= set(ALGORITHMS.names())
    with pytest.raises(ConfigError, match="halo"):
        all_to_all(torch.zeros(1, 1), [1], [0], {0: 0}, "nccl-magic")


def test_local_launch_ports_are_below_the_kernels_ephemeral_range():
    # a port the kernel picks (bind to 0) is free again once probed and can be handed to another socket
    # before rank 0's store binds it; one chosen below the ephemeral range cannot be
    import socket

    from piper_sim.torch_backend.local_launch import HOST, LOWEST_PORT, _ephemeral_low, free_port

    ports = {free_port() for _ in range(20)}
    assert all(LOWEST_PORT <= p < _ephemeral_low() for p in ports) and len(ports) > 1
    for port in list(ports)[:3]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((HOST, port))  # still free


# ---- HALO as the simulator models it -------------------------------------------------------------------
# (name, world, rank -> GPU of the topology, topology, chunk_MiB): the ranks' nodes are their GPUs' hosts
HaloCase = tuple[str, int, dict[int, str], str, float]
UNIFORM = {"builder": "uniform", "params": {"gpus_per_node": 2, "intra_bandwidth_GBps": 100, "nic_bandwidth_GBps": 10}}
TESTBED = {r: f"n{r // 2}.g{r % 2}" for r in range(8)}
HALO_CASES: list[HaloCase] = [
    ("2 nodes of 2", 4, TESTBED, "uniform", 1.0),
    ("2 nodes of 2, sliced", 4, TESTBED, "uniform", 1e-4),
    # Frontier: a GCD's relay is the member of the other node whose NIC is on its NIC's switch, not the one
    # of its local index (rank 0 on n0.g0 / switch 0 -> rank 3 on n1.g1, rank 1 on n0.g2 / switch 1 -> rank 2)
    ("2 Frontier nodes, relays by switch", 4, {0: "n0.g0", 1: "n0.g2", 2: "n1.g2", 3: "n1.g1"}, "frontier", 1.0),
    ("3 nodes, uneven, sliced", 4, {0: "n0.g0", 1: "n0.g1", 2: "n1.g0", 3: "n2.g0"}, "uniform", 1e-4),
    ("4 nodes of 2 (testbed-2g)", 8, TESTBED, "testbed-2g", 1.0),
    ("4 nodes of 2, sliced", 8, TESTBED, "testbed-2g", 2e-4),
]
ROW_SHAPE = (3, 2)  # float32 rows of 24 bytes


def halo_topology(case: HaloCase):
    from piper_sim.topology.load import load_topology

    _, world, gpus, name, chunk_mib = case
    topo = load_topology(UNIFORM if name == "uniform" else name, 16 if name == "frontier" else 8)
    topo.collectives = {**topo.collectives, "halo": {"chunk_MiB": chunk_mib}}
    return topo, [gpus[r] for r in range(world)]


def simulated_phases(case: HaloCase, sizes: dict, row_bytes: int):
    """The simulator's HALO phases (its split-size exchange included) for the case's matrix."""
    import numpy as np

    from piper_sim.collectives.algorithms import ALL_TO_ALL

    topo, gpus = halo_topology(case)
    n = len(gpus)
    matrix = np.array([[sizes[(s, d)] * row_bytes for d in range(n)] for s in range(n)], dtype=float)
    return ALL_TO_ALL.get("halo")(matrix, gpus, topo)


def check_halo_case(rank: int, index: int, seed: int) -> None:
    import re

    from piper_sim.collectives.halo import halo_machine
    from piper_sim.torch_backend.phase_plan import TRAFFIC

    case = HALO_CASES[index]
    name, world = case[0], case[1]
    topo, gpus = halo_topology(case)
    group = list(range(world))
    node_of = {r: topo.host_of(gpus[r]) for r in group}
    machine = halo_machine(gpus, topo)
    sizes = split_matrix(group, seed)
    rows = make_rows(rank, group, sizes, seed, one_dim=False)
    send_splits = [sizes[(rank, d)] for d in group]
    want, want_splits = all_to_all(rows, send_splits, group, node_of, "flat")
    TRAFFIC.clear()
    TRAFFIC.on = True
    got, got_splits = all_to_all(rows, send_splits, group, node_of, "halo", halo=machine)
    TRAFFIC.on = False
    assert got_splits == want_splits and torch.equal(got, want), (name, rank)  # bit for bit
    row_bytes = ROW_SHAPE[0] * ROW_SHAPE[1] * rows.element_size()  # make_rows: (n, 3, 2) float32
    phases = simulated_phases(case, sizes, row_bytes)
    simulated: dict[tuple[str, int], float] = {}
    for p in phases:
        for s, d, b in zip(p.src.tolist(), p.dst.tolist(), p.sizes.tolist(), strict=True):
            if s == rank:
                simulated[(p.name, d)] = simulated.get((p.name, d), 0.0) + b
    measured = {(phase, dst): float(nbytes) for phase, src, dst, nbytes in TRAFFIC.sent}
    assert len(measured) == len(TRAFFIC.sent) and all(src == rank for _, src, _, _ in TRAFFIC.sent)
    sliced = {p.name for p in phases if "[" in p.name}
    if not sliced:  # every message: the simulator's flows, their senders, receivers and bytes
        assert measured == simulated, (name, rank, sorted(measured.items()), sorted(simulated.items()))
    else:  # whole rows per slice: each message within a row per chunk of 1/slices of the flow, sums exact

        def whole(key):
            return re.sub(r"\[\d+/\d+\]", "", key[0]), key[1]

        totals: dict = {}
        for table, sign in ((measured, 1.0), (simulated, -1.0)):
            for key, b in table.items():
                totals[whole(key)] = totals.get(whole(key), 0.0) + sign * b
        assert all(abs(v) < 1e-6 for v in totals.values()), (name, rank, totals)
        assert set(measured) <= set(simulated), (name, rank)
        for key, b in simulated.items():
            assert abs(measured.get(key, 0.0) - b) <= world * row_bytes, (name, rank, key)
    # order: each phase is issued once the phases it comes after have ended here; phase I goes out with the
    # first slice of phase II, before this rank waits for anything (they are in flight together)
    split_count = sum(p.name.startswith("splits:") for p in phases)
    data = phases[split_count:]
    events = [(what, phase) for what, phase in TRAFFIC.events if not phase.startswith("splits:")]
    first_wait = next(i for i, (what, _) in enumerate(events) if what == "wait")
    assert {phase for what, phase in events[:first_wait]} == {data[0].name, data[1].name}, (name, events)
    for phase in data:
        issued = events.index(("issue", phase.name))
        for a in (a for a in phase.after if a >= split_count):  # the split sizes all end first
            assert events.index(("wait", data[a - split_count].name)) < issued, (name, phase.name)
    assert (len(data) > 3) == (case[4] < 1), (name, [p.name for p in data])


def halo_worker(rank: int, world_size: int) -> None:
    for index, case in enumerate(HALO_CASES):
        if case[1] == world_size:
            for seed in (3, 4):
                check_halo_case(rank, index, seed)


def test_halo_runs_the_simulators_phases_on_two_nodes() -> None:
    run_local(halo_worker, 4, timeout_s=120)


@pytest.mark.slow
def test_halo_runs_the_simulators_phases_on_four_nodes() -> None:
    run_local(halo_worker, 8, timeout_s=240)
