"""Validation: predictions from a calibrated profile alone, scored against measured runs of the cases in
validation/cases/ (`piper-sim validate`).

- cases: the case format, finding cases, case_digest, prediction_config (a case priced by a profile), predict_case
- scoring: step and phase times of a trace, score_case (one case against its measurement)
- summary: the statistics over the cases (MAPE, max error, order, HALO over flat, memory, references)
- ordering: the order of cases as their measurements establish it
- concurrency: how many ranks compute at once, and compute tasks with a core to themselves
- remeasure: measuring the cases for real (`--remeasure`) and measured.json
- report: what validate prints and the files of --out

The package never imports torch: remeasure reaches the real runs through the measuring backend's entry
point (measure.measure) and the machine references through calibrate's; they load torch only while they run.
"""
