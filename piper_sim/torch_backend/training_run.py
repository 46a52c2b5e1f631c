"""`piper-sim run`: the torch backend end to end on this machine (or under torchrun).

Owns the launch of the ranks (spawned locally with gloo on CPU / nccl on GPU, or taken from torchrun's
environment), the per-rank worker (Executor over the lowered Schedule, real text from the standard
library), collecting every rank's RunTrace rows and losses, and turning a crash or a hang into one
clear error naming the rank. Only piper_sim.torch_backend may import torch.
"""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist

from piper_sim.collectives.halo import HaloMachine, halo_machine
from piper_sim.config import Config
from piper_sim.errors import PiperError
from piper_sim.machine import Machine, build_machine
from piper_sim.progress import bar as progress_bar
from piper_sim.progress import watch
from piper_sim.routing.kinds import RoutingContext
from piper_sim.routing.samplers import popularity
from piper_sim.routing.trace import TraceRecorder
from piper_sim.schedule.ir import Schedule
from piper_sim.testbed import load

from .corpus import ByteCorpus
from .executor import Executor
from .groups import shutdown
from .local_launch import run_local
from .process_launch import launch_in_namespaces

STEP_MARKS = ".steps"  # ranks/rankN.steps: one byte per step the rank has finished


def run_devices() -> str | None:
    """What the ranks compute on where it decides the cost profile: "cpu" without CUDA (gloo ranks on this
    machine's CPUs), None on GPUs (the topology's devices; piper_sim.profile_choice)."""
    return None if torch.cuda.is_available() else "cpu"


@dataclass(frozen=True)
class RunSpec:
    """What each rank needs, picklable: the config as loaded (its sections built: a rank reads no config file), the
    lowered schedule to run, the nodes of the ranks on the machine, and where to write."""

    config: Config
    schedule: Schedule
    out_dir: str
    node_of: dict[int, int]
    halo: HaloMachine = HaloMachine()  # the halo all-to-all's NIC switches and slicing (collectives/halo.py)
    corpus_bytes: int = 2_000_000
    lr: float = 3e-3
    capture_grads: bool = False  # tests: step 0's reduced gradients and updated parameters per rank
    # (ranks/rank<r>.grads.pt, ranks/rank<r>.params.pt)
    gather: bool = False  # multi-node (torchrun): no shared file system assumed, rank 0 gathers the rows


def batch_source(corpus: ByteCorpus, seq_len: int, mbs: int, seed: int, replicas: int, num_microbatches: int):
    """Deterministic (tokens, targets) for (step, replica, microbatch): the same on every rank that asks."""

    def batch(step: int, replica: int, microbatch: int):
        index = (step * replicas + replica) * num_microbatches + microbatch
        return next(corpus.batches(seq_len, mbs, seed=seed * 1_000_003 + index, num_batches=1))

    return batch


def worker(rank: int, world_size: int, spec: RunSpec) -> None:
    """One rank: build the executor, run the steps, write rows and losses under out_dir/ranks/."""
    cfg = spec.config
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))  # ranks share the cores: no oversubscription
    schedule = spec.schedule
    par = cfg.parallel
    corpus = ByteCorpus.from_stdlib(max_bytes=spec.corpus_bytes)
    torch.manual_seed(cfg.seed)
    batch_fn = batch_source(
        corpus, cfg.model.seq_len, par.micro_batch_size, cfg.seed, par.batch_parallel, par.num_microbatches
    )
    device, dtype = torch.device("cpu"), torch.float32  # on CPU the backend computes in float32
    if torch.cuda.is_available():  # one GPU per rank, round-robin over this host's GPUs (nccl), the model's dtype
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
        torch.cuda.set_device(device)
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.model.dtype, torch.float32)
    executor = Executor(
        schedule=schedule,
        model=cfg.model,
        rank=rank,
        node_of=spec.node_of,
        halo=spec.halo,
        all_to_all_algorithm=cfg.collectives.all_to_all,
        batch_fn=batch_fn,
        micro_batch_size=par.micro_batch_size,
        seed=cfg.seed,
        lr=spec.lr,
        migration=cfg.migration,
        device=device,
        dtype=dtype,
        zero=cfg.zero,
        sp=par.sp,
        reshard_after_forward=cfg.reshard_after_forward,
    )
    if spec.capture_grads:
        executor.captured_grads = {}
    bias = router_bias(cfg)
    if bias is not None:
        executor.skew_routers(bias)
    t0 = torch.tensor([time.perf_counter()], dtype=torch.float64)
    dist.broadcast(t0, src=0)  # one clock origin (perf_counter is system-wide monotonic on one machine)
    losses = []
    if os.environ.get("PIPER_SIM_KILL_RANK") == str(rank):  # test hook: this rank dies as if killed
        os.kill(os.getpid(), signal.SIGKILL)
    out = Path(spec.out_dir) / "ranks"
    out.mkdir(parents=True, exist_ok=True)
    for step in range(cfg.steps):
        dist.barrier()
        loss = torch.tensor([executor.run_step(step, float(t0))], dtype=torch.float64)
        dist.all_reduce(loss)
        losses.append(float(loss))
        with open(out / f"rank{rank}{STEP_MARKS}", "ab") as marks:  # one byte a step: the launcher's progress line
            marks.write(b".")
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    # on a GPU: the most the caching allocator held for tensors on the rank's device
    peak_device = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    mine = (
        executor.records,
        peak_rss,
        executor.peak_tensor_bytes,
        executor.routing_rows,
        peak_device,
        executor.step_cpu_s,
    )
    if spec.gather:  # multi-node: no shared file system assumed, rank 0 writes every rank's files
        gathered: list = [None] * world_size if rank == 0 else None
        dist.gather_object(mine, gathered, dst=0)
        parts = dict(enumerate(gathered)) if rank == 0 else {}
    else:
        parts = {rank: mine}
    for r, (part_rows, rss, tensors, routing, device_bytes, step_cpu) in parts.items():
        pd.DataFrame(part_rows).to_parquet(out / f"rank{r}.parquet", index=False)
        (out / f"rank{r}.json").write_text(
            json.dumps(
                {
                    "peak_rss_bytes": rss,
                    "peak_tensor_bytes": tensors,
                    "peak_device_bytes": device_bytes,
                    "step_cpu_s": step_cpu,
                }
            )
        )
        (out / f"rank{r}.routing.json").write_text(json.dumps(routing))
    if executor.captured_grads is not None:
        torch.save(executor.captured_grads, out / f"rank{rank}.grads.pt")
        torch.save(executor.captured_params, out / f"rank{rank}.params.pt")
    if rank == 0:
        (out / "losses.json").write_text(json.dumps(losses))


STEERABLE = ("uniform", "zipf", "dirichlet", "hot")


def router_bias(cfg):
    """For a skewed routing kind, a fixed logit bias per layer that makes the real router skewed the same way.

    bias_e = log(E x p_e) with p the kind's expert popularity for (seed, layer); uniform gives None (the
    real router alone decides). Kinds that change over steps or replay traces cannot steer a real router.
    """
    kind = cfg.routing.kind
    if kind not in STEERABLE:
        raise PiperError(
            f"routing.kind: {kind!r} cannot steer the real router; allowed for run: {', '.join(STEERABLE)}"
        )
    if kind == "uniform":
        return None
    params = {k: v for k, v in cfg.routing.params.items() if k != "capacity_factor"}
    model = cfg.model

    def bias(layer: int) -> list[float]:
        ctx = RoutingContext(
            step=0,
            layer=layer,
            microbatch=0,
            group=0,
            num_sources=1,
            tokens_per_source=1,
            num_experts=model.num_experts,
            top_k=model.top_k,
            seed=cfg.seed,
            params=params,
        )
        p = np.clip(popularity(kind, ctx), 1e-9, None)
        return np.log(p * model.num_experts).tolist()

    return bias


def merge_routing(cfg, ranks_dir: Path, out_path: Path) -> Path | None:
    """The real router's decisions of every rank as one routing trace (traces format, per source)."""
    layers = list(cfg.model.moe_layer_indices)
    if not layers:
        return None
    rec = TraceRecorder(
        model=cfg.model.name,
        num_experts=cfg.model.num_experts,
        top_k=cfg.model.top_k,
        layers=layers,
        num_microbatches=cfg.parallel.num_microbatches,
        num_sources=cfg.parallel.ep,
        source="captured by piper-sim run (torch backend): the real router's top-k choices",
    )
    for path in sorted(ranks_dir.glob("rank*.routing.json")):
        for step, layer, mb, source, counts in json.loads(path.read_text()):
            rec.record(step, layer, counts, microbatch=mb, source=source)
    return rec.write(out_path)


def node_map(machine: Machine) -> tuple[dict[int, int], HaloMachine]:
    """(rank -> node index, what HALO needs of the machine) from the machine's topology and placement: the
    nodes, NIC switches and slicing the simulator's HALO sees for the same ranks."""
    topo, gpus = machine.topology, machine.placement
    return {r: topo.host_of(g) for r, g in enumerate(gpus)}, halo_machine(list(gpus), topo)


def launch(
    cfg,
    schedule: Schedule,
    out_dir: Path,
    *,
    machine: Machine | None = None,
    timeout_s: float = 600.0,
    corpus_bytes: int = 2_000_000,
    capture_grads: bool = False,
    testbed: str | None = None,
    progress: bool = False,
) -> tuple[pd.DataFrame, list[float], float, list[dict], str] | None:
    """Run the schedule on the ranks; returns (trace rows, loss per step, wall seconds, peak memory per rank,
    device kind "cuda" or "cpu").

    Peak memory per rank: {"peak_tensor_bytes": training state (params, grads, Adam moments) plus the
    activations autograd keeps, at its highest; "peak_rss_bytes": the process's peak resident size;
    "peak_device_bytes": on a GPU, torch.cuda.max_memory_allocated, else None; and "step_cpu_s": the CPU its main
    thread used over each step}.

    machine: the config's (built from cfg when None): where each rank's node is. testbed: the prefix of a running
    `piper-sim testbed up`; each rank then runs inside its node's network namespace and talks over the shaped
    links. Otherwise ranks are spawned on this machine.
    progress: a progress line of the ranks' steps done (piper_sim.progress), read from the one-byte-a-step marks
    each rank appends to out_dir/ranks/rankN.steps.
    """
    world = cfg.parallel.num_gpus
    router_bias(cfg)  # refuse routing kinds a real router cannot follow before starting any rank
    node_of, halo = node_map(machine or build_machine(cfg))
    spec = RunSpec(
        config=cfg,
        schedule=schedule,
        out_dir=str(out_dir),
        node_of=node_of,
        halo=halo,
        corpus_bytes=corpus_bytes,
        capture_grads=capture_grads,
    )
    t0 = time.perf_counter()
    ranks = Path(out_dir) / "ranks"
    if running_under_torchrun():
        if not _launch_torchrun(spec, world):
            return None  # not rank 0: rank 0 gathered everything and writes the outputs
    else:
        for old in ranks.glob(f"rank*{STEP_MARKS}"):  # an earlier run's marks would count as steps done
            old.unlink()
        line = progress_bar(world * cfg.steps, "training", "rank steps", show=progress)
        with watch(line, lambda: sum(p.stat().st_size for p in ranks.glob(f"rank*{STEP_MARKS}"))):
            if testbed is not None:
                _launch_in_testbed(spec, world, out_dir, testbed, timeout_s)
            else:
                _launch_local(spec, world, timeout_s)
    wall = time.perf_counter() - t0
    merge_routing(cfg, ranks, Path(out_dir) / "routing.npz")
    frames = [pd.read_parquet(ranks / f"rank{r}.parquet") for r in range(world)]
    losses = json.loads((ranks / "losses.json").read_text())
    memory = [json.loads((ranks / f"rank{r}.json").read_text()) for r in range(world)]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return pd.concat(frames, ignore_index=True), losses, wall, memory, device


def _launch_torchrun(spec: RunSpec, world: int) -> bool:
    """This process is one rank started by torchrun (multi-node): join, run, gather to rank 0."""
    if int(os.environ["WORLD_SIZE"]) != world:
        raise PiperError(f"run: torchrun started {os.environ['WORLD_SIZE']} ranks, the config needs {world}")
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank = dist.get_rank()
    worker(rank, world, replace(spec, gather=True))
    shutdown()
    return rank == 0


def _launch_local(spec: RunSpec, world: int, timeout_s: float) -> None:
    try:
        run_local(worker, world, spec, backend="nccl" if torch.cuda.is_available() else "gloo", timeout_s=timeout_s)
    except TimeoutError:
        raise PiperError(f"run: the {world} ranks did not finish within {timeout_s:.0f} s; all were stopped") from None
    except Exception as exc:  # a rank raised or died: name it
        raise PiperError(f"run: {_which_rank(exc)} failed: {_first_line(exc)}") from None


def _launch_in_testbed(spec: RunSpec, world: int, out_dir: Path, prefix: str, timeout_s: float) -> None:
    bed = load(prefix)
    if bed is None:
        raise PiperError(f"--testbed {prefix}: no testbed with that prefix is up (run `piper-sim testbed up` first)")
    rank_map = bed.rank_map()
    if len(rank_map) != world:
        raise PiperError(f"--testbed {prefix}: it has {len(rank_map)} ranks, the config needs {world}")
    placed = {r: host for r, host in spec.node_of.items()}
    hosts = {r: bed.rank(r).host for r in range(world)}
    if placed != hosts:
        raise PiperError(
            f"--testbed {prefix}: the config places ranks on nodes {placed}, the testbed on {hosts}; "
            "use the testbed's topology file and contiguous placement"
        )
    launch_in_namespaces(
        "piper_sim.torch_backend.training_run:worker", (spec,), rank_map, Path(out_dir), timeout_s=timeout_s
    )


def _which_rank(exc: Exception) -> str:
    match = re.search(r"[Pp]rocess (\d+)", str(exc))
    return f"rank {match.group(1)}" if match else "a rank"


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    errors = [line for line in text if re.match(r"^\w*(Error|Exception)\b", line.strip())]
    return (errors[-1] if errors else text[-1] if text else type(exc).__name__).strip()


def running_under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ
