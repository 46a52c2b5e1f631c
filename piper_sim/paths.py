"""Where shipped data lives: topologies/, traces/, validation/ at the repository root.

The package runs from a clone (pip install -e .); PIPER_SIM_HOME overrides the root.
"""

from __future__ import annotations

import os
from pathlib import Path


def project_root() -> Path:
    env = os.environ.get("PIPER_SIM_HOME")
    return Path(env) if env else Path(__file__).resolve().parent.parent


def data_dir(name: str) -> Path:
    return project_root() / name
