"""The one error type users see. The CLI prints it without a traceback and exits non-zero."""

from __future__ import annotations


class PiperError(Exception):
    """A user-facing error: bad config, bad file, impossible plan."""


class ConfigError(PiperError):
    """A configuration value is wrong: names the key, the bad value and what is allowed."""

    def __init__(self, key: str, value: object, allowed: str) -> None:
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"{key}: got {value!r}; allowed: {allowed}")
