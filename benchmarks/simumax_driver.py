"""Runs SimuMax's event timeline once for benchmarks/bench_peers.py (runs in SimuMax's own Python, not piper-sim's).

    SIMUMAX_PYTHON benchmarks/simumax_driver.py RUN_DIR

RUN_DIR holds model.json, strategy.json and system.json (bench_peers writes them); the timeline goes to
RUN_DIR/timeline/ and the figures to RUN_DIR/result.json. Timed: PerfLLM.run_estimate() (builds the modelled
graph the timeline replays) and PerfLLM.simulate() (the replay and the export of its trace file, timed apart).
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

from simumax.core import simu_runner
from simumax.core.config import ModelConfig, StrategyConfig, SystemConfig
from simumax.core.perf_llm import PerfLLM

EXPORT_STEPS = ("process_log_file", "append_memory_events_to_trace", "export_simu_memory_artifacts")


def timed_exports(spent: list[float]) -> None:
    """Wrap the steps run_simulation calls after its replay, to time the trace export apart."""
    for name in EXPORT_STEPS:
        step = getattr(simu_runner, name, None)
        if step is None:
            continue

        def wrapper(*args, _step=step, **kwargs):
            t0 = time.perf_counter()
            try:
                return _step(*args, **kwargs)
            finally:
                spent.append(time.perf_counter() - t0)

        setattr(simu_runner, name, wrapper)


def milliseconds(text: object) -> float:
    """SimuMax's result strings ('18.55 s', '431.49 ms') in milliseconds."""
    match = re.fullmatch(r"\s*([-+0-9.eE]+)\s*(ms|s|us)?\s*", str(text))
    if not match:
        return float("nan")
    return float(match.group(1)) * {"s": 1e3, "ms": 1.0, "us": 1e-3, None: 1.0}[match.group(2)]


def timeline_end_ms(trace: Path) -> tuple[float, int]:
    payload = json.loads(trace.read_text(encoding="utf-8"))
    events = payload.get("traceEvents", []) if isinstance(payload, dict) else payload
    slices = [e for e in events if e.get("ph") == "X"]
    return max((e.get("ts", 0.0) + e.get("dur", 0.0) for e in slices), default=0.0) / 1e3, len(slices)


def main() -> None:
    run = Path(sys.argv[1])
    perf = PerfLLM()
    perf.configure(
        strategy_config=StrategyConfig.init_from_config_file(str(run / "strategy.json")),
        model_config=ModelConfig.init_from_config_file(str(run / "model.json")),
        system_config=SystemConfig.init_from_config_file(str(run / "system.json")),
    )
    export: list[float] = []
    timed_exports(export)
    t0 = time.perf_counter()
    perf.run_estimate()
    t1 = time.perf_counter()
    perf.simulate(str(run / "timeline"))
    t2 = time.perf_counter()
    step_ms, slices = timeline_end_ms(run / "timeline" / "tracing_logs.json")
    estimate = perf.analysis_cost().data
    (run / "result.json").write_text(
        json.dumps(
            {
                "wall_s": t2 - t0,
                "build_s": t1 - t0,
                "export_s": sum(export),
                "replay_s": t2 - t1 - sum(export),
                "step_time_ms": step_ms,
                "slices": slices,
                "lanes": perf.strategy.pp_size,  # simulate() merges a stage's ranks
                "estimate_ms": milliseconds(estimate.get("duration_time_per_iter")),
            }
        )
    )


if __name__ == "__main__":
    main()
