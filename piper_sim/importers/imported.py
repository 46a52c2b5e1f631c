"""An imported config and what the import said about it: notes, approximations, and every flag or key it did not
translate, written as comments at the top of the YAML and said on stderr (docs/importing.md).

Owns the bookkeeping common to the importers: refusing what piper-sim cannot express (or, with --lenient, taking a
documented approximation and saying so), and the YAML text. No I/O.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import yaml

from piper_sim.errors import ConfigError

COMMENT_WIDTH = 118


class Translation:
    """The notes of one import; `refuse` raises for what piper-sim cannot express unless the import is lenient."""

    def __init__(self, lenient: bool) -> None:
        self.lenient = lenient
        self.notes: list[str] = []

    def note(self, text: str) -> None:
        self.notes.append(text)

    def refuse(self, key: str, value: object, allowed: str, approximation: str) -> None:
        """key's value is beyond piper-sim: one ConfigError naming it and what is allowed, or under --lenient the
        approximation, noted."""
        if not self.lenient:
            raise ConfigError(key, value, f"{allowed}; or import with --lenient, which {approximation}")
        self.notes.append(
            f"approximated (--lenient): {key} {value}: the import {approximation} (piper-sim allows {allowed})"
        )


@dataclass(frozen=True)
class Imported:
    """A piper-sim config (sections as load_config takes them) and what its import said."""

    config: dict
    source: str  # what it was imported from, for the header
    notes: list[str] = field(default_factory=list)
    not_translated: list[str] = field(default_factory=list)  # flags or keys that change a real run, not modelled
    no_bearing: list[str] = field(default_factory=list)  # flags or keys with no bearing on time or memory

    def messages(self) -> list[str]:
        """One line each: the notes, then the flags or keys left untranslated."""
        lines = list(self.notes)
        if self.not_translated:
            lines.append(
                f"not translated (piper-sim does not model them, or the importer does not know them): "
                f"{'; '.join(self.not_translated)}"
            )
        if self.no_bearing:
            lines.append(f"not translated (no bearing on a step's time or memory): {'; '.join(self.no_bearing)}")
        return lines

    def yaml_text(self) -> str:
        """The config as YAML under a comment header that says where it came from and every message."""
        header = [f"piper-sim config imported from {self.source} (piper-sim import; docs/importing.md)."]
        header += [f"- {line}" for line in self.messages()]
        comments = [
            f"# {wrapped}"
            for line in header
            for wrapped in textwrap.wrap(line, COMMENT_WIDTH, subsequent_indent="  ", break_on_hyphens=False)
        ]
        return "\n".join(comments) + "\n" + yaml.safe_dump(self.config, sort_keys=False)


def split_unread(unread: list[str], no_bearing: Callable[[str], bool]) -> tuple[list[str], list[str]]:
    """(not translated, no bearing) of the flags or keys an import did not read."""
    return [u for u in unread if not no_bearing(u)], [u for u in unread if no_bearing(u)]


@contextmanager
def config_keys_as(names: dict[str, str]) -> Iterator[None]:
    """A ConfigError on an imported config's key names the user's flag or key beside it (`--num-experts
    (model.num_experts)`), where names has one for it."""
    try:
        yield
    except ConfigError as exc:
        name = names.get(exc.key)
        if name is None:
            raise
        raise ConfigError(f"{name} ({exc.key})", exc.value, exc.allowed) from None
