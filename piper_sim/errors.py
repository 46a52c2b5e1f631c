"""The one error type users see. The CLI prints it without a traceback and exits non-zero.

A ConfigError shows the bad value in a short form (at most SHORT_VALUE_CHARS characters, nested values
abbreviated), so that a huge or aliased value is echoed as one short line.
"""

from __future__ import annotations

import difflib
import reprlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

SHORT_VALUE_CHARS = 120
_SHORT = reprlib.Repr()
for _name, _limit in (
    ("maxlevel", 2),
    ("maxdict", 4),
    ("maxlist", 6),
    ("maxtuple", 6),
    ("maxset", 6),
    ("maxstring", 80),
    ("maxlong", 40),
    ("maxother", 80),
):
    setattr(_SHORT, _name, _limit)


def short_repr(value: object) -> str:
    """repr(value), abbreviated: nested levels, long containers, long strings and huge integers cut."""
    text = _SHORT.repr(value)
    return text if len(text) <= SHORT_VALUE_CHARS else text[: SHORT_VALUE_CHARS - 3] + "..."


ONE_OF_CHARS = 200  # a list of allowed names longer than this is cut to the closest names and the first few


def one_of(names: Iterable[str], given: str | None = None) -> str:
    """What an unknown name may be: "one of a, b, c"; a long list shows the names closest to the given one
    and the first few, so the error stays one readable line."""
    names = sorted(names)
    text = ", ".join(names)
    if len(text) <= ONE_OF_CHARS:
        return f"one of {text}"
    close = difflib.get_close_matches(given, names, n=3, cutoff=0.4) if given else []
    head = names[:10]
    hint = f"closest to {given!r}: {', '.join(close)}; " if close else ""
    return f"one of {len(names)} names ({hint}{', '.join(head)} and {len(names) - len(head)} more)"


class PiperError(Exception):
    """A user-facing error: bad config, bad file, impossible plan."""


class ConfigError(PiperError):
    """A configuration value is wrong: names the key, the bad value and what is allowed."""

    def __init__(self, key: str, value: object, allowed: str) -> None:
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(key, value, allowed)  # args rebuild the error (simpy re-raises type(e)(*e.args); pickle)

    def __str__(self) -> str:
        return f"{self.key}: got {short_repr(self.value)}; allowed: {' '.join(str(self.allowed).split())}"


@contextmanager
def named_by(option: str) -> Iterator[None]:
    """Report a ConfigError raised inside under the command-line option the value came from:
    `--grid parallel.pp: got 0; ...` rather than the internal key alone."""
    try:
        yield
    except ConfigError as exc:
        key = exc.key if exc.key.startswith(option) else f"{option} {exc.key}".strip()
        raise ConfigError(key, exc.value, exc.allowed) from None
