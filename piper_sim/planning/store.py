"""Results of long runs (plan refinement, sweeps, scaling studies, reproduce, the studies), one file per point.

Owns ResultStore: one JSON file per finished point under DIR/points/<digest>.json, written atomically (a
temporary file, then a rename) the moment the point finishes, so an interrupted run loses nothing finished and
its rerun recomputes nothing finished. The file is named by the point's digest (point_digest: its payload as
canonical JSON, so the same point under another name or key order is the same file) and holds the row with the
key it was computed under (planning.keys.point_key: the payload, the content of every file the point reads and
the code version). A stored row is reused only under the point's key now; one stored under another key is
stale and is recomputed. The store counts what it reused, found stale and had computed (Tally).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from piper_sim.errors import PiperError


def point_digest(resolved: dict) -> str:
    """The name of a point in the store: sha256 of its payload as canonical JSON (16 hex digits)."""
    text = json.dumps(resolved, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class Tally:
    """What a run did with its points: reused from the store, found stored under another key, computed."""
    reused: int = 0
    stale: int = 0
    computed: int = 0

    def lines(self, label: str) -> list[str]:
        out = [f"{label}: reused {self.reused} of {self.reused + self.stale} stored points; computed {self.computed}"]
        if self.stale:
            out.append(f"{label}: {self.stale} stored point{'s were' if self.stale != 1 else ' was'} made with other "
                       "inputs or code and " + ("are" if self.stale != 1 else "is") + " recomputed")
        return out

    def as_dict(self) -> dict[str, int]:
        return {"reused": self.reused, "stale": self.stale, "computed": self.computed}


class ResultStore:
    def __init__(self, root: Path) -> None:
        self.dir = Path(root) / "points"
        self.tally = Tally()

    def _path(self, digest: str) -> Path:
        return self.dir / f"{digest}.json"

    def get(self, digest: str, key: str) -> dict | None:
        """The row stored for this point under this key (counted reused), else None (counted stale where a row
        is stored under another key). Ask once per point and run."""
        path = self._path(digest)
        if not path.exists():
            return None
        try:
            record = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):  # a torn file cannot come from put (rename is atomic); redo it
            return None
        if not isinstance(record, dict) or record.get("key") != key or not isinstance(record.get("row"), dict):
            self.tally.stale += 1
            return None
        self.tally.reused += 1
        return record["row"]

    def put(self, digest: str, key: str, row: dict) -> None:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            tmp = self.dir / f".{digest}.{os.getpid()}.tmp"
            tmp.write_text(json.dumps({"key": key, "row": row}, default=_json_default))
            os.replace(tmp, self._path(digest))
        except OSError as exc:
            raise PiperError(f"--out {self.dir.parent}: cannot write results ({exc.strerror})") from None
        self.tally.computed += 1


def _json_default(value: object) -> object:
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)
