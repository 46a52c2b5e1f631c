"""Where shipped data lives: examples/, topologies/, traces/, validation/ at the repository root.

The package runs from a clone (pip install -e .); PIPER_SIM_HOME overrides the root. Owns finding a
shipped file by its short name (config_path). Imports nothing of piper_sim.
"""

from __future__ import annotations

import os
from pathlib import Path


def project_root() -> Path:
    env = os.environ.get("PIPER_SIM_HOME")
    return Path(env) if env else Path(__file__).resolve().parent.parent


def data_dir(name: str) -> Path:
    return project_root() / name


def config_path(name: str) -> str:
    """A config as the user named it: the path itself, or where no such file exists and the name has no
    suffix, the shipped example of that name (examples/NAME.yaml) when there is one."""
    path = Path(name)
    if not path.exists() and not path.suffix:
        example = data_dir("examples") / f"{name}.yaml"
        if example.exists():
            return str(example)
    return name
