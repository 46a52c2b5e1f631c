"""Model presets and the `model:` config section: preset name, mapping, YAML or HF config.json -> ModelSpec.

Owns turning user input into a validated ModelSpec: preset lookup (YAML files under ./presets), key and
type checks with errors that name the key, and `preset: name` plus overrides. Must not import simpy,
torch or anything under sim/. Parameter formulas live in model.py; HF translation in hf_import.py.
"""

from __future__ import annotations

import json
import os
import typing
from collections.abc import Mapping
from dataclasses import MISSING, asdict, fields
from functools import cache
from pathlib import Path
from typing import Any

from piper_sim.bounds import MODEL_LIMITS, model_limit, read_int
from piper_sim.errors import ConfigError, one_of
from piper_sim.units import is_finite_number
from piper_sim.workload.hf_import import model_from_hf_config
from piper_sim.workload.model import MLASpec, ModelSpec, mla_field_names, model_field_names
from piper_sim.yamlio import read_yaml

PRESET_DIR = Path(__file__).parent / "presets"
PRESET_KEY = "preset"
# Keys whose change leaves the parameter count alone; overriding anything else drops published_* figures.
_NON_STRUCTURAL = {"name", "seq_len", "dtype", "rotary", "source", "published_params", "published_active_params"}
_FILE_SUFFIXES = (".yaml", ".yml", ".json")
FIELD_LIMITS = MODEL_LIMITS  # the bounds of a model's integer fields (bounds.py), by field name


class _Missing:
    def __repr__(self) -> str:
        return "nothing (key missing)"


_MISSING_VALUE = _Missing()


def list_presets() -> list[str]:
    """Names of the shipped model presets (file stems under presets/)."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def load_model(spec: str | os.PathLike[str] | Mapping[str, Any] | ModelSpec, key: str = "model") -> ModelSpec:
    """Resolve a `model:` config value: a preset name, a mapping, or a path to a .yaml / HF config.json."""
    if isinstance(spec, ModelSpec):
        return spec
    if isinstance(spec, Mapping):
        return model_from_mapping(spec, key=key)
    if isinstance(spec, str | os.PathLike):
        text = os.fspath(spec)
        if text in list_presets():
            return _load_preset(text)
        path = model_file(text)
        if path is not None:
            return load_model_file(path, key=key)
        raise ConfigError(
            key, text, f"a preset name (one of {', '.join(list_presets())}) or a path to a .yaml file or HF config.json"
        )
    raise ConfigError(key, spec, "a preset name, a mapping of ModelSpec fields, or a file path")


def model_file(text: str) -> Path | None:
    """The file a model named by `text` is read from: a preset's YAML or the path given; None when `text` is
    neither a preset's name nor a path."""
    if text in list_presets():
        return PRESET_DIR / f"{text}.yaml"
    if text.endswith(_FILE_SUFFIXES) or os.sep in text or "/" in text:
        return Path(text)
    return None


def load_model_file(path: Path, key: str = "model") -> ModelSpec:
    """Read a YAML mapping of ModelSpec fields, or a JSON file (HF config.json when it has model_type)."""
    if not path.is_file():
        raise ConfigError(key, str(path), "an existing .yaml file or HF config.json")
    if path.suffix == ".json":
        try:
            data = json.loads(path.read_bytes().decode("utf-8"))
        except (OSError, ValueError, RecursionError) as exc:
            raise ConfigError(key, str(path), f"a readable JSON file ({' '.join(str(exc).split())[:120]})") from None
    else:
        data = read_yaml(path, key)
    if not isinstance(data, Mapping):
        raise ConfigError(key, str(path), "a file holding a mapping")
    if "model_type" in data:
        name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
        return model_from_hf_config(data, name or "hf-model")
    return model_from_mapping(data, key=key, default_name=path.stem)


@cache
def _load_preset(name: str) -> ModelSpec:
    return load_model_file(PRESET_DIR / f"{name}.yaml", key=f"model (preset {name})")


def model_from_mapping(data: Mapping[str, Any], key: str = "model", default_name: str = "custom") -> ModelSpec:
    """Build a ModelSpec from a mapping of its fields; `preset: name` starts from a preset (or file)."""
    if "model_type" in data and PRESET_KEY not in data:
        return model_from_hf_config(data, str(data.get("name") or data.get("model_type")))
    overrides = dict(data)
    values: dict[str, Any] = {"name": default_name}
    if PRESET_KEY in overrides:
        base_ref = overrides.pop(PRESET_KEY)
        if not isinstance(base_ref, str):
            raise ConfigError(f"{key}.{PRESET_KEY}", base_ref, "a preset name or a file path")
        if base_ref not in list_presets() and not base_ref.endswith(_FILE_SUFFIXES):
            raise ConfigError(f"{key}.{PRESET_KEY}", base_ref, f"one of {', '.join(list_presets())}")
        values = spec_to_mapping(load_model(base_ref, key=f"{key}.{PRESET_KEY}"))
        if set(overrides) - _NON_STRUCTURAL and not {"published_params", "published_active_params"} & set(overrides):
            values.update(
                published_params=0.0, published_active_params=0.0, source=f"{values['source']} (with overrides)".strip()
            )
    _check_keys(overrides, model_field_names(), key)
    if isinstance(overrides.get("mla"), Mapping) and isinstance(values.get("mla"), Mapping):
        overrides["mla"] = {**values["mla"], **overrides["mla"]}  # partial MLA override
    values.update(overrides)
    return _build_spec(values, key)


def spec_to_mapping(spec: ModelSpec) -> dict[str, Any]:
    """The inverse of model_from_mapping: plain YAML-ready values (mla as a nested mapping or None)."""
    return asdict(spec)


def _check_keys(data: Mapping[str, Any], allowed: set[str], key: str) -> None:
    for name in data:
        if name not in allowed:
            raise ConfigError(f"{key}.{name}", data[name], one_of(allowed, str(name)))


def _build_spec(values: Mapping[str, Any], key: str) -> ModelSpec:
    hints = typing.get_type_hints(ModelSpec)
    kwargs: dict[str, Any] = {}
    for f in fields(ModelSpec):
        if f.name not in values:
            if f.default is MISSING:
                raise ConfigError(f"{key}.{f.name}", _MISSING_VALUE, f"required: {_describe(hints[f.name])}")
            continue
        if f.name == "mla":
            kwargs["mla"] = _build_mla(values["mla"], f"{key}.mla")
        else:
            kwargs[f.name] = _coerce(values[f.name], hints[f.name], f"{key}.{f.name}")
    return ModelSpec(**kwargs)


def _build_mla(value: Any, key: str) -> MLASpec | None:
    if value is None or isinstance(value, MLASpec):
        return value
    if not isinstance(value, Mapping):
        raise ConfigError(key, value, "a mapping of MLA ranks (or null)")
    _check_keys(value, mla_field_names(), key)
    hints = typing.get_type_hints(MLASpec)
    kwargs: dict[str, Any] = {}
    for f in fields(MLASpec):
        if f.name in value:
            v = 0 if f.name == "q_lora_rank" and value[f.name] is None else value[f.name]
            kwargs[f.name] = _coerce(v, hints[f.name], f"{key}.{f.name}")
            if kwargs[f.name] < 0 or (kwargs[f.name] == 0 and f.name != "q_lora_rank"):
                raise ConfigError(f"{key}.{f.name}", v, "a positive integer")
        elif f.default is MISSING:
            raise ConfigError(f"{key}.{f.name}", _MISSING_VALUE, "required: a positive integer")
    return MLASpec(**kwargs)


def _describe(kind: Any) -> str:
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(kind, str(kind))


def _coerce(value: Any, kind: Any, key: str) -> Any:
    """Check a scalar against its annotated type; floats also accept ints and numeric strings
    (PyYAML reads `46.7e9` without a dot-and-sign exponent as a string)."""
    if kind is bool:
        if isinstance(value, bool):
            return value
    elif kind is int:  # ModelSpec checks which ints must be positive; none may be negative
        if isinstance(value, int) and not isinstance(value, bool):
            return read_int(key, value, limit=model_limit(key.rpartition(".")[2]))
    elif kind is float:
        number = value
        if isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                pass
        if is_finite_number(number):
            return float(number)
        if isinstance(number, float):
            raise ConfigError(key, value, "a finite number")
    elif kind is str:
        if isinstance(value, str):
            return value
    raise ConfigError(key, value, _describe(kind))
