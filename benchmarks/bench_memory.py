"""Host memory of a simulate run, phase by phase (prints figures; no assertions): the measurements behind the per-unit
costs of piper_sim/host_memory.py.

Each case runs in a process of its own, its outputs in another that holds only the run's result (pickled). Before
each phase the process's peak resident size is reset (Linux: "5" written to /proc/self/clear_refs); after it, the
peak less the resident size before the phase is that phase's peak growth. Phases: imports (the resident size after
them, and after a tiny warm-up run that compiles the kernels), simulate (event loop, task records and report),
and write_run with each of CHOICES (each in a process of its own). Printed per case: rank tasks,
links, ranks, EP, step-0 rows, each phase's peak growth (MB) and its wall time (s).

    python benchmarks/bench_memory.py [CONFIG --set KEY=VALUE ...] (default: the cases below)
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

DENSE = Path(__file__).with_name("dense-100b-frontier.yaml")
CASES = {  # name: (config, overrides)
    "dense-64": (str(DENSE), ["parallel.dp=1", "optimizer.zero=0"]),
    "dense-128": (str(DENSE), ["parallel.dp=2"]),
    "dense-256": (str(DENSE), ["parallel.dp=4"]),
    "moe-64": ("x-moe-small-frontier", ["parallel.pp=4", "parallel.ep=16", "parallel.num_microbatches=32"]),
    "moe-256": ("x-moe-small-frontier", ["parallel.pp=4", "parallel.ep=64", "parallel.num_microbatches=32"]),
}
# output choices, each written in a process of its own: (--outputs, --perfetto, --perfetto-detail)
CHOICES = {
    "report": ("report", None, "auto"),
    "trace": ("trace", None, "auto"),
    "all": ("all", "json", "auto"),
    "all-none": ("all", "none", "auto"),
    "all-gz": ("all", "gz", "auto"),
    "all-proto": ("all", "proto", "auto"),
    "all-json-rank": ("all", "json", "rank"),
    "all-proto-rank": ("all", "proto", "rank"),
}


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def _phase(figures: dict, name: str, fn):
    """Run fn with the peak resident size reset; record its peak growth (MB) and wall time (s)."""
    import gc

    gc.collect()
    before = _status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")
    t0 = time.perf_counter()
    value = fn()
    figures[name] = {
        "peak_growth_MB": round((_status_kib("VmHWM") - before) / 1024, 1),
        "wall_s": round(time.perf_counter() - t0, 2),
    }
    return value


def one(config: str, overrides: list[str], keep: Path) -> dict:
    """The figures of one case's run, in this process; the RunResult is pickled to keep for outputs()."""
    import pickle

    from piper_sim.config import load_config
    from piper_sim.simulator import simulate

    figures: dict = {"imports_rss_MB": round(_status_kib("VmRSS") / 1024, 1)}
    simulate(load_config("tiny-moe"))  # compiles the kernels
    figures["warm_rss_MB"] = round(_status_kib("VmRSS") / 1024, 1)
    cfg = load_config(config, overrides)
    result = _phase(figures, "simulate", lambda: simulate(cfg))
    tasks = result.stats["num_tasks"]
    figures.update(
        tasks=tasks,
        links=len(result.topology.capacity_bytes_per_s),
        ranks=cfg.parallel.num_gpus,
        ep=cfg.parallel.ep,
        step0_rows=tasks // cfg.steps,  # every step has each rank's program once
    )
    keep.write_bytes(pickle.dumps(result))  # the task arrays, no trace frame: the outputs that need it build it
    return figures


def outputs(keep: Path, choice: str) -> dict:
    """One output choice's peak growth and wall time, written in a fresh process that holds only the run's result
    (none of the run's freed memory to reuse: the growth is an upper bound)."""
    import pickle
    import tempfile

    from piper_sim.outputs import write_run

    result = pickle.loads(keep.read_bytes())
    figures: dict = {"result_rss_MB": round(_status_kib("VmRSS") / 1024, 1)}
    outputs_, perfetto, detail = CHOICES[choice]
    with tempfile.TemporaryDirectory() as tmp:
        _phase(
            figures,
            f"outputs {choice}",
            lambda: write_run(Path(tmp) / "out", result, outputs_, perfetto=perfetto, detail=detail),
        )
    return figures


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--one":
        print(json.dumps(one(sys.argv[3], sys.argv[4:], Path(sys.argv[2]))))
        return
    if len(sys.argv) > 3 and sys.argv[1] == "--outputs":
        print(json.dumps(outputs(Path(sys.argv[2]), sys.argv[3])))
        return
    import tempfile

    cases = {"given": (sys.argv[1], [a for a in sys.argv[2:] if a != "--set"])} if len(sys.argv) > 1 else CASES
    for name, (config, overrides) in cases.items():
        with tempfile.TemporaryDirectory() as tmp:
            keep = Path(tmp) / "result.pickle"
            figures = {}
            for argv in (
                ["--one", str(keep), config, *overrides],
                *(["--outputs", str(keep), choice] for choice in CHOICES),
            ):
                done = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True)
                if done.returncode:
                    figures["error"] = (done.stderr.strip().splitlines() or ["?"])[-1]
                    break
                figures.update(json.loads(done.stdout))
        print(name, json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
