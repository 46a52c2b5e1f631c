"""Reading YAML that a user wrote (config files, --set values, topology and profile files): one ConfigError
naming the user's key for every way the text can be wrong.

A file that is missing, a folder, unreadable or not UTF-8; text that is not YAML (the error as one line: the
problem, its line and column); nesting deeper than MAX_DEPTH; more than MAX_VALUES values once aliases are
expanded (an alias bomb is refused before any reader walks it); a mapping key that is not a name (text): every
key of a config, topology, profile or model file names something, and a number or null among them would reach
readers that sort or compare names.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from piper_sim.errors import ConfigError

MAX_DEPTH = 64
MAX_VALUES = 1_000_000


def parse_yaml(text: str, key: str, source: str | None = None) -> object:
    """The value of YAML text; `source` names the file in errors (the text itself, abbreviated, when None)."""
    shown = source if source is not None else text
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(key, shown, f"valid YAML ({yaml_problem(exc)})") from None
    except RecursionError:
        raise ConfigError(key, shown, f"YAML nested at most {MAX_DEPTH} levels deep") from None
    check_shape(data, key, shown)
    return data


def read_yaml(path: str | Path, key: str) -> object:
    """The value of a YAML file named by the user under `key`."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(key, str(path), "an existing YAML file")
    if not path.is_file():
        raise ConfigError(key, str(path), "a YAML file (this is a folder or a device)")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(key, str(path), f"a UTF-8 text file (byte {exc.start} is not UTF-8)") from None
    except OSError as exc:
        raise ConfigError(key, str(path), f"a readable file ({exc.strerror})") from None
    return parse_yaml(text, key, str(path))


def yaml_problem(exc: yaml.YAMLError) -> str:
    """One line: what is wrong and where."""
    problem = getattr(exc, "problem", None) or getattr(exc, "context", None) or type(exc).__name__
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return " ".join(f"{problem}{where}".split())


def check_shape(data: object, key: str, shown: object) -> None:
    """Refuse nesting deeper than MAX_DEPTH, more than MAX_VALUES values (aliases counted each time they are
    used) and a mapping key that is not text (named by its dotted path below `key`), without recursion."""
    stack: list[tuple[object, int, str]] = [(data, 1, "")]
    values = 0
    while stack:
        node, depth, path = stack.pop()
        values += 1
        if values > MAX_VALUES:
            raise ConfigError(key, shown, f"at most {MAX_VALUES:,} values once YAML aliases are expanded")
        if depth > MAX_DEPTH:
            raise ConfigError(key, shown, f"YAML nested at most {MAX_DEPTH} levels deep")
        if isinstance(node, dict):
            for name, value in node.items():
                where = f"{path}.{name}" if path else str(name)
                if not isinstance(name, str):
                    raise ConfigError(_under(key, where), value, f"a key that is a name (text), not {name!r}")
                stack.append((value, depth + 1, where))
        elif isinstance(node, list):
            stack.extend((v, depth + 1, path) for v in node)


def _under(key: str, path: str) -> str:
    """The user's dotted key of a value at `path` inside what `key` names (a config file's keys are its own)."""
    return path if key == "config" else f"{key}.{path}"
