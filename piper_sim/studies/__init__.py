"""Studies: what-if questions answered over many points, each on the point runner and store (piper_sim.points).

- all_to_all, collective: one collective alone on the machine over machine sizes, sizes and algorithms
  (`study all-to-all`, `study collective`), on collective_sweep (their grid and CSVs), reduced_collective (one
  collective on an exactly reduced flow network), routes, symmetry and prepcache; collective_plots draws them
- imbalance: MFU and step time against routing skew, per migration policy (`study imbalance`)
- scaling: the planner's best plan at each GPU count (`study scaling`)
- config_sweep: the simulator over any grid of config keys (`piper-sim sweep`)
- model_size: a model's MoE-layer all-to-all buffer, as a study's size
May import the planner; nothing below studies imports it. Must not import torch.
"""
