"""Results of long runs (plan refinement, sweeps, scaling studies, reproduce, the studies), one file per point.

Owns ResultStore: one JSON file per finished point under DIR/points/<digest>.json, written atomically (a
temporary file, then a rename) the moment the point finishes, so an interrupted run loses nothing finished and
its rerun recomputes nothing finished. The file is named by the point's digest (point_digest: its payload as
canonical JSON, so the same point under another name or key order is the same file) and holds the row with the
key it was computed under (points.keys.point_key: the payload, the content of every file the point reads and
the code version) and the sha256 of the row. A stored row is reused only under the point's key now; one stored
under another key is stale and is recomputed. A file that is not such a record (torn, not UTF-8 JSON, a row that
is not a non-empty mapping or does not match its sha256: damaged or edited on disk) is unreadable and is recomputed,
never a traceback or a row of blanks. The store counts what it reused, found stale or unreadable and had computed
(Tally).
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


def row_digest(row: dict) -> str:
    """sha256 of a row as canonical JSON: what a stored row is checked against when it is read back."""
    return hashlib.sha256(json.dumps(row, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass
class Tally:
    """What a run did with its points: reused from the store, found stored under another key, found unreadable,
    computed."""

    reused: int = 0
    stale: int = 0
    unreadable: int = 0
    computed: int = 0

    def lines(self, label: str) -> list[str]:
        stored = self.reused + self.stale + self.unreadable
        out = [f"{label}: reused {self.reused} of {stored} stored points; computed {self.computed}"]
        for count, why in ((self.stale, "made with other inputs or code"), (self.unreadable, "unreadable")):
            if count:
                were, are = ("were", "are") if count != 1 else ("was", "is")
                out.append(
                    f"{label}: {count} stored point{'s' if count != 1 else ''} {were} {why} and {are} recomputed"
                )
        return out

    def as_dict(self) -> dict[str, int]:
        return {"reused": self.reused, "stale": self.stale, "unreadable": self.unreadable, "computed": self.computed}


class ResultStore:
    def __init__(self, root: Path) -> None:
        self.dir = Path(root) / "points"
        self.tally = Tally()

    def _path(self, digest: str) -> Path:
        return self.dir / f"{digest}.json"

    def get(self, digest: str, key: str) -> dict | None:
        """The row stored for this point under this key (counted reused), else None (counted stale where a row
        is stored under another key, unreadable where the file is no record). Ask once per point and run."""
        path = self._path(digest)
        if not path.exists():
            return None
        record = _read_record(path)
        if record is None:
            self.tally.unreadable += 1
            return None
        if record["key"] != key:
            self.tally.stale += 1
            return None
        self.tally.reused += 1
        return record["row"]

    def put(self, digest: str, key: str, row: dict) -> None:
        plain = json.loads(json.dumps(row, default=_json_default))  # the row as it will read back
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            tmp = self.dir / f".{digest}.{os.getpid()}.tmp"
            tmp.write_text(json.dumps({"key": key, "row": plain, "row_sha256": row_digest(plain)}))
            os.replace(tmp, self._path(digest))
        except OSError as exc:
            raise PiperError(f"--out {self.dir.parent}: cannot write results ({exc.strerror})") from None
        self.tally.computed += 1


def _read_record(path: Path) -> dict | None:
    """A stored point's {key, row, row_sha256}, or None where the file is not one (put writes a whole record
    by an atomic rename, so this is a file damaged or edited on disk)."""
    try:
        record = json.loads(path.read_bytes().decode())
    except (OSError, ValueError, RecursionError):  # unreadable, not UTF-8, not JSON, nested too deep
        return None
    if not (
        isinstance(record, dict)
        and isinstance(record.get("key"), str)
        and isinstance(record.get("row"), dict)
        and record["row"]
        and record.get("row_sha256") == row_digest(record["row"])
    ):
        return None
    return record


def _json_default(value: object) -> object:
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)
