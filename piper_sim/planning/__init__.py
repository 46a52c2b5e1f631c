"""Planning: choose the parallel plan as Piper's resource model does (`piper-sim plan`).

- space: the plan space (knobs, Piper's constraints, --fix) and its enumeration
- resource: memory per pipeline stage (shares its formulas with the simulator's tracker)
- estimate: the analytic tier (the simulator's cost functions, no event loop)
- planner: screen, refine the top K with the simulator (its points run and stored by piper_sim.points), rank,
  write the outputs
Must not import torch.
"""
