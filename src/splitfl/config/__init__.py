"""Experiment configuration: frozen dataclasses as the schema, YAML files, ``key=value`` overrides.

Everything is checked by :func:`check_fields` before any work starts; a bad value raises
:class:`ConfigError`, whose message is one line naming the field and what is allowed.
Integers must fit in 64 bits and floats must be finite; each float field has an allowed range
(:data:`FLOAT_RANGES`). YAML text (files and override values) is refused with one line before
it is expanded when it is larger than :data:`MAX_YAML_BYTES`, nests deeper than
:data:`MAX_YAML_DEPTH` or holds more than :data:`MAX_YAML_VALUES` values once its aliases are
expanded (an alias bomb); syntax errors and non-UTF-8 files are one-line errors too.

The package: :mod:`~splitfl.config.schema` (the dataclasses; ``network:``'s in
:mod:`~splitfl.config.network`), :mod:`~splitfl.config.parse` (YAML, overrides),
:mod:`~splitfl.config.checks` (:func:`check_fields`; the float ranges in
:mod:`~splitfl.config.ranges`). It imports no registry.
"""

from splitfl.config.checks import (
    MAX_THREADS,
    SEED_LIMIT,
    check_fields,
    check_ray_address,
    resolve_device,
)
from splitfl.config.network import COMPRESSIONS, BoundsConfig
from splitfl.config.parse import (
    INT_LIMIT,
    apply_overrides,
    check_overrides,
    config_fields,
    dump_config,
    flatten,
    from_dict,
    load_config,
    load_yaml,
    parse_override,
    read_yaml_mapping,
    set_dotted,
)
from splitfl.config.privacy import PrivacyConfig, RecordConfig
from splitfl.config.ranges import FLOAT_RANGES, Range
from splitfl.config.schema import (
    AGGREGATIONS,
    CLOCKS,
    EVAL_ON,
    PARALLEL_BACKENDS,
    TRACKERS,
    ConfigError,
    DataConfig,
    DefenceConfig,
    DevicesConfig,
    EvalConfig,
    ExperimentConfig,
    HfConfig,
    LoraConfig,
    NetworkConfig,
    OutputConfig,
    ParallelConfig,
    ServerOptimizerConfig,
    SplitConfig,
    TrainConfig,
)
from splitfl.config.yaml_limits import MAX_YAML_BYTES, MAX_YAML_DEPTH, MAX_YAML_VALUES

__all__ = [
    "AGGREGATIONS",
    "CLOCKS",
    "COMPRESSIONS",
    "EVAL_ON",
    "FLOAT_RANGES",
    "INT_LIMIT",
    "MAX_THREADS",
    "MAX_YAML_BYTES",
    "MAX_YAML_DEPTH",
    "MAX_YAML_VALUES",
    "PARALLEL_BACKENDS",
    "SEED_LIMIT",
    "TRACKERS",
    "BoundsConfig",
    "ConfigError",
    "DataConfig",
    "DevicesConfig",
    "EvalConfig",
    "ExperimentConfig",
    "HfConfig",
    "DefenceConfig",
    "LoraConfig",
    "NetworkConfig",
    "PrivacyConfig",
    "RecordConfig",
    "OutputConfig",
    "ParallelConfig",
    "ServerOptimizerConfig",
    "SplitConfig",
    "Range",
    "TrainConfig",
    "apply_overrides",
    "check_ray_address",
    "check_overrides",
    "config_fields",
    "dump_config",
    "flatten",
    "from_dict",
    "load_config",
    "load_yaml",
    "parse_override",
    "read_yaml_mapping",
    "resolve_device",
    "set_dotted",
    "check_fields",
]
