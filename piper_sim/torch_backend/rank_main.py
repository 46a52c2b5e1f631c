"""Entry point of one rank started as its own process (testbed namespaces, torchrun).

    python -m piper_sim.torch_backend.rank_main SPEC.pkl
reads the pickled RunSpec, joins the process group from the environment (MASTER_ADDR, MASTER_PORT,
RANK, WORLD_SIZE) and runs the worker. Only piper_sim.torch_backend may import torch.
"""

from __future__ import annotations

import os
import pickle
import sys
from datetime import timedelta

import torch.distributed as dist

from .groups import shutdown
from .run import worker


def main(spec_path: str) -> None:
    with open(spec_path, "rb") as fh:
        spec = pickle.load(fh)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = float(os.environ.get("PIPER_SIM_COLLECTIVE_TIMEOUT_S", "300"))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=timeout))
    worker(rank, world, spec)
    shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
