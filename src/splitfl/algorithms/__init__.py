"""Algorithms, one module each, behind one small interface (:class:`Algorithm`).

Registry names equal module names; ablations are aliases that preset options.
"""

from __future__ import annotations

from typing import Any

from splitfl.algorithms.adasampling import AdaSampling
from splitfl.algorithms.adasfl import AdaSFL
from splitfl.algorithms.base import Algorithm
from splitfl.algorithms.cse_fsl import CSEFSL
from splitfl.algorithms.fedavg import FedAvg
from splitfl.algorithms.fsl_sage import FSLSAGE
from splitfl.algorithms.ifca import IFCA
from splitfl.algorithms.locfedmix_sl import LocFedMixSL
from splitfl.algorithms.mergesfl import MergeSFL
from splitfl.algorithms.parallelsfl import ParallelSFL
from splitfl.algorithms.pyramidfl import PyramidFL
from splitfl.algorithms.ringsfl import RingSFL
from splitfl.algorithms.s2fl import S2FL
from splitfl.algorithms.splitfed_ringsfl import SplitFedRingSFL
from splitfl.algorithms.splitfed_v1 import SplitFedV1
from splitfl.algorithms.splitfed_v2 import SplitFedV2
from splitfl.algorithms.splitlora import SplitLoRA
from splitfl.algorithms.ushaped_sl import UShapedSL
from splitfl.algorithms.vanilla_sl import VanillaSL
from splitfl.config import ConfigError, from_dict
from splitfl.config.choices import unknown_choice
from splitfl.core.plan import ClientTask, ClientUpdate, RoundPlan, RoundResult

ALGORITHMS: dict[str, type[Algorithm]] = {
    cls.name: cls
    for cls in (
        FedAvg,
        SplitFedV1,
        SplitFedV2,
        SplitLoRA,
        S2FL,
        MergeSFL,
        AdaSFL,
        PyramidFL,
        LocFedMixSL,
        CSEFSL,
        FSLSAGE,
        IFCA,
        AdaSampling,
        ParallelSFL,
        RingSFL,
        SplitFedRingSFL,
        VanillaSL,
        UShapedSL,
    )
}

#: alias -> (algorithm, preset options). S²FL ablations follow §5.4.
ALIASES: dict[str, tuple[str, dict[str, Any]]] = {
    "sfl": ("splitfed_v1", {}),
    "s2fl+R": ("s2fl", {"adaptive_split": False, "data_balance": False}),
    "s2fl+B": ("s2fl", {"adaptive_split": False, "data_balance": True}),
    "s2fl+M": ("s2fl", {"adaptive_split": True, "data_balance": False}),
    "s2fl+MB": ("s2fl", {"adaptive_split": True, "data_balance": True}),
    "mergesfl-w/o-FM": ("mergesfl", {"feature_merging": False}),
    "mergesfl-w/o-BR": ("mergesfl", {"batch_regulation": False}),
    "ringsfl-v2": ("ringsfl", {"version": "v2"}),
    "parallelsfl-WC": ("parallelsfl", {"adaptive_tau": False}),
    "parallelsfl-R": ("parallelsfl", {"random_clusters": True, "adaptive_tau": False}),
}


def register_algorithm(cls: type[Algorithm] | None = None, *, replace: bool = False):
    """Add ``cls`` to :data:`ALGORITHMS` under ``cls.name`` (usable as a class decorator, or
    as ``@register_algorithm(replace=True)``). An algorithm that needs no new topology is one
    module plus this call. A name already registered (or an alias) is a ``ValueError``
    unless ``replace=True``."""
    if cls is None:
        return lambda c: register_algorithm(c, replace=replace)
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        raise TypeError(
            f"register_algorithm takes a subclass of splitfl.Algorithm, got "
            f"{getattr(cls, '__qualname__', type(cls).__name__)}"
        )
    if not cls.name or not isinstance(cls.name, str):
        raise ValueError(f"{cls.__name__} needs a non-empty class attribute 'name'")
    if cls.name in ALIASES or (ALGORITHMS.get(cls.name, cls) is not cls and not replace):
        raise ValueError(
            f"algorithm name {cls.name!r} is already registered; pick another name"
            + ("" if cls.name in ALIASES else " or pass replace=True")
        )
    ALGORITHMS[cls.name] = cls
    return cls


def algorithm_names() -> list[str]:
    return sorted(ALGORITHMS) + sorted(ALIASES)


def resolve_algorithm(name: str, options: dict[str, dict[str, Any]]) -> tuple[type[Algorithm], Any]:
    """Class and validated options for ``name`` (an algorithm or an alias).

    Options come from ``options[<algorithm>]``, then the alias presets, then ``options[<alias>]``;
    each given entry must be a mapping, checked against ``cls.Options`` (unknown keys, types,
    ranges) whether or not ``name`` is the selected algorithm.
    """
    if name in ALIASES:
        base, preset = ALIASES[name]
    elif name in ALGORITHMS:
        base, preset = name, {}
    else:
        raise ConfigError("algorithm", unknown_choice(name, algorithm_names()))
    cls = ALGORITHMS[base]
    for key in dict.fromkeys((base, name)):
        if not isinstance(options.get(key, {}), dict):
            raise ConfigError(f"options.{key}", "must be a mapping of option: value")
    merged = {**options.get(base, {}), **preset, **(options.get(name, {}) if name != base else {})}
    return cls, from_dict(cls.Options, merged, prefix=f"options.{name}.")


__all__ = [
    "ALGORITHMS",
    "ALIASES",
    "Algorithm",
    "ClientTask",
    "ClientUpdate",
    "RoundPlan",
    "RoundResult",
    "algorithm_names",
    "register_algorithm",
    "resolve_algorithm",
]
