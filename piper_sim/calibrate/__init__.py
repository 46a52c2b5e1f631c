"""Calibration: micro-benchmarks of this machine, turned into a cost profile.

`piper-sim calibrate --out traces/profiles/NAME.yaml [--ranks N] [--quick] [--testbed PREFIX]` runs
GEMMs, expert FFNs, attention, memory-bound ops, the Adam step and gloo communication on N ranks at
once and writes a profile that piper_sim.workload.profile_load.load_profile reads. `--check PROFILE` instead
times real StageModule ops and compares them with the profile's predictions.

Modules: sweep (what is measured; pure data), fit (numpy fits), profile (records -> YAML), runner (the
calibration's course: job, records, profile), crosscheck (--check: pricing and comparing), sharing (the machine's
reference speed), cli (the subcommand). The benchmarks themselves run through torch in
piper_sim.torch_backend.bench, which runner, crosscheck and sharing call. Reading a profile is
piper_sim.workload.profile_load's. Nothing here imports torch, and nothing is imported at package import.
"""
