"""YAML files and ``key=value`` overrides into the schema (:func:`from_dict`, :func:`load_config`);
YAML text is size-, depth- and alias-checked before it is expanded."""

from __future__ import annotations

import copy
import dataclasses
import math
import re
import types
import typing
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from splitfl.config.checks import check_fields
from splitfl.config.choices import did_you_mean
from splitfl.config.schema import (
    ConfigError,
    ExperimentConfig,
)
from splitfl.config.yaml_limits import MAX_YAML_BYTES, yaml_limit_violation
from splitfl.core.atomic import write_atomic


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _short(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters, for one-line messages."""
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**limit else "<huge int>"
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def config_fields(config: Any) -> dict[str, Any]:
    """The fields of a config dataclass as a mapping, nested sections too (other values as they
    are: :func:`from_dict` checks them), so a hand-built config is checked like a file."""
    return {
        f.name: config_fields(v) if _is_config(v := getattr(config, f.name)) else v
        for f in dataclasses.fields(config)
    }


def _is_config(value: Any) -> bool:
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def _plain(value: Any) -> Any:
    """``value`` with numpy scalars (``np.int64``, ``np.float32``, ``np.str_``, ...) turned into
    Python ones, inside mappings and lists too, so the config dumps to YAML and JSON."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _coerce(value: Any, tp: Any, path: str) -> Any:
    """Check/convert ``value`` to annotation ``tp`` (int, float, bool, str, X | None, dict,
    a config section); numpy scalars count as the Python scalars they hold."""
    value = value.item() if isinstance(value, np.generic) else value
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return _coerce(value, inner[0], path)
        return _coerce_any(value, inner, path)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            value = config_fields(value)
        if isinstance(value, str) and "name" in {f.name for f in dataclasses.fields(tp)}:
            value = {"name": value}  # `train.server_optimizer=fedadam`: the name alone
        if not isinstance(value, dict):
            raise ConfigError(path, f"expected a mapping, got {_short(value)}")
        return from_dict(tp, value, f"{path}.")
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(path, f"expected a mapping, got {_short(value)}")
        return _plain(dict(value))
    if origin is list:
        if isinstance(value, str):  # `output.tracking=mlflow` means [mlflow]
            value = [value]
        if not isinstance(value, list | tuple):
            raise ConfigError(path, f"expected a list, got {_short(value)}")
        (item,) = typing.get_args(tp) or (Any,)
        return [_plain(v) if item is Any else _coerce(v, item, path) for v in value]
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(path, f"expected true or false, got {_short(value)}")
    if tp is int:
        return _coerce_int(value, path)
    if tp is float:
        return _coerce_float(value, path)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(path, f"expected a string, got {_short(value)}")
        return str(value)
    raise ConfigError(path, f"unsupported type {_type_name(tp)}")


def _coerce_any(value: Any, types_: list[Any], path: str) -> Any:
    """``value`` as the first of ``types_`` it fits (``bool | str``: ``true`` or ``auto``)."""
    for tp in types_:
        try:
            return _coerce(value, tp, path)
        except ConfigError:
            continue
    names = " or ".join(_type_name(tp) for tp in types_)
    raise ConfigError(path, f"expected {names}, got {_short(value)}")


#: Integers must fit in a signed 64-bit integer (numpy, torch and seeds need that).
INT_LIMIT = 2**63


def _coerce_int(value: Any, path: str) -> int:
    """An int (or an integral float) with ``|value| < 2**63``."""
    if isinstance(value, bool) or not isinstance(value, int):
        if not (isinstance(value, float) and value.is_integer()):
            raise ConfigError(path, f"expected an integer, got {_short(value)}")
    value = int(value)
    if not -INT_LIMIT < value < INT_LIMIT:
        raise ConfigError(
            path, f"must fit in a 64-bit integer (|value| < 2**63), got {_short(value)}"
        )
    return value


def _coerce_float(value: Any, path: str) -> float:
    """A finite float; nan and ±inf are refused everywhere a float is meant."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(path, f"expected a number, got {_short(value)}")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise ConfigError(path, f"must be a finite number, got {_short(value)}")
    return number


def from_dict(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    """Build dataclass ``cls`` from a mapping, rejecting unknown keys and wrong types."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(key, bool):  # a mapping from yaml.safe_load: `on:` read as True
            raise ConfigError(path, boolean_key(key))
        if key not in names:
            hint = did_you_mean(key, names)
            raise ConfigError(path, f"unknown field{hint}; allowed: {', '.join(names)}")
        kwargs[key] = _coerce(value, hints[key], path)
    for name in names:
        if name not in kwargs and dataclasses.is_dataclass(hints[name]):
            kwargs[name] = from_dict(hints[name], {}, f"{prefix}{name}.")
    return cls(**kwargs)


def load_yaml(text: str, field: str = "config", source: str = "YAML text") -> Any:
    """``yaml.safe_load`` without YAML 1.1's base-60 numbers, so ``8:1:1:1:1`` stays a string
    (plain ``safe_load`` reads it as the integer 1731661).

    Text beyond the bounds of :mod:`splitfl.config.yaml_limits` (size, nesting, expanded
    aliases) and text that does not parse raise a one-line :class:`ConfigError` on ``field``
    that names ``source`` (a file, an override).
    """
    loader = _yaml_loader()
    try:
        problem = yaml_limit_violation(text, loader)
        if problem is None:
            return yaml.load(text, Loader=loader)  # a SafeLoader subclass: safe
    except (yaml.YAMLError, ValueError, OverflowError) as err:
        problem = f"invalid YAML: {_yaml_problem(err)}"
    raise ConfigError(field, f"{source}: {problem}")


def _yaml_problem(err: Exception) -> str:
    """One line from a PyYAML error: its problem and where (line/column are 1-based)."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or str(err)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return " ".join(f"{problem}{where}".split())[:200]


def boolean_key(key: Any) -> str:
    """Why a boolean mapping key is refused, in one line (YAML 1.1's quirk named).
    :func:`load_yaml` keeps an unquoted key ``on``/``off``/``yes``/``no`` as the word written
    (``on`` is ``eval.on``); ``true``/``false`` keys, and ``True`` keys of a mapping that
    ``yaml.safe_load`` read, are refused with this line."""
    return (
        f"boolean key {key!r}: YAML 1.1 reads an unquoted on/off/yes/no/true/false as a "
        "boolean (yaml.safe_load gives eval: {on: both} as {True: both}); quote the key, "
        "e.g. 'on': both"
    )


def _yaml_loader() -> type:
    """The SafeLoader subclass of :func:`load_yaml` (YAML 1.2-style ints and floats)."""
    int_tag, float_tag = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
    bool_tag = "tag:yaml.org,2002:bool"

    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
            """A mapping that names a key twice is refused: YAML keeps the last silently, so a
            repeated section would drop every field of the first."""
            seen: set = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                if key_node.tag == bool_tag and key_node.style is None:
                    if key_node.value.lower() not in ("true", "false"):  # on, off, yes, no
                        key_node.tag = "tag:yaml.org,2002:str"  # the key as written
                    else:
                        raise yaml.constructor.ConstructorError(
                            None, None, boolean_key(key_node.value), key_node.start_mark
                        )
                key = self.construct_object(key_node, deep=deep)
                if not isinstance(key, Hashable):
                    continue  # refused by SafeLoader itself
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r}", key_node.start_mark
                    )
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    Loader.yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in rules if tag not in (int_tag, float_tag)]
        for first, rules in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    Loader.add_implicit_resolver(
        int_tag,
        re.compile(
            r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$"
        ),
        list("-+0123456789"),
    )
    Loader.add_implicit_resolver(
        float_tag,
        re.compile(
            r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+"
            r"|[-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
        ),
        list("-+0123456789."),
    )
    return Loader


def read_yaml_mapping(path: str | Path) -> dict[str, Any]:
    """A YAML file holding a mapping (via :func:`load_yaml`), or a one-line ConfigError.

    Files above :data:`MAX_YAML_BYTES` are refused before they are read; the text must be
    UTF-8 (a byte-order mark is allowed)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError("config", f"file not found: {p}")
    try:
        if p.stat().st_size > MAX_YAML_BYTES:
            raise ConfigError("config", f"{p}: larger than {MAX_YAML_BYTES} bytes (MAX_YAML_BYTES)")
        text = p.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise ConfigError("config", f"{p}: not UTF-8 text (byte {err.start})") from err
    except OSError as err:
        raise ConfigError("config", f"{p}: cannot read ({err.strerror})") from err
    loaded = load_yaml(text, "config", str(p)) or {}
    if not isinstance(loaded, dict):
        raise ConfigError("config", f"{p} must hold a mapping of fields")
    return loaded


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b.c=value`` → (["a", "b", "c"], YAML-parsed value)."""
    if "=" not in text:
        raise ConfigError(text, "overrides must look like key=value (e.g. train.lr=0.05)")
    key, raw = text.split("=", 1)
    keys = key.strip().split(".")
    if not all(keys):
        raise ConfigError(
            "override", f"{text!r}: empty name in the key (want key=value, e.g. train.lr=0.05)"
        )
    return keys, load_yaml(raw, ".".join(keys), "override value") if raw.strip() else None


def set_dotted(data: dict[str, Any], keys: list[str], value: Any) -> None:
    """Set ``data[k0][k1]...[kn] = value`` in place, creating mappings on the way."""
    node = data
    for k in keys[:-1]:
        node = node.setdefault(k, {})
        if not isinstance(node, dict):
            raise ConfigError(".".join(keys), "cannot set a field inside a non-mapping value")
    node[keys[-1]] = value


def check_overrides(overrides: Any) -> list[str]:
    """``overrides`` as a list of ``key=value`` strings; a lone string (which would be read
    character by character) or anything else is a one-line error."""
    if isinstance(overrides, str):
        raise ConfigError(
            "overrides",
            f"expected a list of key=value strings, got the string {_short(overrides)} "
            f"(write [{_short(overrides)}])",
        )
    if not isinstance(overrides, list | tuple) or not all(isinstance(o, str) for o in overrides):
        raise ConfigError(
            "overrides", f"expected a list of key=value strings, got {_short(overrides)}"
        )
    return list(overrides)


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mapping → ``{dotted.key: value}`` (lists kept as values)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of a raw config mapping with dotted ``key=value`` overrides applied."""

    out = copy.deepcopy(data)
    for text in check_overrides(overrides):
        set_dotted(out, *parse_override(text))
    return out


def load_config(path: str | Path | None = None, overrides: list[str] | None = None):
    """Read a YAML config (or defaults when ``path`` is None), apply overrides, run the static
    checks (:func:`check_fields`); registry names are checked by
    :func:`splitfl.experiment.validation.load_config`."""
    data = read_yaml_mapping(path) if path is not None else {}
    data = apply_overrides(data, overrides or [])
    config = from_dict(ExperimentConfig, data)
    check_fields(config)
    return config


def dump_config(config: ExperimentConfig, path: Path) -> None:
    write_atomic(path, yaml.safe_dump(config.to_dict(), sort_keys=False))
