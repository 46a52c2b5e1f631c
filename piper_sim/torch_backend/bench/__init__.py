"""Calibration's micro-benchmarks, run through torch: what `piper-sim calibrate` measures on this machine.

Modules: calibration_inputs (the benchmarks' input: Sweep, TimingPlan, CalibrationJob; pure data, no torch),
timing (the measurement protocol and the device), compute, comm, stage_ops (real StageModule ops, timed
cold), sharing (the core-sharing driver and the scheduler slice; no torch itself), sharing_worker (its
processes), wake (the blocking wait), runner (the ranks: run_local_job, run_testbed_job) and check (the
ranks of `calibrate --check`: measure_ops). piper_sim.calibrate chooses what to measure and turns the
records into a profile; this package must not import piper_sim.calibrate. Nothing is imported at package
import.
"""
