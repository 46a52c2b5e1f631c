"""Entry point of one rank started as its own process (testbed namespaces).

    python -m piper_sim.torch_backend.rank_main JOB.pkl
reads a pickled ("module:function", args) job, joins the process group from the environment
(MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE) and calls function(rank, world_size, *args).
Only piper_sim.torch_backend may import torch.
"""

from __future__ import annotations

import importlib
import os
import pickle
import sys
from datetime import timedelta

import torch.distributed as dist

from .groups import shutdown


def main(job_path: str) -> None:
    with open(job_path, "rb") as fh:
        target, args = pickle.load(fh)
    module, _, name = target.partition(":")
    fn = getattr(importlib.import_module(module), name)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = float(os.environ.get("PIPER_SIM_COLLECTIVE_TIMEOUT_S", "300"))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=timeout))
    fn(rank, world, *args)
    shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
