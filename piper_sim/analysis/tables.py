"""The one style of every table piper-sim prints for a person: a header row whose labels carry their unit, a rule,
then rows; numbers right-aligned in fixed point (never scientific, thousands separated, -0.0 shown as 0.0), text
left-aligned, a missing value as "-".

A Col names its data key, its label and its unit. Units with a fixed scale convert the stored SI value (a
fraction to %, bytes to GiB, bytes/s to GB/s); "time" (seconds) and "bytes" pick one unit per column by its
largest value (us, ms or s; B, KiB, MiB or GiB) and "si" picks an SI prefix (FLOPs, parameters), so each column's
numbers are read in the unit its header names. The files written beside a table (CSV, parquet) keep the raw
values: tables are for reading, the files are data.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# unit -> (symbol in the header, factor applied to the stored value, decimals)
FIXED = {
    "%": ("%", 100.0, 1),
    "GiB": ("GiB", 2.0**-30, 2),
    "GB/s": ("GB/s", 1e-9, 1),
    "TFLOPS": ("TFLOPS", 1.0, 1),
    "x": ("x", 1.0, 2),
    "count": ("", 1.0, 0),
    "num": ("", 1.0, 2),
}
TIME_UNITS = (("us", 1e-6), ("ms", 1e-3), ("s", 1.0))
BYTE_UNITS = (("B", 1.0), ("KiB", 2.0**10), ("MiB", 2.0**20), ("GiB", 2.0**30), ("TiB", 2.0**40))
MAX_DIGITS = 6
SI_PREFIXES = (("", 1.0), ("k", 1e3), ("M", 1e6), ("G", 1e9), ("T", 1e12), ("P", 1e15), ("E", 1e18))


@dataclass(frozen=True)
class Col:
    """One column: key in the rows, label (the unit is appended), unit (FIXED, "time", "bytes", "si", "text" or
    "yes/no"), si_symbol (what an "si" column counts, e.g. "FLOP"), digits (decimals; None: the unit's)."""

    key: str
    label: str
    unit: str = "text"
    si_symbol: str = ""
    digits: int | None = None
    signed: bool = False  # "+" before positive numbers (errors, differences)


def fixed(value: float, digits: int, signed: bool = False) -> str:
    """value in fixed point with thousands separators; a value that rounds to zero has no sign; signed: "+" before
    a positive value."""
    text = f"{value:,.{digits}f}"
    zero = not any(c in "123456789" for c in text)
    if zero:
        return text.lstrip("-")
    return f"+{text}" if signed and value > 0 else text


def percent(fraction: float, digits: int = 1) -> str:
    """A fraction as a percentage, e.g. 0.1234 -> "12.3 %" (-0.0 -> "0.0 %")."""
    return f"{fixed(fraction * 100, digits)} %"


def _finite(values: Iterable[object]) -> list[float]:
    return [abs(float(v)) for v in values if _is_number(v) and math.isfinite(float(v))]


def _is_bool(value: object) -> bool:
    return type(value).__name__ in ("bool", "bool_")


def _is_number(value: object) -> bool:
    """An int or float, numpy's included; not a bool."""
    return isinstance(value, numbers.Real) and not _is_bool(value)


def scaled_unit(units: Sequence[tuple[str, float]], largest: float) -> tuple[str, float]:
    """The largest unit in which `largest` is at least 1 (the smallest unit for 0): (symbol, size)."""
    chosen = units[0]
    for unit in units:
        if largest >= unit[1]:
            chosen = unit
    return chosen


def time_unit(largest_s: float) -> tuple[str, float]:
    """us, ms or s for times up to largest_s: the one its value reads 1 to 999 in (s beyond)."""
    return scaled_unit(TIME_UNITS, largest_s)


def _unit(col: Col, values: list[object]) -> tuple[str, float, int]:
    """(header symbol, divisor, decimals) of a numeric column."""
    largest = max(_finite(values), default=0.0)
    if col.unit in FIXED:
        symbol, factor, digits = FIXED[col.unit]
        if 1e-4 <= largest * factor < 1 and col.unit != "count":  # small values keep two significant digits
            digits = max(digits, min(MAX_DIGITS, math.ceil(-math.log10(largest * factor)) + 1))
        return symbol, 1.0 / factor, digits if col.digits is None else col.digits
    units = {"time": TIME_UNITS, "bytes": BYTE_UNITS}.get(col.unit)
    if units is not None:
        symbol, size = scaled_unit(units, largest)
    elif col.unit == "si":
        prefix, size = scaled_unit(SI_PREFIXES, largest)
        symbol = prefix + col.si_symbol
    else:
        raise ValueError(f"unknown table unit {col.unit!r}")
    digits = 3 if largest / size < 10 else 2 if largest / size < 100 else 1
    return symbol, size, digits if col.digits is None else col.digits


def _cell(value: object, unit: str, divisor: float, digits: int, signed: bool = False) -> str:
    if value is None or (_is_number(value) and not math.isfinite(float(value))):
        return "-"
    if unit == "yes/no" or _is_bool(value):
        return "yes" if value else "no"
    if unit == "text" or not _is_number(value):
        return str(value)
    return fixed(float(value) / divisor, digits, signed)


def _names_unit(label: str, symbol: str) -> bool:
    """Whether a label already names its unit as a word ("TFLOPS/GPU", "tokens/s" with "TFLOPS", "tokens/s")."""
    return symbol in label.split() or label.split("/")[0] == symbol or label == symbol


def render(rows: Sequence[dict], columns: Sequence[Col]) -> str:
    """The table of rows (dicts, e.g. DataFrame.to_dict("records")) over the columns their rows have."""
    columns = [c for c in columns if any(c.key in r for r in rows)] if rows else list(columns)
    header, body, right = [], [[] for _ in rows], []
    for col in columns:
        values = [r.get(col.key) for r in rows]
        numeric = col.unit not in ("text", "yes/no")
        symbol, divisor, digits = _unit(col, values) if numeric else ("", 1.0, 0)
        header.append(f"{col.label} ({symbol})" if symbol and not _names_unit(col.label, symbol) else col.label)
        for cells, value in zip(body, values, strict=True):
            cells.append(_cell(value, col.unit, divisor, digits, col.signed))
        right.append(numeric)
    widths = [max([len(h)] + [len(cells[i]) for cells in body]) for i, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right, strict=True)).rstrip()

    return "\n".join([line(header), "  ".join("-" * w for w in widths)] + [line(cells) for cells in body])


def render_frame(frame: object, columns: Sequence[Col], max_rows: int | None = None) -> str:
    """render() of a pandas DataFrame's rows (the first max_rows, with a line saying how many were left out)."""
    rows = frame.to_dict("records")  # type: ignore[attr-defined]
    if max_rows is None or len(rows) <= max_rows:
        return render(rows, columns)
    return render(rows[:max_rows], columns) + f"\n... {len(rows) - max_rows} more rows in the files written"
