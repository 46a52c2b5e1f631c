"""Calibration: micro-benchmarks of this machine through torch, turned into a cost profile.

`piper-sim calibrate --out traces/profiles/NAME.yaml [--ranks N] [--quick] [--testbed PREFIX]` runs
GEMMs, expert FFNs, attention, memory-bound ops, the Adam step and gloo communication on N ranks at
once and writes a profile that piper_sim.workload.cost.load_profile reads. `--check PROFILE` instead
times real StageModule ops and compares them with the profile's predictions.

Modules: sweep (what is measured; pure data), fit (numpy fits), profile (records -> YAML; no torch),
timing, compute, comm, runner, crosscheck (torch), cli (the subcommand). Nothing is imported at package
import, so the simulator never pays for torch.
"""
