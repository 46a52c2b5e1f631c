"""Validation cases: the case format and the prediction of a case.

Owns the case format (validation/cases/NAME/case.yaml plus measured/ from `piper-sim run`), finding cases,
the digest of what a real run of a case depends on (case_digest), and the prediction of a case: its config,
the given profile, and the measured run's own routing trace, so that the simulated experts see the loads
the real router chose. Must not import torch, the CLI or the other validation modules.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from piper_sim.collectives.algorithms import REAL_RUN_REVISION
from piper_sim.config import DEFAULTS, Config, load_config
from piper_sim.errors import ConfigError, PiperError
from piper_sim.profile_choice import choose_profile
from piper_sim.result import RunResult
from piper_sim.simulator import simulate

CASE_KEYS = {"description", "config", "testbed", "tolerance", "pair", "measures"}
# a topology file's default cost profile prices predictions only: a real run does not depend on it
_PREDICTION_ONLY_LINE = re.compile(rb"^device_profile:[^\n]*\n", re.MULTILINE)


@dataclass(frozen=True, kw_only=True)
class Case:
    name: str
    path: Path
    description: str
    config: dict
    testbed: str | None  # topology file the real run used for its emulated cluster, None = plain local ranks
    tolerance: float
    pair: str

    @property
    def measured(self) -> Path:
        return self.path / "measured"


def load_case(path: Path) -> Case:
    raw = yaml.safe_load((path / "case.yaml").read_text())
    bad = sorted(set(raw) - CASE_KEYS)
    if bad:
        raise ConfigError(f"{path.name}/case.yaml: {bad[0]}", raw[bad[0]], f"one of {', '.join(sorted(CASE_KEYS))}")
    return Case(
        name=path.name,
        path=path,
        description=raw.get("description", ""),
        config=raw["config"],
        testbed=raw.get("testbed"),
        tolerance=float(raw.get("tolerance", {}).get("step_time", 0.2)),
        pair=str(raw.get("pair", "")),
    )


def find_cases(names: list[str], root: Path) -> list[Case]:
    if not names:
        dirs = sorted(p for p in root.iterdir() if (p / "case.yaml").exists())
    else:
        dirs = [Path(n) if Path(n).exists() else root / n for n in names]
        missing = [str(d) for d in dirs if not (d / "case.yaml").exists()]
        if missing:
            raise PiperError(f"validate: no case.yaml in {', '.join(missing)}; cases are in {root}")
    return [load_case(d) for d in dirs]


def case_digest(case: Case) -> str:
    """A short hash of what a real run of the case depends on: its config, the topology files it names and the
    revision of the backend's all-to-all where it has changed (REAL_RUN_REVISION); a topology file's
    device_profile line, which prices predictions only, is left out. measured.json records it;
    validate refuses a measurement whose case has changed since."""
    digest = hashlib.sha256(json.dumps(case.config, sort_keys=True).encode())
    for rel in sorted({case.testbed, case.config.get("topology")} - {None}):
        if isinstance(rel, str) and rel.endswith(".yaml") and (case.path / rel).exists():
            digest.update(_PREDICTION_ONLY_LINE.sub(b"", (case.path / rel).read_bytes()))
    collectives = case.config.get("collectives")
    algorithm = collectives.get("all_to_all") if isinstance(collectives, dict) else None
    if algorithm in REAL_RUN_REVISION:  # the backend's implementation of it changed since its first revision
        digest.update(f"{algorithm} revision {REAL_RUN_REVISION[algorithm]}".encode())
    return digest.hexdigest()[:16]


def case_config(case: Case) -> dict:
    """A copy of the case's raw config with a topology file named relative to the case made absolute."""
    raw = json.loads(json.dumps(case.config))
    if isinstance(raw.get("topology"), str) and raw["topology"].endswith(".yaml"):
        raw["topology"] = str((case.path / raw["topology"]).resolve())
    return raw


def check_case_profile(case: Case, profile: str | dict) -> None:
    """A profile of other devices than the case's machine's is refused before anything is measured or predicted
    (piper_sim.profile_choice; a case asks for another with cost.allow_device_mismatch)."""
    raw = case_config(case)
    cost = raw.get("cost") if isinstance(raw.get("cost"), dict) else {}
    choose_profile(
        raw.get("topology", DEFAULTS["topology"]), profile, allow_mismatch=cost.get("allow_device_mismatch") is True
    )


def prediction_config(case: Case, profile: str | dict) -> Config:
    """The case's config priced by the profile, replaying the measured run's routing decisions."""
    raw = case_config(case)
    raw["cost"] = {**raw.get("cost", {}), "profile": profile}
    if (case.measured / "routing.npz").exists():
        raw["routing"] = {"kind": "trace", "path": str(case.measured / "routing.npz")}
    return load_config(raw)


def predict_case(case: Case, profile: str | dict) -> RunResult:
    """Simulate the case from the profile (prediction_config)."""
    return simulate(prediction_config(case, profile))
