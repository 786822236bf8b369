"""Whole-config validation: the schema's static checks (:func:`splitfl.config.validate`)
plus every name that lives in a registry — one layer above the config, so that
:mod:`splitfl.config` imports no registry."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from splitfl.algorithms import algorithm_names, resolve_algorithm
from splitfl.config import ConfigError, ExperimentConfig, validate
from splitfl.config import load_config as read_config
from splitfl.data import PARTITIONERS, dataset_names
from splitfl.data.base import VERIFY_MODES
from splitfl.executors import EXECUTORS, PRECISIONS
from splitfl.models import model_names
from splitfl.system.devices import COMPOSITIONS, PRESETS, resolve_contention


def _choice(value: str, allowed: list[str], path: str) -> None:
    if value not in allowed:
        raise ConfigError(path, f"unknown {value!r}; allowed: {', '.join(allowed)}")


def check_registries(config: ExperimentConfig) -> None:
    """Every registry name of ``config`` exists: algorithm, model, executor, precision,
    dataset, partition, verify mode, device preset and composition."""
    _choice(config.algorithm, algorithm_names(), "algorithm")
    _choice(config.model, model_names(), "model")
    _choice(config.executor, [*sorted(EXECUTORS), "networked"], "executor")
    _choice(config.precision, list(PRECISIONS), "precision")
    _choice(config.data.dataset, dataset_names(), "data.dataset")
    _choice(config.data.partition, sorted(PARTITIONERS), "data.partition")
    _choice(config.data.verify, list(VERIFY_MODES), "data.verify")
    _choice(config.devices.preset, sorted(PRESETS), "devices.preset")
    _choice(config.devices.composition, list(COMPOSITIONS), "devices.composition")


def resolve_config(config: ExperimentConfig) -> ExperimentConfig:
    """``config`` with the values that default to a registry's choice filled in (the one place
    they are resolved; the run's context, ``config.yaml`` and ``splitfl validate`` show the
    result): ``devices.contention`` null → the device preset's paper model
    (:func:`~splitfl.system.devices.resolve_contention`)."""
    d = config.devices
    contention = resolve_contention(d.preset, d.contention)
    if d.contention is contention:
        return config
    return config.replace(devices=dataclasses.replace(d, contention=contention))


def check_options(config: ExperimentConfig) -> None:
    """Every algorithm's options under ``options:`` (selected or not), then the selected
    algorithm's (alias presets included)."""
    for name in config.options:
        _choice(name, algorithm_names(), f"options.{name}")
        resolve_algorithm(name, config.options)
    resolve_algorithm(config.algorithm, config.options)


def check_timing(config: ExperimentConfig) -> None:
    """``executor: timing`` trains nothing: an algorithm whose control reads training signals
    needs a declared stand-in (``Algorithm.timing_stand_in``), else a one-line refusal."""
    if config.executor != "timing":
        return
    cls = resolve_algorithm(config.algorithm, config.options)[0]
    if cls.training_signals and not cls.timing_stand_in:
        raise ConfigError(
            "executor",
            f"timing: {config.algorithm} {cls.training_signals}, and has no stand-in "
            "without training; use executor: sequential",
        )


def check_aggregation(config: ExperimentConfig) -> None:
    """``train.aggregation`` is one the algorithm's aggregation supports
    (``Algorithm.aggregations``), else a one-line refusal."""
    cls = resolve_algorithm(config.algorithm, config.options)[0]
    if config.train.aggregation not in cls.aggregations:
        raise ConfigError(
            "train.aggregation",
            f"{config.algorithm} supports {', '.join(cls.aggregations)} "
            f"(got {config.train.aggregation!r})",
        )


def validate_config(config: ExperimentConfig) -> None:
    """Static checks of every field and every registry name (``splitfl validate`` without
    the data). Raises :class:`~splitfl.config.ConfigError`."""
    check_registries(config)
    validate(config)
    check_options(config)
    check_timing(config)
    check_aggregation(config)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None):
    """Read a YAML config (or defaults when ``path`` is None), apply overrides, validate all
    of it (:func:`validate_config`)."""
    config = read_config(path, overrides)
    check_registries(config)
    check_options(config)
    check_timing(config)
    check_aggregation(config)
    return config
