"""piper-sim: predict and validate the training speed of pipelined expert-parallel MoE models.

The Python API (README.md, "Python API"), loaded on first use so that `import piper_sim` stays light:

    from piper_sim import load_config, simulate
    result = simulate(load_config("examples/small-moe.yaml", ["parallel.pp=4"]))
    result.report.step_time_s, result.trace  # the Report, and the RunTrace as a pandas DataFrame

load_config(path or mapping, overrides) -> Config; simulate(Config) -> RunResult (piper_sim.simulator.simulate,
the simulator backend's entry point).
"""

from piper_sim.version import __version__

__all__ = ["__version__", "load_config", "simulate"]


def __getattr__(name: str) -> object:
    if name == "load_config":
        from piper_sim.config import load_config  # on first use: every submodule's import runs this file

        return load_config
    if name == "simulate":
        from piper_sim.simulator import simulate  # on first use (simpy, numpy, pandas)

        return simulate
    raise AttributeError(f"module 'piper_sim' has no attribute {name!r}")
