"""Whole-config validation: the schema's static checks (:func:`splitfl.config.check_fields`)
plus every name that lives in a registry — one layer above the config, so that
:mod:`splitfl.config` imports no registry."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from splitfl.aggregation.robust import Rule
from splitfl.algorithms import algorithm_names, resolve_algorithm
from splitfl.config import ConfigError, DataConfig, ExperimentConfig, check_fields
from splitfl.config import load_config as read_config
from splitfl.config.choices import unknown_choice
from splitfl.core.topology import UShaped
from splitfl.data import PARTITIONERS, dataset_names
from splitfl.data.base import VERIFY_MODES
from splitfl.data.formats import CLIENT_FORMATS, FORMATS
from splitfl.data.transforms import TransformError, parse_transforms
from splitfl.executors import PRECISIONS
from splitfl.experiment.runtimes import RUNTIMES
from splitfl.extensions import check_dataset, check_model, fill_import_dirs, import_config_modules
from splitfl.models.hf import hf_folder, is_hf_spec
from splitfl.roles.cut_record import refuse_unrecorded
from splitfl.system.devices import COMPOSITIONS, PRESETS, VARYING_BANDWIDTH, resolve_contention
from splitfl.training import (
    FLOAT_TARGET_LOSSES,
    LOSSES,
    OPTIMIZERS,
    SERVER_OPTIMIZERS,
    metric_problem,
)

#: Partitioners that deal samples by class label (else: iid, natural).
LABEL_PARTITIONS = ("dirichlet", "shards")


def _choice(value: str, allowed: list[str], path: str) -> None:
    if value not in allowed:
        raise ConfigError(path, unknown_choice(value, allowed))


def check_registries(config: ExperimentConfig, config_dir: str | Path | None = None) -> None:
    """Every registry name of ``config`` exists: algorithm, model, executor, precision,
    dataset, partition, verify mode, device preset and composition. First the config's
    ``imports`` (and the modules of its import paths) are imported, searching
    ``config_dir`` (the config file's folder) too: they may register names."""
    import_config_modules(config, config_dir)
    _choice(config.algorithm, algorithm_names(), "algorithm")
    check_model(config.model)
    _choice(config.executor, sorted(RUNTIMES), "executor")
    _choice(config.precision, list(PRECISIONS), "precision")
    check_data_source(config)
    _choice(config.data.partition, sorted(PARTITIONERS), "data.partition")
    _choice(config.data.verify, list(VERIFY_MODES), "data.verify")
    _choice(config.devices.preset, sorted(PRESETS), "devices.preset")
    _choice(config.devices.composition, list(COMPOSITIONS), "devices.composition")


def check_device_options(config: ExperimentConfig) -> None:
    """Fields that only some presets or models have (after the ranges are checked)."""
    d = config.data
    if d.targets not in (None, "classes", "values"):
        raise ConfigError("data.targets", f"allowed: classes, values, null (got {d.targets!r})")
    values = d.targets == "values" or (
        d.targets is None and config.train.loss in FLOAT_TARGET_LOSSES
    )
    if values and d.source == "devices":
        raise ConfigError(
            "data.targets",
            "values (float targets) with data.source: devices is not supported: a device "
            "announces its clients' label histograms at join; partition one dataset instead",
        )
    if d.text_target not in ("label", "next_token"):
        raise ConfigError("data.text_target", f"allowed: label, next_token (got {d.text_target!r})")
    if d.format == "text" or d.text_columns:
        n = len(d.text_columns or [])
        if n not in (1, 2):
            raise ConfigError(
                "data.text_columns", f"format text needs one or two text columns (got {n})"
            )
        if d.format not in ("text", "hf", "parquet"):
            raise ConfigError(
                "data.text_columns",
                f"raw text is read by format text, hf or parquet, not {d.format}",
            )
        if d.tokenizer is None and not is_hf_spec(config.model):
            raise ConfigError(
                "data.tokenizer", "format text needs a tokenizer folder (or model: hf:<folder>)"
            )
        if not 1 <= d.max_length <= 1 << 16:
            raise ConfigError("data.max_length", f"must be in [1, 65536] (got {d.max_length})")
    if config.train.lora is not None and not is_hf_spec(config.model):
        raise ConfigError(
            "train.lora",
            f"needs a Hugging Face model (model: hf:<folder> or hf-config:<folder>; got "
            f"{config.model!r}); LoRA adapters are injected with peft into its layers",
        )
    v = config.devices
    if v.bandwidth_correlation is not None and v.preset not in VARYING_BANDWIDTH:
        raise ConfigError(
            "devices.bandwidth_correlation",
            f"only for presets whose bandwidth varies by round ({', '.join(VARYING_BANDWIDTH)});"
            f" {v.preset!r} has none (devices.variation varies any preset)",
        )


def check_recipe(config: ExperimentConfig, cls: type) -> None:
    """``train.loss``, ``train.optimizer`` and ``eval.metrics`` exist and fit each other, the
    executor, the partition and the algorithm (a task without class labels — ``mse``,
    ``bce_logits`` — cannot be dealt by label or grouped by label distributions)."""
    t, e = config.train, config.eval
    _choice(t.loss, list(LOSSES), "train.loss")
    _choice(t.optimizer, list(OPTIMIZERS), "train.optimizer")
    if t.loss != "cross_entropy":
        _check_class_labels(config, cls)
    for name in e.metrics:
        problem = metric_problem(name, t.loss)
        if problem:
            raise ConfigError("eval.metrics", problem)
    if e.target_accuracy is not None and "accuracy" not in e.metrics:
        raise ConfigError("eval.target_accuracy", "needs accuracy in eval.metrics; use null")


def _check_class_labels(config: ExperimentConfig, cls: type) -> None:
    """A loss without class labels: the algorithm must not need them, nor the partition."""
    loss = config.train.loss
    if cls.needs_class_labels:
        raise ConfigError(
            "train.loss", f"{config.algorithm}'s {cls.needs_class_labels}; use cross_entropy"
        )
    if config.data.partition in LABEL_PARTITIONS and config.executor != "timing":
        raise ConfigError(
            "data.partition",
            f"{config.data.partition} deals samples by class label and train.loss: {loss} "
            "has none; use iid",
        )


def only_test_set(d: DataConfig) -> bool:
    """The server reads no dataset, only ``data.test_path`` (``data.source: devices``): then
    ``data.root`` is not read and ``data.dataset`` is only the data's name."""
    return d.source == "devices" and d.test_path is not None


def check_data_source(config: ExperimentConfig) -> None:
    """``data.dataset`` a registered name, or (``data.format``) a container under
    ``data.root`` whose ``data.dataset`` names it; ``partition: folders`` needs such a
    container; ``data.transforms`` well formed. A server given only a test set
    (:func:`only_test_set`) needs neither a registered dataset nor ``data.root``."""
    d = config.data
    if d.format is None:
        if not only_test_set(d):
            check_dataset(d.dataset)
    else:
        _choice(d.format, list(FORMATS), "data.format")
        if d.root is None and not only_test_set(d):
            raise ConfigError("data.root", f"data.format: {d.format} reads data.root; set it")
        if d.dataset in dataset_names():
            raise ConfigError(
                "data.dataset",
                f"{d.dataset!r} is a built-in dataset; with data.format give your data its "
                "own name (e.g. dataset: my_images)",
            )
    if d.partition == "folders" and d.format not in CLIENT_FORMATS:
        raise ConfigError(
            "data.partition",
            f"folders reads root/clients/ of data.format {', '.join(CLIENT_FORMATS)}",
        )
    try:
        parse_transforms(d.transforms)
    except TransformError as err:
        raise ConfigError("data.transforms", str(err)) from None


def resolve_config(config: ExperimentConfig) -> ExperimentConfig:
    """``config`` with the values that default to a registry's choice filled in (the one place
    they are resolved; the run's context, ``config.yaml`` and ``splitfl validate`` show the
    result): ``devices.contention`` null → the device preset's paper model
    (:func:`~splitfl.system.devices.resolve_contention`); ``import_dirs`` null → where the
    user modules were found (:func:`~splitfl.extensions.fill_import_dirs`); ``data.tokenizer``
    null with raw text (``format: text``, ``text_columns``, the built-in ``qnli``) → the
    ``model: hf:`` folder; ``data.targets`` null → ``values`` under ``train.loss``
    mse/bce_logits, else ``classes``."""
    config = fill_import_dirs(config)
    data = config.data
    text = data.format == "text" or bool(data.text_columns) or data.dataset == "qnli"
    if text and data.tokenizer is None and is_hf_spec(config.model):
        tokenizer = hf_folder(config.model)  # the model's own tokenizer
        config = config.replace(data=dataclasses.replace(data, tokenizer=tokenizer))
    if config.data.targets is None:
        values = config.train.loss in FLOAT_TARGET_LOSSES
        targets = "values" if values else "classes"
        config = config.replace(data=dataclasses.replace(config.data, targets=targets))
    d = config.devices
    contention = resolve_contention(d.preset, d.contention)
    if d.contention is contention:
        return config
    return config.replace(devices=dataclasses.replace(d, contention=contention))


def check_options(config: ExperimentConfig) -> tuple[type, Any]:
    """Every algorithm's options under ``options:`` (selected or not), then the selected
    algorithm's (alias presets included): the selected algorithm's class and options, resolved
    once for the checks that follow."""
    for name in config.options:
        _choice(name, algorithm_names(), f"options.{name}")
        if name != config.algorithm:
            resolve_algorithm(name, config.options)
    return resolve_algorithm(config.algorithm, config.options)


def check_timing(config: ExperimentConfig, cls: type) -> None:
    """``executor: timing`` trains nothing: an algorithm whose control reads training signals
    needs a declared stand-in (``Algorithm.timing_stand_in``), else a one-line refusal."""
    if config.executor != "timing":
        return
    if cls.training_signals and not cls.timing_stand_in:
        raise ConfigError(
            "executor",
            f"timing: {config.algorithm} {cls.training_signals}, and has no stand-in "
            "without training; use executor: sequential",
        )


def check_networked(config: ExperimentConfig, cls: type, options: Any) -> None:
    """``executor: networked`` runs the algorithm's plans on device processes
    (``Algorithm.networked_problem`` says why not), else a one-line refusal."""
    if config.executor != "networked":
        return
    why = cls.networked_problem(options)
    if why:
        raise ConfigError(
            "executor", f"networked: {config.algorithm} {why}; use executor: sequential"
        )


def check_aggregation(config: ExperimentConfig, cls: type) -> None:
    """``train.aggregation`` is one the algorithm's aggregation supports
    (``Algorithm.aggregations``), else a one-line refusal."""
    if config.train.aggregation not in cls.aggregations:
        raise ConfigError(
            "train.aggregation",
            f"{config.algorithm} supports {', '.join(cls.aggregations)} "
            f"(got {config.train.aggregation!r})",
        )


def check_server_optimizer(config: ExperimentConfig, cls: type) -> None:
    """``train.server_optimizer.name`` exists and the algorithm aggregates into the one global
    model every client starts from (``Algorithm.no_server_optimizer`` says why not)."""
    name = config.train.server_optimizer.name
    _choice(name, list(SERVER_OPTIMIZERS), "train.server_optimizer.name")
    if name == "none":
        return
    if cls.no_server_optimizer:
        raise ConfigError(
            "train.server_optimizer",
            f"{config.algorithm} {cls.no_server_optimizer}; use name: none",
        )


def check_fltrust(config: ExperimentConfig, cls: type) -> None:
    """FLTrust's ``g_0`` (``network.untrusted_aggregation: fltrust``) is the server's step from
    the one global model it sent (:mod:`splitfl.net.trust.reference`); an algorithm whose
    aggregate is not that model (``Algorithm.no_server_optimizer`` says why: IFCA's cluster
    models) would score its updates against another model's step, so it is refused."""
    if Rule.of_run(config).name != "fltrust" or not cls.no_server_optimizer:
        return
    raise ConfigError(
        "network.untrusted_aggregation",
        f"fltrust scores updates against the server's step from the one global model; "
        f"{config.algorithm} {cls.no_server_optimizer}; use centered_clip",
    )


def check_label_defence(config: ExperimentConfig, cls: type) -> None:
    """``train.defence.label_noise`` perturbs the gradients a U-shaped device sends about its
    own labels; in every other family the labels reach the server, so it is refused."""
    if config.train.defence.label_noise == "none":
        return
    if getattr(cls, "topology", None) is not UShaped:
        raise ConfigError(
            "train.defence.label_noise",
            f"protects labels that stay on the device (U-shaped, ushaped_sl); "
            f"{config.algorithm} sends its labels to the server",
        )


def check_smashed_defence(config: ExperimentConfig, cls: type) -> None:
    """``train.defence.noise_std`` and ``nopeek`` act on the smashed data a device sends the
    server; an algorithm that does not split the model (FedAvg and the FL baselines,
    ``Algorithm.splits_model``) sends none, so either would be silently ignored: refused.
    DP-SGD (``dp_noise``) still applies there, to the whole model the device trains."""
    if getattr(cls, "splits_model", True):
        return
    defence = config.train.defence
    for name in ("noise_std", "nopeek"):
        if getattr(defence, name) != 0:
            raise ConfigError(
                f"train.defence.{name}",
                f"acts on smashed data; {config.algorithm} trains the whole model on the "
                f"device and sends none: must be 0 (got {getattr(defence, name)})",
            )


def check_config(config: ExperimentConfig, config_dir: str | Path | None = None) -> None:
    """Static checks of every field and every registry name (``splitfl validate`` without
    the data), after importing the config's modules (searching ``config_dir`` too). Raises
    :class:`~splitfl.config.ConfigError`."""
    check_registries(config, config_dir)
    check_fields(config)
    check_algorithm(config)


def check_algorithm(config: ExperimentConfig) -> None:
    """The checks that need the algorithm (resolved once) and the registries' values."""
    cls, options = check_options(config)
    check_device_options(config)
    check_timing(config, cls)
    check_networked(config, cls, options)
    check_recipe(config, cls)
    check_aggregation(config, cls)
    check_server_optimizer(config, cls)
    check_fltrust(config, cls)
    check_label_defence(config, cls)
    check_smashed_defence(config, cls)
    check_record(config, cls)


def check_record(config: ExperimentConfig, cls: type) -> None:
    """``privacy.record`` keeps what the server receives at the cut: refused before any round
    runs for an algorithm whose plans' pattern gives its server no smashed data (the ring,
    the clusters; :func:`~splitfl.roles.cut_record.refuse_unrecorded`)."""
    if config.privacy.record is not None:
        refuse_unrecorded(cls.topology)


def with_imports(config: ExperimentConfig, imports: list[str] | None) -> ExperimentConfig:
    """``config`` with the modules of ``--import`` (``imports=``) added to its ``imports``."""
    if not imports:
        return config
    return config.replace(imports=list(dict.fromkeys([*config.imports, *imports])))


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    imports: list[str] | None = None,
):
    """Read a YAML config (or defaults when ``path`` is None), apply overrides, add the
    ``imports`` given, import them (searching the file's folder too), validate all of it
    (:func:`check_config`)."""
    config = with_imports(read_config(path, overrides), imports)
    folder = Path(path).resolve().parent if path is not None else None
    config = with_data_root(config, folder)
    check_registries(config, folder)
    check_algorithm(config)
    return config


def with_data_root(config: ExperimentConfig, config_dir: Path | None) -> ExperimentConfig:
    """A relative ``data.root`` is looked for where ``imports:`` are: the current directory
    first, then the config file's folder (``config_dir``); found only there, it becomes that
    absolute path (``config.yaml`` records it), else it stays as given (relative to the
    current directory, where a missing dataset is then reported)."""
    root = config.data.root
    if root is None or config_dir is None or Path(root).is_absolute() or Path(root).exists():
        return config
    beside = config_dir / root
    if not beside.exists():
        return config
    return config.replace(data=dataclasses.replace(config.data, root=str(beside)))
