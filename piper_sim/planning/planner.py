"""`piper-sim plan`: the valid plans of a model on N GPUs, screened analytically, the best refined with the
simulator, ranked.

Owns the plan flow: enumerate (space.py), memory and fit per stage (resource.py), the analytic estimate of
every candidate (estimate.py), the discrete-event refinement of the top K that fit (on Dask through
engine.py, stored by store.py), the ranking (simulated step time where refined, else estimated), and the
rank correlation of the two tiers on the refined set. Writing the outputs is plan_outputs.py's.
Must not import torch.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from piper_sim.analysis.ranking import spearman
from piper_sim.config import ZERO_STAGES, load_config, with_precision
from piper_sim.errors import ConfigError
from piper_sim.machine import Machine, place_machine
from piper_sim.planning.estimate import Estimate, Estimator
from piper_sim.planning.plan_point import A2A_NAMES, SCHEDULE_NAMES, PlanPoint
from piper_sim.planning.refine import refine_points
from piper_sim.planning.resource import stage_memory
from piper_sim.planning.space import enumerate_plans, no_plan_error
from piper_sim.points.keys import KeyedPoint, keyed_point
from piper_sim.points.store import ResultStore
from piper_sim.profile_choice import ProfileChoice, choose_profile
from piper_sim.progress import bar as progress_bar
from piper_sim.run_wall import duration_text
from piper_sim.schedule.communicators import plan_reserve_bytes
from piper_sim.steady_state import expected_wall_s, simulate_figures
from piper_sim.topology.graph import Topology
from piper_sim.topology.load import load_topology, read_topology_mapping
from piper_sim.workload.memory import headroom_bytes
from piper_sim.workload.model import ModelSpec
from piper_sim.workload.presets import load_model
from piper_sim.workload.recompute import RECOMPUTE_MODES

DOMAINS = ("node", "switch", "group", "any")


@dataclass(frozen=True, kw_only=True)
class PlanRequest:
    model: str | dict  # preset name, YAML / HF config.json path, or mapping (as the config's model section)
    num_gpus: int
    global_batch: int  # sequences per step
    topology: str | dict = "frontier"
    profile: str | None = None  # None: the topology's device profile (piper_sim.profile_choice)
    allow_device_mismatch: bool = False  # a profile of other devices than the topology's (cost.allow_device_mismatch)
    seq_len: int | None = None
    fixed: dict | None = None  # knob -> allowed values (space.parse_fixes)
    top_k: int = 16
    domain: str = "switch"  # the locality domain an EP group must fit in (Piper: a node or a switch group)
    reserve_bytes: float | None = None  # framework reserve per GPU (default: resource.FRAMEWORK_RESERVE_FRACTION)
    flash_attention: bool = True  # cost.flash_attention of every plan (--fix cost.flash_attention)
    all_reduce: str = "ring"  # collectives.all_reduce of every plan (--fix collectives.all_reduce)
    precision: str = "bf16"  # cost.precision of every plan (--fix cost.precision; workload/precision.py)

    def model_section(self) -> str | dict:
        if self.seq_len is None:
            return self.model
        base = self.model if isinstance(self.model, dict) else {"preset": self.model}
        if isinstance(self.model, str) and ("/" in self.model or self.model.endswith((".yaml", ".json"))):
            base = {"preset": str(Path(self.model).resolve())}
        return {**base, "seq_len": self.seq_len}

    def profile_choice(self) -> ProfileChoice:
        """The profile that prices the plans (--profile, checked against the topology's devices, or theirs)."""
        return choose_profile(
            self.topology,
            self.profile,
            allow_mismatch=self.allow_device_mismatch,
            key="--profile",
            allow_key="--allow-device-mismatch",
        )

    def config(self, point: PlanPoint) -> dict:
        """The full config of one candidate, ready for `simulate` or `run`."""
        cost = {"profile": self.profile_choice().profile, "flash_attention": self.flash_attention}
        if self.allow_device_mismatch:
            cost["allow_device_mismatch"] = True
        if self.precision != "bf16":
            cost["precision"] = self.precision
        sections = point.config_sections()
        sections["collectives"]["all_reduce"] = self.all_reduce
        return {
            "model": self.model_section(),
            "topology": self.topology,
            "placement": "contiguous",
            "cost": cost,
            **sections,
        }


@dataclass(frozen=True, kw_only=True)
class PlanResult:
    request: PlanRequest
    model: ModelSpec
    table: pd.DataFrame  # one row per candidate, ranked
    hbm_bytes: float
    reserve_bytes: float  # the framework reserve of the first-ranked plan (each candidate's: the table's column)
    rank_correlation: float  # Spearman of estimated and simulated step times on the refined set (nan: < 3)
    screen_s: float
    refine_s: float

    @property
    def best(self) -> pd.Series | None:
        fits = self.table[self.table["fits"]]
        return None if fits.empty else fits.iloc[0]

    def best_config(self) -> dict:
        best = self.best
        return self.request.config(PlanPoint(**{k: _py(best[k]) for k in PlanPoint.__dataclass_fields__}))


def request_machine(request: PlanRequest) -> Machine:
    """The machine every plan of the request is priced on: its topology for the request's GPUs, the ranks placed
    contiguously, the profile the request takes (PlanRequest.profile_choice)."""
    topo = load_topology(request.topology, request.num_gpus)
    return place_machine(topo, request.num_gpus, "contiguous", request.profile_choice().profile)


def domain_gpus(topology_spec: str | dict, num_gpus: int, domain: str, topo: Topology) -> int:
    """GPUs in one locality domain of the topology (topo: the one built of topology_spec for num_gpus): a node, the
    nodes on one switch, a dragonfly group."""
    if domain not in DOMAINS:
        raise ConfigError("--ep-domain", domain, f"one of {', '.join(DOMAINS)}")
    host0 = topo.host_of(topo.gpus[0])
    per_node = sum(1 for g in topo.gpus if topo.host_of(g) == host0)
    params = read_topology_mapping(topology_spec).get("params") or {}
    per_switch = per_node * int(params.get("nodes_per_switch", 1))
    sizes = {
        "node": per_node,
        "switch": per_switch,
        "group": per_switch * int(params.get("switches_per_group", 0)) or num_gpus,
        "any": num_gpus,
    }
    return min(sizes[domain], num_gpus)


def candidates(request: PlanRequest, model: ModelSpec, topo: Topology | None = None) -> list[PlanPoint]:
    """The plans `plan` considers for this request: the space's every schedule, all-to-all, ZeRO stage and the
    recomputation modes its attention allows (selective recomputation only without flash attention). topo: the
    request's topology (built when None)."""
    topo = topo or load_topology(request.topology, request.num_gpus)
    return enumerate_plans(
        model,
        request.num_gpus,
        request.global_batch,
        fixed=request.fixed,
        domain_gpus=domain_gpus(request.topology, request.num_gpus, request.domain, topo),
        **_space(request, topo),
    )


def _space(request: PlanRequest, topo: Topology) -> dict:
    """enumerate_plans' keyword arguments for this request, but for the fixes and the locality domain."""
    return {
        "node_gpus": domain_gpus(request.topology, request.num_gpus, "node", topo),
        "schedules": SCHEDULE_NAMES,
        "all_to_alls": A2A_NAMES,
        "zeros": ZERO_STAGES,
        "recomputes": ("none", "full") if request.flash_attention else RECOMPUTE_MODES,
    }


def screen(
    request: PlanRequest, *, machine: Machine | None = None, progress: bool = True, estimate_unfit: bool = True
) -> tuple[ModelSpec, pd.DataFrame, float, float]:
    """Every candidate with its memory per stage, framework reserve (its communicators'), fit and analytic estimate
    (not yet ranked); the device's HBM and the largest candidate's reserve. machine: the request's
    (request_machine(request) when None). progress: a line with an ETA on stderr
    when the screen takes more than a few seconds (piper_sim.progress). estimate_unfit False: the candidates that do
    not fit get no estimate (NaN; for a caller that reads only plans that fit: the memory is priced first)."""
    model = with_precision(load_model(request.model_section()), {"precision": request.precision})
    machine = machine or request_machine(request)
    topo, profile = machine.topology, machine.profile
    points = candidates(request, model, topo)
    if not points:
        raise no_plan_error(
            model,
            request.num_gpus,
            request.global_batch,
            domain=request.domain,
            domain_gpus=domain_gpus(request.topology, request.num_gpus, request.domain, topo),
            fixed=request.fixed or {},
            **_space(request, topo),
        )
    estimator = Estimator(
        model,
        topo,
        list(machine.placement),
        profile,
        collectives_all_reduce=request.all_reduce,
        flash_attention=request.flash_attention,
    )
    with progress_bar(len(points), "screening plans", "plans", show=progress) as line:
        rows = []
        for point in points:
            rows.append(_screen_row(request, model, profile, estimator, point, estimate_unfit))
            line.update(1)
    table = pd.DataFrame(rows)
    return model, table, profile.hbm_bytes, float(table["framework_reserve_bytes"].max())


def _screen_row(
    request: PlanRequest, model: ModelSpec, profile, estimator: Estimator, point: PlanPoint, estimate_unfit: bool
) -> dict:
    """One candidate's row of the screen: its knobs, memory per stage, reserve, fit and estimate (NaN for a plan
    that does not fit unless estimate_unfit)."""
    memory = stage_memory(
        model, point, flash_attention=request.flash_attention, fp8_transposed_copies=profile.fp8_transposed_copies
    )
    peaks = [m.peak_bytes for m in memory]
    reserve = plan_reserve_bytes(profile, request.reserve_bytes, point.parallel, model, point.schedule)
    headroom = headroom_bytes(peaks, profile.hbm_bytes, reserve)
    worst = int(np.argmin(headroom))
    return {
        **point.as_row(),
        "label": point.label(),
        "peak_memory_bytes": max(peaks),
        "framework_reserve_bytes": reserve,
        "stage0_memory_bytes": peaks[0],
        "memory_headroom_bytes": min(headroom),
        "fits": min(headroom) >= 0,
        "why_not": ""
        if min(headroom) >= 0
        else f"stage {worst} needs {peaks[worst] / 2**30:.1f} GiB, "
        f"{(profile.hbm_bytes - reserve) / 2**30:.1f} GiB usable",
        **(estimator.estimate(point).as_row() if estimate_unfit or min(headroom) >= 0 else _NO_ESTIMATE),
    }


_NO_ESTIMATE = {f"est_{name}": float("nan") for name in Estimate.__dataclass_fields__}


def simulate_point(payload: dict) -> dict:
    """One config simulated (a Dask task): the figures the planner and sweeps keep."""
    t0 = time.perf_counter()
    r = simulate_figures(load_config(payload["config"])).report  # affine steps from short runs: steady_state.py
    return {
        "sim_step_time_s": r.step_time_s,
        "sim_mfu": r.mfu,
        "sim_tflops_per_gpu": r.tflops_per_gpu,
        "sim_tokens_per_s": r.tokens_per_s,
        "sim_bubble_fraction": r.bubble_fraction,
        "sim_exposed_comm_fraction": r.exposed_comm_fraction,
        "sim_peak_memory_bytes": max(r.peak_memory_bytes),
        "sim_all_to_all_bandwidth_bytes_per_s": r.all_to_all_bandwidth_bytes_per_s,
        # short runs' figures: "exact", or "near" (bubble, exposed communication and all-to-all bandwidth approximate)
        "sim_extrapolation": r.extrapolation,
        "sim_wall_s": time.perf_counter() - t0,
    }


def refine_wall_s(point: KeyedPoint) -> float:
    """The predicted wall seconds of simulating a refinement point (run_wall.py; its short runs where
    simulate_point takes them: steady_state.expected_wall_s)."""
    return expected_wall_s(load_config(point.payload["config"]))


def plan(
    request: PlanRequest,
    out: Path,
    *,
    machine: Machine | None = None,
    scheduler: str | None = None,
    workers: int | None = None,
    progress: bool = True,
    budget_s: float | None = None,
    estimate_unfit: bool = True,
) -> PlanResult:
    """Screen every candidate, refine the top K that fit with the simulator (within budget_s where given:
    refine.refine_points), rank (ties: less memory first). machine, estimate_unfit: screen's."""
    t0 = time.perf_counter()
    model, table, hbm, _ = screen(request, machine=machine, progress=progress, estimate_unfit=estimate_unfit)
    screen_s = time.perf_counter() - t0
    table = table.sort_values(
        ["fits", "est_step_time_s", "peak_memory_bytes"], ascending=[False, True, True], kind="stable"
    )
    refine = table[table["fits"]].head(request.top_k)
    points = []
    for _, row in refine.iterrows():
        config = request.config(PlanPoint(**{k: _py(row[k]) for k in PlanPoint.__dataclass_fields__}))
        points.append(keyed_point({"config": config}))
    if progress:
        within = f" within {duration_text(budget_s)}" if budget_s is not None else ""
        print(
            f"plan: {len(table)} candidates, {int(table['fits'].sum())} fit in memory; screened in "
            f"{screen_s:.2f} s; simulating the top {len(points)}{within}",
            file=sys.stderr,
        )
    t1 = time.perf_counter()
    done = refine_points(
        simulate_point,
        points,
        ResultStore(out),
        refine_wall_s,
        budget_s=budget_s,
        scheduler=scheduler,
        workers=workers,
        label="simulating plans",
        progress=progress,
    )
    refine_s = time.perf_counter() - t1
    ran = [i for i, point in enumerate(points) if point.digest in done.rows]
    if progress:
        _say_tiers(refine["label"].tolist(), ran)
    sim = pd.DataFrame([done.rows[points[i].digest] for i in ran], index=refine.index[ran])  # joined by row
    table = table.join(sim) if not sim.empty else table.assign(sim_step_time_s=np.nan)
    table["step_time_s"] = table["sim_step_time_s"].fillna(table["est_step_time_s"])
    table["refined"] = table["sim_step_time_s"].notna()
    # step times equal to 9 significant digits are a tie (e.g. ZeRO-1 and ZeRO-2): less memory first
    table["_step"] = table["step_time_s"].map(lambda t: float(f"{t:.9g}"))
    table = table.sort_values(
        ["fits", "refined", "_step", "peak_memory_bytes"], ascending=[False, False, True, True], kind="stable"
    ).drop(columns="_step")
    table.insert(0, "rank", range(1, len(table) + 1))
    refined = table[table["refined"]]
    rho = (
        spearman(refined["est_step_time_s"].tolist(), refined["sim_step_time_s"].tolist())
        if len(refined) >= 3
        else float("nan")
    )
    return PlanResult(
        request=request,
        model=model,
        table=table.reset_index(drop=True),
        hbm_bytes=hbm,
        reserve_bytes=float(table["framework_reserve_bytes"].iloc[0]),
        rank_correlation=rho,
        screen_s=screen_s,
        refine_s=refine_s,
    )


def _say_tiers(labels: list[str], ran: list[int]) -> None:
    """Which of the top plans were refined and which were left at the estimate tier, on stderr."""
    left = [label for i, label in enumerate(labels) if i not in set(ran)]
    print(
        f"plan: refined {len(ran)} of the top {len(labels)}: " + ("; ".join(labels[i] for i in ran) or "none"),
        file=sys.stderr,
    )
    if left:
        print(f"plan: left at the estimate tier: {'; '.join(left)}", file=sys.stderr)


def _py(value: object) -> object:
    return value.item() if hasattr(value, "item") else value
