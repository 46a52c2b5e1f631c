"""The one error type users see. The CLI prints it without a traceback and exits non-zero.

A ConfigError shows the bad value in a short form (at most SHORT_VALUE_CHARS characters, nested values
abbreviated), so that a huge or aliased value is echoed as one short line.
"""

from __future__ import annotations

import reprlib
from collections.abc import Iterator
from contextlib import contextmanager

SHORT_VALUE_CHARS = 120
_SHORT = reprlib.Repr()
for _name, _limit in (("maxlevel", 2), ("maxdict", 4), ("maxlist", 6), ("maxtuple", 6), ("maxset", 6),
                      ("maxstring", 80), ("maxlong", 40), ("maxother", 80)):
    setattr(_SHORT, _name, _limit)


def short_repr(value: object) -> str:
    """repr(value), abbreviated: nested levels, long containers, long strings and huge integers cut."""
    text = _SHORT.repr(value)
    return text if len(text) <= SHORT_VALUE_CHARS else text[:SHORT_VALUE_CHARS - 3] + "..."


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
