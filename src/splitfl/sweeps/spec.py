"""Sweep files: load and validate them, and expand their grid into named trials.

A sweep file (YAML)::

    name: digits-grid              # optional; default: the file's stem
    base: ../configs/quickstart.yaml   # a config file, relative to the sweep file
    overrides: [rounds=20]         # optional, applied to every trial (same as `splitfl run`)
    axes:                          # every combination is one trial
      algorithm: [fedavg, s2fl]
      seed: [0, 1, 2]
      data.alpha: [0.1, 0.5]
    out_dir: runs                  # optional; the sweep directory is <out_dir>/<name>

Axis keys are the dotted paths ``key=value`` overrides accept. Trials are ordered as
``itertools.product`` over the axes in file order (the first axis varies slowest) and named
from their axis values, e.g. ``algorithm-fedavg_seed-0_alpha-0.1``, so names and order are
deterministic. The resolved copy written to the sweep directory (``sweep.yaml``) holds the
base config inline (``base`` may be a mapping), so ``splitfl sweep --resume DIR`` needs
nothing else.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from splitfl.config import (
    ConfigError,
    ExperimentConfig,
    apply_overrides,
    check_overrides,
    from_dict,
    load_yaml,
    parse_override,
    read_yaml_mapping,
    set_dotted,
)
from splitfl.experiment.compare import safe_name
from splitfl.experiment.validation import check_config
from splitfl.extensions import fill_import_dirs

SWEEP_FIELDS = ("name", "base", "base_source", "overrides", "axes", "out_dir")

#: Longest trial (and sweep) directory name: file systems refuse names over
#: :data:`~splitfl.core.atomic.NAME_MAX` bytes, and a taken name gets a ``-<n>`` suffix.
MAX_TRIAL_NAME = 200


@dataclass(frozen=True)
class SweepSpec:
    """A validated sweep file. ``base`` is the raw base config mapping (before overrides)."""

    name: str
    base: dict[str, Any]
    axes: dict[str, list[Any]]
    overrides: list[str] = field(default_factory=list)
    out_dir: str | None = None
    base_source: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The resolved sweep file (``sweep.yaml`` in the sweep directory)."""
        return {
            "name": self.name,
            "base_source": self.base_source,
            "overrides": list(self.overrides),
            "axes": {k: list(v) for k, v in self.axes.items()},
            "out_dir": self.out_dir,
            "base": copy.deepcopy(self.base),
        }


@dataclass(frozen=True)
class Trial:
    """One combination of axis values. ``config`` is None when it failed validation, and
    ``error`` then holds the one-line :class:`ConfigError` message."""

    index: int
    name: str
    values: dict[str, Any]
    config: ExperimentConfig | None
    error: str | None = None

    @property
    def overrides(self) -> list[str]:
        """The axis values as ``key=value`` overrides (``splitfl run BASE <these>``)."""
        return [f"{k}={format_override_value(v)}" for k, v in self.values.items()]


def format_override_value(value: Any) -> str:
    """``value`` as the text after ``key=`` that parses back to the same value."""
    if isinstance(value, str) and load_yaml(value) == value:
        return value
    return json.dumps(value)


def _check_sweep_mapping(data: dict[str, Any]) -> None:
    for key in data:
        if key not in SWEEP_FIELDS:
            raise ConfigError(f"sweep.{key}", f"unknown field; allowed: {', '.join(SWEEP_FIELDS)}")
    if "base" not in data:
        raise ConfigError("sweep.base", "name the base config (base: path/to/config.yaml)")
    axes = data.get("axes") or {}
    if not isinstance(axes, dict):
        raise ConfigError("sweep.axes", "must map dotted config keys to lists of values")
    for key, values in axes.items():
        _check_axis(f"sweep.axes.{key}", values)
    overrides = data.get("overrides") or []
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise ConfigError("sweep.overrides", "must be a list of key=value strings")
    for text in overrides:  # the axis would silently win over it in every trial
        key = ".".join(parse_override(text)[0])
        if key in axes:
            raise ConfigError(
                "sweep.overrides", f"{text!r} sets {key}, an axis; change the axis instead"
            )


def _check_axis(field: str, values: Any) -> None:
    if not isinstance(values, list) or not values:
        raise ConfigError(field, f"must be a non-empty list (got {values!r})")
    for i, j in itertools.combinations(range(len(values)), 2):
        if values[i] == values[j]:  # 0 and 0.0 too: the same seed, the same trial twice
            raise ConfigError(
                field, f"repeated values in {values!r} ({values[i]!r} and {values[j]!r} are equal)"
            )


def narrow_axes(
    axes: dict[str, list[Any]], overrides: list[str]
) -> tuple[dict[str, list[Any]], list[str]]:
    """Split command-line ``overrides`` into new axes and the overrides of every trial.

    An override naming an axis sets that axis's values instead of being overwritten by them in
    every trial: ``seed=[0]`` or ``seed=0`` runs seed 0 only, ``seed=[3,4]`` seeds 3 and 4. A
    list is the values, unless the axis's values are lists themselves and it is a flat list
    (then it is one value). Returns ``(axes, other overrides)``.
    """
    axes = {k: list(v) for k, v in axes.items()}
    rest = []
    for text in check_overrides(overrides):
        keys, value = parse_override(text)
        key = ".".join(keys)
        if key not in axes:
            rest.append(text)
            continue
        nested = any(isinstance(v, list) for v in axes[key])
        is_values = isinstance(value, list) and (
            not nested or all(isinstance(v, list) for v in value)
        )
        axes[key] = value if is_values else [value]
        _check_axis(key, axes[key])
    return axes, rest


def _resolve_base(base: Any, folder: Path) -> tuple[dict[str, Any], str | None]:
    """The base config mapping and where it came from (a path relative to the sweep file)."""
    if isinstance(base, dict):
        return copy.deepcopy(base), None
    if not isinstance(base, str):
        raise ConfigError("sweep.base", f"must be a config path or mapping (got {base!r})")
    path = (folder / base).resolve()
    if not path.is_file():
        raise ConfigError("sweep.base", f"file not found: {path}")
    return read_yaml_mapping(path), str(path)


def load_sweep(
    source: str | Path | dict[str, Any], overrides: list[str] | None = None
) -> SweepSpec:
    """Read and validate a sweep file (or mapping); ``overrides`` naming an axis set its
    values (:func:`narrow_axes`), the others are appended to the file's own.

    Raises :class:`ConfigError` (``sweep.<field>: ...``) for a malformed sweep file; trial
    configs are validated by :func:`expand`.
    """
    if isinstance(source, dict):
        data, folder, stem = copy.deepcopy(source), Path.cwd(), "sweep"
    else:
        path = Path(source)
        if not path.is_file():
            raise ConfigError("sweep", f"file not found: {path}")
        data, folder, stem = read_yaml_mapping(path), path.parent, path.stem
    _check_sweep_mapping(data)
    base, base_source = _resolve_base(data["base"], folder)
    name = data.get("name") or stem
    if not isinstance(name, str) or safe_name(name) != name:
        raise ConfigError("sweep.name", f"use letters, digits, '_', '.', '-' (got {name!r})")
    if len(name) > MAX_TRIAL_NAME:
        raise ConfigError("sweep.name", f"at most {MAX_TRIAL_NAME} characters (got {len(name)})")
    axes, extra = narrow_axes(data.get("axes") or {}, overrides or [])
    return SweepSpec(
        name=name,
        base=base,
        axes=axes,
        overrides=[*(data.get("overrides") or []), *extra],
        out_dir=data.get("out_dir"),
        base_source=data.get("base_source") or base_source,
    )


def _label(key: str, keys: list[str]) -> str:
    """Short axis label for trial names: the last dotted part unless two axes share it."""
    last = key.split(".")[-1]
    return last if sum(k.split(".")[-1] == last for k in keys) == 1 else key


def _value_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def trial_name(values: dict[str, Any]) -> str:
    """Directory name of a trial: ``label-value`` per axis joined by ``_`` (``base`` if none).
    A name longer than :data:`MAX_TRIAL_NAME` (many axes) keeps its beginning and ends with
    12 hex digits of the SHA-256 of the whole name (the trial's values are in the index)."""
    keys = list(values)
    parts = [f"{_label(k, keys)}-{_value_text(v)}" for k, v in values.items()]
    name = safe_name("_".join(parts)) if parts else "base"
    if len(name) > MAX_TRIAL_NAME:
        digest = hashlib.sha256(name.encode()).hexdigest()[:12]
        name = f"{name[: MAX_TRIAL_NAME - 13]}-{digest}"
    return name


def trial_config(spec: SweepSpec, values: dict[str, Any]) -> ExperimentConfig:
    """The validated config of one trial: base, then the sweep's overrides, then its values."""
    data = apply_overrides(spec.base, spec.overrides)
    for key, value in values.items():
        set_dotted(data, key.split("."), copy.deepcopy(value))
    config = from_dict(ExperimentConfig, data)
    check_config(config, Path(spec.base_source).parent if spec.base_source else None)
    return fill_import_dirs(config)  # Ray workers and resumes find the modules there too


def expand(spec: SweepSpec) -> list[Trial]:
    """Every combination of axis values as a :class:`Trial` (deterministic order and names).

    Each trial's config is validated here; an invalid one gets ``config=None`` and its
    one-line error, so the caller can report all of them before anything runs.
    """
    keys = list(spec.axes)
    trials: list[Trial] = []
    seen: set[str] = set()
    for i, combo in enumerate(itertools.product(*(spec.axes[k] for k in keys))):
        values = dict(zip(keys, combo, strict=True))
        name = trial_name(values)
        if name in seen:  # two values that sanitise to the same text
            name = f"{name}-{i}"
        seen.add(name)
        try:
            trials.append(Trial(i, name, values, trial_config(spec, values)))
        except ConfigError as err:
            trials.append(Trial(i, name, values, None, str(err)))
    return trials
