"""From per-rank benchmark records to a cost profile (traces/profiles/NAME.yaml): aggregation over ranks, the
profile assembled from the fits of record_fits.py (which own the choice of each number), and the YAML with
unit-suffixed keys that piper_sim.workload.profile_load.load_profile reads. No torch.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable
from pathlib import Path

import yaml

from piper_sim.calibrate import fit
from piper_sim.calibrate.record_fits import (
    blocking_wait_summary,
    core_sharing_summary,
    fit_attention,
    fit_framework,
    fit_framework_by_model,
    fit_gemms,
    fit_launch,
    fit_memory,
    fit_optimizer_records,
    network_summary,
    rounded,
    rounded_us,
)
from piper_sim.torch_backend.bench.calibration_inputs import COMM_BENCHES
from piper_sim.workload.profile_file import CPU

HOST_BENCHES = ("core_sharing", "blocking_wait", "scheduler_slice")  # one rank runs them for the host


def aggregate(per_rank: list[dict]) -> list[dict]:
    """One record per benchmark point: compute times are the median over ranks (each rank's median
    per call), communication times the max over ranks (a collective ends with its slowest rank).
    rank_spread = slowest / fastest rank."""
    groups: dict[tuple, list[dict]] = {}
    for rank_payload in per_rank:
        for rec in rank_payload["records"]:
            key = tuple(sorted((k, v) for k, v in rec.items() if k not in ("time_s", "gemm_sum_s", "window_means_s")))
            groups.setdefault(key, []).append(rec)
    out = []
    for recs in groups.values():
        times = [float(r["time_s"]) for r in recs]
        pick: Callable[[list[float]], float] = max if recs[0]["bench"] in COMM_BENCHES else fit.median
        spread = max(times) / min(times) if min(times) > 0 else None
        merged = dict(recs[0], time_s=pick(times), rank_spread=spread, num_ranks=len(recs))
        if "gemm_sum_s" in recs[0]:
            merged["gemm_sum_s"] = fit.median([float(r["gemm_sum_s"]) for r in recs])
        out.append(merged)
    return out


def build_profile(
    *,
    name: str,
    per_rank: list[dict],
    testbed_per_rank: list[dict] | None,
    quick: bool,
    command: str,
    versions: dict,
    wall_s: float,
    load_average_before: list[float] | None = None,
    foreign_cpu_share: float | None = None,
) -> dict:
    machine = dict(per_rank[0]["machine"], load_average_before=load_average_before)
    cuda = "accelerator" in machine
    records = aggregate(per_rank)
    launch, tiny = fit_launch(records)
    peak, rows, gemm_eff, gemm_detail = fit_gemms(records, launch)
    seq, attn_eff, attn_detail = fit_attention(records, peak, launch)
    bandwidth, memory = fit_memory(records, cuda)
    opt_bytes, opt_detail = fit_optimizer_records(records, bandwidth)
    ranks = machine["ranks"]
    hbm_gib = machine["accelerator_memory_GiB"] if cuda else machine["memory_GiB"] / ranks
    kind = (
        f"{machine['accelerator']}, bf16"
        if cuda
        else f"CPU ({machine['processor']}, {machine['cpu_count']} cores), {ranks} rank(s) x "
        f"{machine['threads_per_rank']} thread(s), fp32"
    )
    network = {"local": network_summary(records).get("local", {})}
    if testbed_per_rank:
        network["testbed"] = network_summary(aggregate(testbed_per_rank))
    spread = [
        r["rank_spread"] for r in records if r["bench"] not in (*COMM_BENCHES, *HOST_BENCHES) and r["rank_spread"]
    ]
    return {
        "name": name,
        "device": kind,
        **({} if cuda else {"device_kind": CPU}),  # GPUs: named by hand (docs)
        "source": (
            f"measured by piper-sim calibrate ({'quick' if quick else 'full'} sweep) with {ranks} rank(s) "
            "running every benchmark at once (contention included; times are per rank). "
            + (
                ""
                if cuda
                else "On CPU peak_bf16_TFLOPS is the measured fp32 peak (key name kept for the "
                "schema) and hbm_bandwidth_GBps the bandwidth at the models' tensor sizes (cache). "
            )
            + "See docs/calibration.md."
        ),
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "versions": versions,
        "machine": machine,
        "peak_bf16_TFLOPS": rounded(peak / 1e12, 5),
        "hbm_GiB": rounded(hbm_gib),
        "hbm_bandwidth_GBps": rounded(bandwidth / 1e9),
        "memory_efficiency": 1.0,
        "kernel_launch_us": rounded_us(launch),
        "gemm_efficiency": {"rows": [int(x) for x in rows], "efficiency": [rounded(e, 3) for e in gemm_eff]},
        "attention_efficiency": {"seq_len": [int(x) for x in seq], "efficiency": [rounded(e, 3) for e in attn_eff]},
        "optimizer_bytes_per_param": rounded(opt_bytes),
        "measurements": {
            "command": command,
            "sweep": "quick" if quick else "full",
            "calibrate_wall_s": round(wall_s, 1),
            "foreign_cpu_share": None if foreign_cpu_share is None else rounded(foreign_cpu_share, 2),
            "rank_spread_median": rounded(fit.median(spread), 3) if spread else None,
            "compute_cpu_share_per_rank": [
                rounded(p["compute_cpu_share"], 3) if "compute_cpu_share" in p else None for p in per_rank
            ],
            "per_op_overhead": tiny,
            "framework_overhead": fit_framework(records),
            "framework_overhead_by_model": fit_framework_by_model(records),
            "gemm": gemm_detail,
            "attention": attn_detail,
            "memory": memory,
            "optimizer": opt_detail,
            "network": network,
            "blocking_wait": blocking_wait_summary(records, network["local"]),
            "core_sharing": core_sharing_summary(records),
        },
    }


class _Dumper(yaml.SafeDumper):
    pass


def _represent_list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
    flow = all(isinstance(v, int | float | str | bool) or v is None for v in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_Dumper.add_representer(list, _represent_list)


def write_profile(path: Path, profile: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    header = f"# Cost profile measured by `piper-sim calibrate` ({profile['date']}). Units are in the key names.\n"
    path.write_text(header + yaml.dump(profile, Dumper=_Dumper, sort_keys=False, width=120))
