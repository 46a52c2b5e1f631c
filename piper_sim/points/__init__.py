"""Points: many independent runs, each keyed, stored as it finishes and not run again while its key holds; what
the planner, the studies, `piper-sim sweep` and `piper-sim reproduce` run their work on.

- keys: the key a point is stored under (its payload, the content of every file it reads, the code version)
- store: one JSON file per finished point (ResultStore), reused only under the point's key
- dask_runner: running points in this process or on Dask, with a progress line and an ETA
Imports none of planning, studies or reproduce. Must not import torch.
"""
