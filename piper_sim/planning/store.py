"""Results of long runs (plan refinement, sweeps, scaling studies), keyed by a digest of the resolved point.

Owns ResultStore: one JSON file per finished point under DIR/points/, written atomically (a temporary file,
then a rename) the moment the point finishes, so an interrupted run loses nothing finished and its rerun
recomputes nothing finished. The digest is of the canonical JSON of the point's resolved config, so the
same point under another name or key order is the same result.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from piper_sim.errors import PiperError


def point_digest(resolved: dict) -> str:
    """The key of a point: sha256 of its resolved config as canonical JSON (16 hex digits)."""
    text = json.dumps(resolved, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class ResultStore:
    def __init__(self, root: Path) -> None:
        self.dir = Path(root) / "points"

    def _path(self, digest: str) -> Path:
        return self.dir / f"{digest}.json"

    def get(self, digest: str) -> dict | None:
        path = self._path(digest)
        if not path.exists():
            return None
        try:
            return json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):  # a torn file cannot come from put (rename is atomic); redo it
            return None

    def put(self, digest: str, row: dict) -> None:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            tmp = self.dir / f".{digest}.{os.getpid()}.tmp"
            tmp.write_text(json.dumps(row, default=_json_default))
            os.replace(tmp, self._path(digest))
        except OSError as exc:
            raise PiperError(f"--out {self.dir.parent}: cannot write results ({exc.strerror})") from None

    def done(self) -> set[str]:
        return {p.stem for p in self.dir.glob("*.json")} if self.dir.exists() else set()


def _json_default(value: object) -> object:
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)
