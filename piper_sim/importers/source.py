"""What an importer reads: a launch line's flags or a TOML file's keys, each read once and remembered.

Owns turning `--flag v1 v2`, `--flag=v` and bare switches (Megatron-LM's and torchrun's) or a TOML table's
dotted keys into typed values, with one ConfigError naming the user's flag or key, and listing every flag or key
the translation did not read, so that none is dropped silently. No I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from piper_sim.bounds import INT_LIMIT, read_int, read_number
from piper_sim.errors import ConfigError

REQUIRED = object()  # a default that makes the flag or key required
SWITCH = True  # a flag given without a value
_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")


class Source:
    """Values by name (a flag without its dashes, or a dotted TOML key), read with a type; `key(name)` is how the
    user wrote it (`--num-layers`, `parallelism.tensor_parallel_degree`)."""

    def __init__(self, values: dict[str, Any], spelled: dict[str, str], what: str, prefix: str = "") -> None:
        self._values, self._spelled, self.what, self._prefix = values, spelled, what, prefix
        self._read: set[str] = set()

    def key(self, name: str) -> str:
        return self._spelled.get(name, f"{self._prefix}{name}")

    def given(self, name: str) -> bool:
        return name in self._values

    def peek(self, name: str) -> Any:
        """The value as given, or None, not marked read."""
        return self._values.get(name)

    def get(self, name: str, default: Any = None) -> Any:
        """The value as given (marked read), or default; REQUIRED makes a missing one an error."""
        if name not in self._values:
            if default is REQUIRED:
                raise ConfigError(self.key(name), None, f"required: {self.what} must give it")
            return default
        self._read.add(name)
        return self._values[name]

    def integer(self, name: str, default: Any = REQUIRED, *, low: int = 1, limit: int = INT_LIMIT) -> Any:
        if not self.given(name):
            return self.get(name, default)
        value = self.get(name)
        if isinstance(value, str) and value.strip().lstrip("-").isdigit() and len(value) < 20:
            value = int(value)
        return read_int(self.key(name), value, low=low, limit=limit)

    def number(self, name: str, default: float, *, high: float = 1.0) -> float:
        value = self.get(name, default)
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                pass
        return read_number(self.key(name), value, high=high)

    def switch(self, name: str) -> bool:
        """A store_true flag (or a TOML boolean): present without a value, or true/false spelled out."""
        value = self.get(name, False)
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in _TRUE + _FALSE:
            return value.lower() in _TRUE
        raise ConfigError(self.key(name), value, "true or false (or the flag alone)")

    def text(self, name: str, default: str | None = None, choices: tuple[str, ...] = ()) -> str | None:
        value = self.get(name, default)
        if value is None:
            return None
        if not isinstance(value, str) or (choices and value not in choices):
            raise ConfigError(self.key(name), value, f"one of {', '.join(choices)}" if choices else "one word")
        return value

    def words(self, name: str) -> list[str] | None:
        value = self.get(name, None)
        if value is None:
            return None
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
            raise ConfigError(self.key(name), value, "a list of words")
        return items

    def unread(self) -> list[str]:
        """Each flag or key the translation did not read, with its value as given."""
        return [_shown(self.key(name), value) for name, value in self._values.items() if name not in self._read]


def _shown(key: str, value: Any) -> str:
    if value is SWITCH and key.startswith("-"):
        return key
    if isinstance(value, list) and key.startswith("-"):
        return " ".join([key, *map(str, value)])
    return f"{key} {value}" if key.startswith("-") else f"{key} = {value!r}"


def flag_source(argv: list[str], what: str) -> tuple[Source, list[str]]:
    """A launch line's flags (`--name v`, `--name=v`, `--name v1 v2`, `--name`) and the words before the first flag
    (the launcher: `torchrun`) and the script (`pretrain_gpt.py`, a word ending in .py). A flag's name
    is read with `_` as `-` (torchrun spells `--nproc_per_node`); a repeated flag keeps its last value, as argparse."""
    values: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    loose: list[str] = []
    current: str | None = None
    for token in argv:
        if token.startswith("--") and len(token) > 2:
            text, eq, value = token[2:].partition("=")
            name = text.replace("_", "-")
            spelled[name], values[name] = f"--{text}", value if eq else SWITCH
            current = None if eq else name
        elif current is None or token.endswith(".py"):  # the script a launcher runs is no flag's value
            loose.append(token)
            current = None
        else:
            held = values[current]
            values[current] = token if held is SWITCH else [*held, token] if isinstance(held, list) else [held, token]
    return Source(values, spelled, what, "--"), loose


def table_source(data: Mapping[str, Any], what: str) -> Source:
    """A TOML document's values by dotted key (`parallelism.tensor_parallel_degree`); tables nest, lists stay."""
    values: dict[str, Any] = {}
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        prefix, node = stack.pop()
        for key, value in node.items():
            dotted = f"{prefix}{key}"
            if isinstance(value, Mapping):
                stack.append((f"{dotted}.", value))
            else:
                values[dotted] = value
    return Source(values, {}, what)
