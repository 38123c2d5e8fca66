"""Build a `RunConfig` from a TOML/YAML file and `--section.key value` overrides.

Types come from the dataclass annotations, so a wrong type, an unknown key or a bad value is
rejected with a `ConfigError` that names the key before anything is built.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from asteria_core.compat import StrEnum, tomllib
from asteria_core.fields import plain_dict
from asteria_core.policy import PolicyError
from asteria_core.train.config import ConfigError, RunConfig


def sections() -> dict[str, type]:
    """{section name: its config class}, in the order of `RunConfig`."""
    hints = typing.get_type_hints(RunConfig)
    return {f.name: hints[f.name] for f in dataclasses.fields(RunConfig)}


def _field_types(section_cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(section_cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(section_cls)}


def _is_union(tp: Any) -> bool:
    return isinstance(tp, types.UnionType)


def _plain(tp: Any) -> Any:
    """A choice's enum is read as its plain string (the section checks it and holds the
    member)."""
    return str if isinstance(tp, type) and issubclass(tp, StrEnum) else tp


def type_name(tp: Any) -> str:
    tp = _plain(tp)
    if _is_union(tp):
        return " or ".join(type_name(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) is tuple:
        return "a list of " + ", ".join(type_name(a) for a in typing.get_args(tp))
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}[tp]


def _coerce(key: str, value: Any, tp: Any) -> Any:
    """Check a value read from a file (already typed by TOML/YAML) against a field type."""
    bad = ConfigError(f"{key}: got {value!r} ({type(value).__name__}); allowed: {type_name(tp)}")
    tp = _plain(tp)
    if _is_union(tp):  # the first member type that takes the value
        for member in typing.get_args(tp):
            try:
                return _coerce(key, value, member)
            except ConfigError:
                pass
        raise bad
    if typing.get_origin(tp) is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, list | tuple) or len(value) != len(args):
            raise bad
        pairs = enumerate(zip(value, args, strict=True))
        return tuple(_coerce(f"{key}[{i}]", v, a) for i, (v, a) in pairs)
    if tp is bool:
        if not isinstance(value, bool):
            raise bad
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise bad
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise bad
        return value
    raise TypeError(f"unsupported config field type {tp!r} for {key}")


def _parse_text(key: str, text: str, tp: Any) -> Any:
    """Parse a command-line string into a field's type."""
    tp = _plain(tp)
    if _is_union(tp):  # int | str: a number when it reads as one, else the text
        for member in typing.get_args(tp):
            try:
                return _parse_text(key, text, member)
            except ConfigError:
                pass
    if typing.get_origin(tp) is tuple:
        args = typing.get_args(tp)
        parts = [p.strip() for p in text.split(",")]
        if len(parts) != len(args):
            raise ConfigError(f"{key}: got {text!r}; allowed: {type_name(tp)} (comma-separated)")
        pairs = enumerate(zip(parts, args, strict=True))
        return tuple(_parse_text(f"{key}[{i}]", p, a) for i, (p, a) in pairs)
    if tp is str:
        return text
    if tp is bool:
        lowered = text.lower()
        if lowered in ("true", "1", "yes"):
            return True
        if lowered in ("false", "0", "no"):
            return False
    try:
        if tp is int:
            return int(text)
        if tp is float:
            return float(text)
    except ValueError:
        pass
    raise ConfigError(f"{key}: got {text!r}; allowed: {type_name(tp)}")


def _split_key(key: str) -> tuple[str, str, Any]:
    known = sections()
    section, _, name = key.partition(".")
    if section not in known:
        raise ConfigError(f"unknown config section {section!r} in {key!r}; allowed: "
                          + ", ".join(known))
    fields = _field_types(known[section])
    if name not in fields:
        raise ConfigError(f"unknown config key {key!r}; allowed in [{section}]: "
                          + ", ".join(fields))
    return section, name, fields[name]


def read_config_file(path: str | Path) -> dict[str, dict[str, Any]]:
    """Read a TOML or YAML file into {section: {key: value}} (values not yet validated)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--config: file {str(path)!r} does not exist")
    text = path.read_text()
    try:
        if path.suffix == ".toml":
            raw = tomllib.loads(text)
        elif path.suffix in (".yaml", ".yml"):
            raw = yaml.safe_load(text) or {}
        else:
            raise ConfigError(f"--config: {str(path)!r} must end in .toml, .yaml or .yml")
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as err:
        raise ConfigError(f"--config: {path} is not valid: {err}") from err
    if not isinstance(raw, dict):
        raise ConfigError(f"--config: {path} must hold a table of sections")
    out: dict[str, dict[str, Any]] = {}
    for section, values in raw.items():
        if not isinstance(values, dict):
            raise ConfigError(f"{section}: must be a table of keys, got {values!r}")
        for name, value in values.items():
            sec, key, tp = _split_key(f"{section}.{name}")
            out.setdefault(sec, {})[key] = _coerce(f"{sec}.{key}", value, tp)
    return out


def parse_overrides(pairs: list[tuple[str, str]]) -> dict[str, dict[str, Any]]:
    """Turn [("optim.lr", "3e-3"), ...] into {section: {key: typed value}}."""
    out: dict[str, dict[str, Any]] = {}
    for key, text in pairs:
        section, name, tp = _split_key(key)
        out.setdefault(section, {})[name] = _parse_text(key, text, tp)
    return out


def build_config(*layers: dict[str, dict[str, Any]]) -> RunConfig:
    """Merge layers (later wins) over the defaults and validate every section."""
    merged: dict[str, dict[str, Any]] = {}
    for layer in layers:
        for section, values in layer.items():
            merged.setdefault(section, {}).update(values)
    built = {}
    for name, cls in sections().items():
        try:
            built[name] = cls(**merged.get(name, {}))
        except PolicyError as err:  # policy fields name themselves without the section
            raise ConfigError(f"{name}.{err}") from err
    return RunConfig(**built)


def config_to_dict(config: RunConfig) -> dict[str, dict[str, Any]]:
    """Plain nested dict (tuples as lists), as written into checkpoints and the run store."""
    out = plain_dict(config)
    for values in out.values():
        for key, value in values.items():
            if isinstance(value, tuple):
                values[key] = list(value)
    return out


def config_from_dict(raw: dict[str, dict[str, Any]]) -> RunConfig:
    """Inverse of `config_to_dict`, with the same validation as a config file."""
    typed: dict[str, dict[str, Any]] = {}
    for section, values in raw.items():
        for name, value in values.items():
            sec, key, tp = _split_key(f"{section}.{name}")
            typed.setdefault(sec, {})[key] = _coerce(f"{sec}.{key}", value, tp)
    return build_config(typed)
