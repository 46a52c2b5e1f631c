"""Small name -> object registries (schedules, collective algorithms, routing models, topology builders)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from piper_sim.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """A dict of named entries with a decorator to add one; a miss lists the valid names."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def add(obj: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.what} {name!r} registered twice")
            self._entries[name] = obj
            return obj

        return add

    def get(self, name: str, key: str | None = None) -> T:
        if not isinstance(name, str) or name not in self._entries:
            raise ConfigError(key or self.what, name, f"one of {', '.join(sorted(self._entries))}")
        return self._entries[name]

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._entries
