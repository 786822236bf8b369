"""Experiment configuration: frozen dataclasses as the schema, YAML files, ``key=value`` overrides.

Everything is checked by :func:`validate` before any work starts; a bad value raises
:class:`ConfigError`, whose message is one line naming the field and what is allowed.
Integers must fit in 64 bits and floats must be finite; each float field has an allowed range
(:data:`FLOAT_RANGES`). YAML text (files and override values) is refused with one line before
it is expanded when it is larger than :data:`MAX_YAML_BYTES`, nests deeper than
:data:`MAX_YAML_DEPTH` or holds more than :data:`MAX_YAML_VALUES` values once its aliases are
expanded (an alias bomb); syntax errors and non-UTF-8 files are one-line errors too.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import math
import os
import re
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from splitfl.yaml_limits import MAX_YAML_BYTES, yaml_limit_violation


class ConfigError(ValueError):
    """A config value is invalid. ``str(err)`` is one line: ``<field>: <what is allowed>``."""

    def __init__(self, field_path: str, message: str):
        super().__init__(f"{field_path}: {message}")
        self.field_path = field_path


@dataclass(frozen=True)
class DataConfig:
    """Dataset and partition. ``alpha`` is the Dirichlet concentration (S²FL's ``a``,
    MergeSFL's ``δ``); ``p = 1/δ`` may be given instead (``p = 0`` means IID).
    ``dirichlet_cap`` stops dealing to clients that hold ``N/num_clients`` samples already
    (NIID-Bench/FedMR rule; needed for small alpha with many small clients).
    ``verify`` compares standard files (MNIST, Fashion-MNIST, CIFAR-10/100) holding the canonical
    number of samples with their published MD5s: ``warn`` (one line naming the file), ``strict``
    (an error) or ``off``."""

    dataset: str = "digits"
    root: str | None = None
    partition: str = "dirichlet"
    alpha: float | None = 0.5
    p: float | None = None
    dirichlet_cap: bool = False
    classes_per_client: int = 2
    num_clients: int = 20
    min_samples: int = 10
    verify: str = "warn"


@dataclass(frozen=True)
class DevicesConfig:
    """Device population: a preset, its High:Mid:Low composition, seeded time jitter.

    ``variation``: σ of per-client log-normal factors on FLOPS and on link rates, redrawn every
    ``variation_period`` rounds (time-varying devices; 0 = static profiles).
    ``contention``: participants' concurrent transfers share the server's link (and a top
    worker's D2D radio), see ``splitfl.system.cost``; ``false`` = S²FL Eq. (1) exactly.
    ``d2d_rate``: device-to-device rate in B/s for every device (null = the preset's).
    """

    preset: str = "s2fl_table1"
    composition: str = "uniform"
    jitter: float = 0.0
    label_bytes: int = 0
    variation: float = 0.0
    variation_period: int = 1
    contention: bool = True
    d2d_rate: float | None = None
    #: Fixed time per message exchange between a device and the server (one per mini-batch,
    #: one per model transfer), on top of bytes / rate: serialisation, protocol and per-message
    #: latency, which S²FL Eq. 1 leaves out. 0 (the default) is Eq. 1 exactly;
    #: ``benchmarks/clock_validation.py`` measures it for a deployment.
    exchange_latency_s: float = 0.0


@dataclass(frozen=True)
class TrainConfig:
    """Local training. ``local_steps`` (if set) replaces ``local_epochs`` by a fixed number of
    iterations per round. Defaults follow S²FL §5 (batch 128, SGD lr 0.01). The learning rate
    of round h is ``max(lr_min, lr * lr_decay**h)`` (MergeSFL §V-A: 0.993 per round)."""

    clients_per_round: int = 10
    batch_size: int = 128
    lr: float = 0.01
    lr_decay: float = 1.0
    lr_min: float = 0.0
    momentum: float = 0.0
    weight_decay: float = 0.0
    local_epochs: int = 1
    local_steps: int | None = None
    #: Explosion check (a divergence that never reaches NaN/inf): stop with exit code 3 when
    #: the round's training loss exceeds ``explode_factor`` × the initial model's test loss
    #: for ``explode_rounds`` rounds in a row (the papers are silent; a careful default that
    #: the shipped configs stay far below, even with lr=1); 0 or null disables.
    explode_factor: float | None = 100.0
    explode_rounds: int | None = 3


@dataclass(frozen=True)
class EvalConfig:
    every: int = 1
    batch_size: int = 1000
    target_accuracy: float | None = None


#: Optional per-round metric loggers for ``output.tracking`` and the package each needs.
TRACKERS = {"tensorboard": "tensorboard", "mlflow": "mlflow"}


@dataclass(frozen=True)
class OutputConfig:
    """Where and how a run is written. ``tracking`` lists optional loggers that receive each
    round's metrics row (``tensorboard``, ``mlflow``; extras of the same names); the run
    directory stays the source of truth."""

    out_dir: str = "runs"
    name: str | None = None
    checkpoint_every: int = 10
    progress: bool = True
    tracking: list[str] = field(default_factory=list)


#: ``clock`` values: what the algorithms observe — the cost model's simulated times, or (with
#: ``executor: networked``) the times measured on the devices.
CLOCKS = ("simulated", "measured")
#: ``network.compression`` values (gRPC message compression).
COMPRESSIONS = ("none", "gzip")


@dataclass(frozen=True)
class NetworkConfig:
    """``executor: networked``: the server listens on ``listen`` (``host:port``, port 0 =
    any free port) and trains with device processes over gRPC. ``devices`` > 0 starts that
    many device processes on this machine (``splitfl launch``; clients dealt round-robin);
    0 waits for devices started elsewhere (``splitfl server``) — at least ``min_devices``
    (default: ``devices``, or 1) within ``connect_timeout_s``; before each round it waits up
    to ``rejoin_s`` for lost devices to reconnect. A device that does not answer within
    ``timeout_s`` is dropped for the round. A non-loopback ``listen`` needs ``tls_cert`` and
    ``tls_key`` unless ``insecure``; ``tokens`` is the server's tokens file (``name:sha256``
    lines, made by ``splitfl token``). Messages above ``max_message_mb`` are refused; they
    travel in chunks of ``chunk_kb`` (devices follow the server's); ``rate_limit`` caps
    messages per second per device (0: no cap)."""

    listen: str = "127.0.0.1:0"
    devices: int = 2
    min_devices: int | None = None
    timeout_s: float = 60.0
    connect_timeout_s: float = 120.0
    rejoin_s: float = 30.0
    tls_cert: str | None = None
    tls_key: str | None = None
    ca_cert: str | None = None
    tokens: str | None = None
    insecure: bool = False
    max_message_mb: float = 256.0
    chunk_kb: int = 4096
    compression: str = "none"
    rate_limit: float = 0.0
    #: Devices emulate their ``devices.preset`` profiles: compute stretched to the profile's
    #: FLOPS, transfers held for bytes / rate (``splitfl.net.emulation``).
    emulate: bool = False


@dataclass(frozen=True)
class ExperimentConfig:
    """One experiment. ``options`` maps an algorithm name to its options (see ``splitfl list``).

    ``executor`` picks the training engine (``sequential`` reference loop or ``vectorized``
    batched clients), ``device`` where it trains (``cpu``, ``cuda``, ``cuda:N`` or ``auto``),
    ``precision`` ``fp32`` or ``bf16`` autocast, ``channels_last`` the image memory layout.
    ``threads`` sets torch's intra-op threads and the BLAS libraries' threads during the run
    (default 1: per-client mini-batches of small models run fastest single-threaded, busy-waiting
    thread pools collapse when several processes share a few cores, and scipy's optimisers give
    the same digits in a shell and in a Ray worker; null keeps the libraries' defaults, better
    for big models on CPU).
    """

    algorithm: str = "s2fl"
    model: str = "cnn_digits"
    rounds: int = 30
    seed: int = 0
    executor: str = "sequential"
    device: str = "cpu"
    precision: str = "fp32"
    channels_last: bool = False
    threads: int | None = 1
    clock: str = "simulated"
    data: DataConfig = field(default_factory=DataConfig)
    devices: DevicesConfig = field(default_factory=DevicesConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    options: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> ExperimentConfig:
        return dataclasses.replace(self, **changes)


# ----------------------------------------------------------------------------- parsing


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _short(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters, for one-line messages."""
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**limit else "<huge int>"
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def _coerce(value: Any, tp: Any, path: str) -> Any:
    """Check/convert ``value`` to annotation ``tp`` (int, float, bool, str, X | None, dict)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(value, inner[0], path)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(path, f"expected a mapping, got {_short(value)}")
        return from_dict(tp, value, f"{path}.")
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(path, f"expected a mapping, got {_short(value)}")
        return dict(value)
    if origin is list:
        if isinstance(value, str):  # `output.tracking=mlflow` means [mlflow]
            value = [value]
        if not isinstance(value, list | tuple):
            raise ConfigError(path, f"expected a list, got {_short(value)}")
        (item,) = typing.get_args(tp) or (Any,)
        return [v if item is Any else _coerce(v, item, path) for v in value]
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
        return value
    raise ConfigError(path, f"unsupported type {_type_name(tp)}")


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
        if key not in names:
            raise ConfigError(path, f"unknown field; allowed: {', '.join(names)}")
        kwargs[key] = _coerce(value, hints[key], path)
    for name in names:
        if name not in kwargs and dataclasses.is_dataclass(hints[name]):
            kwargs[name] = from_dict(hints[name], {}, f"{prefix}{name}.")
    return cls(**kwargs)


def load_yaml(text: str, field: str = "config", source: str = "YAML text") -> Any:
    """``yaml.safe_load`` without YAML 1.1's base-60 numbers, so ``8:1:1:1:1`` stays a string
    (plain ``safe_load`` reads it as the integer 1731661).

    Text beyond the bounds of :mod:`splitfl.yaml_limits` (size, nesting, expanded aliases) and
    text that does not parse raise a one-line :class:`ConfigError` on ``field`` that names
    ``source`` (a file, an override).
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


def _yaml_loader() -> type:
    """The SafeLoader subclass of :func:`load_yaml` (YAML 1.2-style ints and floats)."""
    int_tag, float_tag = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"

    class Loader(yaml.SafeLoader):
        pass

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


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of a raw config mapping with dotted ``key=value`` overrides applied."""

    out = copy.deepcopy(data)
    for text in overrides:
        set_dotted(out, *parse_override(text))
    return out


def load_config(path: str | Path | None = None, overrides: list[str] | None = None):
    """Read a YAML config (or defaults when ``path`` is None), apply overrides, run the static
    checks (:func:`validate`); registry names are checked by
    :func:`splitfl.experiment.validation.load_config`."""
    data = read_yaml_mapping(path) if path is not None else {}
    data = apply_overrides(data, overrides or [])
    config = from_dict(ExperimentConfig, data)
    validate(config)
    return config


def dump_config(config: ExperimentConfig, path: Path) -> None:
    path.write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))


# ----------------------------------------------------------------------------- validation


def _check(ok: bool, path: str, message: str) -> None:
    if not ok:
        raise ConfigError(path, message)


@dataclass(frozen=True)
class Range:
    """Allowed interval of a float field; ``lo_open``/``hi_open`` exclude that end point."""

    lo: float
    hi: float
    lo_open: bool = False
    hi_open: bool = False

    def __str__(self) -> str:
        left, right = "(" if self.lo_open else "[", ")" if self.hi_open else "]"
        return f"{left}{self.lo:g}, {self.hi:g}{right}"

    def violation(self, value: float) -> str | None:
        """``must be > lo`` (or ``>=``, ``<``, ``<=``) where ``value`` is outside, else None."""
        if value < self.lo or (self.lo_open and value == self.lo):
            return f"must be {'>' if self.lo_open else '>='} {self.lo:g}"
        if value > self.hi or (self.hi_open and value == self.hi):
            return f"must be {'<' if self.hi_open else '<='} {self.hi:g}"
        return None


#: Allowed range of every float field (null, where allowed, is not checked). Upper ends the
#: papers never approach guard against typos and overflow: alpha 1e6 is IID already (and
#: p = 1/alpha up to 1e6), a log-normal jitter sigma of 10 already spans factors of e^±30,
#: weight decay (an L2 coefficient, 5e-4 where the papers use it) above 1 is beyond any use;
#: learning rates up to 1e9 stay allowed (a huge one is how divergence, exit 3, is tested).
FLOAT_RANGES: dict[str, Range] = {
    "data.alpha": Range(0, 1e6, lo_open=True),
    "data.p": Range(0, 1e6),
    "devices.jitter": Range(0, 10),
    "devices.variation": Range(0, 10),
    "devices.d2d_rate": Range(0, 1e15, lo_open=True),
    "devices.exchange_latency_s": Range(0, 10),
    "train.lr": Range(0, 1e9, lo_open=True),
    "train.lr_decay": Range(0, 1, lo_open=True),
    "train.lr_min": Range(0, 1e9),
    "train.momentum": Range(0, 1, hi_open=True),
    "train.weight_decay": Range(0, 1),
    "train.explode_factor": Range(0, 1e30),
    "eval.target_accuracy": Range(0, 1, lo_open=True),
    "network.timeout_s": Range(0, 86400, lo_open=True),
    "network.connect_timeout_s": Range(0, 86400, lo_open=True),
    "network.rejoin_s": Range(0, 86400),
    "network.max_message_mb": Range(0, 4096, lo_open=True),
    "network.rate_limit": Range(0, 1e9),
}
#: ``seed`` feeds numpy's SeedSequence and torch.manual_seed: a non-negative 63-bit integer.
SEED_LIMIT = 2**63
#: Most torch/BLAS threads ``threads`` may ask for.
MAX_THREADS = 4096


def _check_float_ranges(config: ExperimentConfig) -> None:
    """Every field of :data:`FLOAT_RANGES` that is set lies in its range."""
    for path, allowed in FLOAT_RANGES.items():
        value: Any = config
        for part in path.split("."):
            value = getattr(value, part)
        problem = None if value is None else allowed.violation(value)
        _check(problem is None, path, f"{problem} (got {value}); allowed {allowed}")


def _choice(value: str, allowed: list[str], path: str) -> None:
    _check(value in allowed, path, f"unknown {value!r}; allowed: {', '.join(allowed)}")


def resolve_device(name: str) -> str:
    """``auto`` → ``cuda`` when a GPU is visible, else ``cpu``; other names unchanged."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def _check_device(name: str) -> None:
    ok = name in ("cpu", "auto") or (
        name.startswith("cuda") and (name == "cuda" or name[5:].isdigit() and name[4] == ":")
    )
    _check(ok, "device", f"one of cpu, cuda, cuda:N, auto (got {name!r})")
    if name.startswith("cuda"):
        _check(
            torch.cuda.is_available(),
            "device",
            f"{name} requested but no CUDA GPU is visible (torch.cuda.is_available() is False)",
        )


def _installed(package: str) -> bool:
    """Importable without importing it (a ``None`` entry in ``sys.modules`` blocks it)."""
    if package in sys.modules:
        return sys.modules[package] is not None
    return importlib.util.find_spec(package) is not None


def _validate_tracking(tracking: list[str]) -> None:
    """Known tracker names, each installed (its extra), before any work starts."""
    for name in tracking:
        _choice(name, list(TRACKERS), "output.tracking")
        package = TRACKERS[name]
        _check(
            _installed(package),
            "output.tracking",
            f"{name!r} needs the {package} package: pip install 'splitfl[{name}]'",
        )


def validate(config: ExperimentConfig) -> None:
    """Static checks of every field that needs no registry (ranges, counts, devices, trackers).
    Names that live in registries (algorithm and its options, model, dataset, partition,
    executor, device preset) are checked one layer up, by
    :func:`splitfl.experiment.validation.validate_config`; data-dependent checks (more clients
    than samples, cut points of the model) in
    :func:`splitfl.experiment.context.build_context` before the run directory is created."""
    _check_device(config.device)
    _check(
        config.threads is None or 1 <= config.threads <= MAX_THREADS,
        "threads",
        f"must be in [1, {MAX_THREADS}] or null (got {config.threads})",
    )
    _check(config.rounds >= 1, "rounds", f"must be >= 1 (got {config.rounds})")
    _check(0 <= config.seed < SEED_LIMIT, "seed", f"must be in [0, 2**63) (got {config.seed})")
    _check_float_ranges(config)
    d = config.data
    if d.partition == "dirichlet":
        _check(d.p is not None or d.alpha is not None, "data.alpha", "set alpha > 0 (or p >= 0)")
    _check(d.classes_per_client >= 1, "data.classes_per_client", "must be >= 1")
    _check(d.num_clients >= 1, "data.num_clients", f"must be >= 1 (got {d.num_clients})")
    _check(d.min_samples >= 1, "data.min_samples", f"must be >= 1 (got {d.min_samples})")
    v = config.devices
    _check(v.label_bytes >= 0, "devices.label_bytes", "must be >= 0")
    _check(v.variation >= 0, "devices.variation", f"must be >= 0 (got {v.variation})")
    _check(v.variation_period >= 1, "devices.variation_period", "must be >= 1")
    _check(isinstance(v.contention, bool), "devices.contention", "must be true or false")
    _check(
        v.d2d_rate is None or v.d2d_rate > 0, "devices.d2d_rate", f"must be > 0 (got {v.d2d_rate})"
    )
    t = config.train
    _check(
        1 <= t.clients_per_round <= d.num_clients,
        "train.clients_per_round",
        f"must be in [1, data.num_clients={d.num_clients}] (got {t.clients_per_round})",
    )
    _check(t.batch_size >= 1, "train.batch_size", f"must be >= 1 (got {t.batch_size})")
    _check(t.local_epochs >= 1, "train.local_epochs", f"must be >= 1 (got {t.local_epochs})")
    _check(t.local_steps is None or t.local_steps >= 1, "train.local_steps", "must be >= 1 or null")
    f, k = t.explode_factor, t.explode_rounds
    _check(not f or f > 1, "train.explode_factor", f"must be > 1, or 0/null to disable (got {f})")
    _check(not k or k >= 1, "train.explode_rounds", f"must be >= 1, or 0/null to disable (got {k})")
    e = config.eval
    _check(e.every >= 1, "eval.every", "must be >= 1")
    _check(e.batch_size >= 1, "eval.batch_size", "must be >= 1")
    _check(config.output.checkpoint_every >= 1, "output.checkpoint_every", "must be >= 1")
    _validate_tracking(config.output.tracking)
    _validate_network(config)


def _validate_network(config: ExperimentConfig) -> None:
    """``clock``, and the ``network`` section's counts, addresses and TLS files."""
    _choice(config.clock, list(CLOCKS), "clock")
    networked = config.executor == "networked"
    _check(
        config.clock == "simulated" or networked,
        "clock",
        "measured needs executor: networked (the simulated executors measure nothing)",
    )
    n = config.network
    _choice(n.compression, list(COMPRESSIONS), "network.compression")
    _check(n.devices >= 0, "network.devices", f"must be >= 0 (got {n.devices})")
    _check(
        n.min_devices is None or n.min_devices >= 1, "network.min_devices", "must be >= 1 or null"
    )
    _check(
        1 <= n.chunk_kb <= 65536, "network.chunk_kb", f"must be in [1, 65536] (got {n.chunk_kb})"
    )
    host, sep, port = n.listen.rpartition(":")
    _check(
        bool(sep and host) and port.isdigit() and int(port) < 65536,
        "network.listen",
        f"expected host:port (got {n.listen!r})",
    )
    _check(
        (n.tls_cert is None) == (n.tls_key is None),
        "network.tls_cert",
        "give both tls_cert and tls_key (or neither)",
    )
    loopback = host in ("localhost", "[::1]", "::1") or host.startswith("127.")
    _check(
        not networked or loopback or n.tls_cert is not None or n.insecure,
        "network.listen",
        f"refusing to listen on {host} without TLS: give network.tls_cert and "
        "network.tls_key (or network.insecure: true on a network you trust)",
    )
    for name in ("tls_cert", "tls_key", "ca_cert", "tokens"):
        path = getattr(n, name)
        _check(
            not networked or path is None or os.path.isfile(path),
            f"network.{name}",
            f"no such file: {path}",
        )
