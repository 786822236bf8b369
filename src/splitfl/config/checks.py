"""Static checks of a config (:func:`check_fields`): ranges of every float (:data:`FLOAT_RANGES`),
counts, devices, trackers, the network and privacy sections; no registry is consulted here.
Just over 400 lines: the static checks of every section are one list, read in one place."""

from __future__ import annotations

import importlib.util
import ipaddress
import os
import re
import sys
from typing import Any

import torch

from splitfl.config.choices import unknown_choice
from splitfl.config.network import COMPRESSIONS, TRUSTS
from splitfl.config.privacy import MAX_RECORDED, PrivacyConfig
from splitfl.config.ranges import FLOAT_RANGES
from splitfl.config.schema import (
    AGGREGATIONS,
    ATTN_IMPLEMENTATIONS,
    CLOCKS,
    DROP_LAST,
    EVAL_ON,
    PARALLEL_BACKENDS,
    TIED_WEIGHTS,
    TRACKERS,
    UNTRUSTED_AGGREGATIONS,
    ConfigError,
    DefenceConfig,
    ExperimentConfig,
)
from splitfl.core.extras import install_extra


def _check(ok: bool, path: str, message: str) -> None:
    if not ok:
        raise ConfigError(path, message)


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


def _validate_lora(lora: Any) -> None:
    """``train.lora``'s fields (a rank of at most 4096, a positive scale, dropout below 1,
    module names): checked here, the section being optional."""
    _check(1 <= lora.r <= 4096, "train.lora.r", f"must be in [1, 4096] (got {lora.r})")
    _check(0 < lora.alpha <= 1e4, "train.lora.alpha", f"must be in (0, 1e4] (got {lora.alpha})")
    _check(0 <= lora.dropout < 1, "train.lora.dropout", f"must be in [0, 1) (got {lora.dropout})")
    names = lora.target_modules
    _check(
        names is None or (len(names) > 0 and all(isinstance(n, str) and n for n in names)),
        "train.lora.target_modules",
        f"a non-empty list of module names, or null for peft's default (got {names})",
    )


def _choice(value: str, allowed: list[str], path: str) -> None:
    _check(value in allowed, path, unknown_choice(value, allowed))


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
            f"{name!r} needs the {package} package: {install_extra(name, package)}",
        )


#: Largest ``data.train_samples`` (a label vector of 10^8 int64 labels is 800 MB).
MAX_TRAIN_SAMPLES = 10**8


def check_fields(config: ExperimentConfig) -> None:
    """Static checks of every field that needs no registry (ranges, counts, devices, trackers).
    Names that live in registries (algorithm and its options, model, dataset, partition,
    executor, device preset) are checked one layer up, by
    :func:`splitfl.experiment.validation.check_config`; data-dependent checks (more clients
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
    _check(
        d.train_samples is None or 1 <= d.train_samples <= MAX_TRAIN_SAMPLES,
        "data.train_samples",
        f"must be in [1, {MAX_TRAIN_SAMPLES}] or null (got {d.train_samples})",
    )
    _check(
        d.train_samples is None or config.executor == "timing",
        "data.train_samples",
        "only with executor: timing (training reads the dataset's images); use null",
    )
    _choice(d.source, ["partition", "devices"], "data.source")
    _choice(config.hf.attn_implementation, list(ATTN_IMPLEMENTATIONS), "hf.attn_implementation")
    _choice(config.hf.tied_weights, list(TIED_WEIGHTS), "hf.tied_weights")
    _check(
        d.source == "partition" or config.executor == "networked",
        "data.source",
        "devices needs executor: networked (the devices hold the training data)",
    )
    _check(
        d.test_path is None or d.source == "devices",
        "data.test_path",
        "only with data.source: devices (else the test split of data.dataset is used)",
    )
    _check(
        d.image_size is None
        or (len(d.image_size) == 2 and all(1 <= v <= 8192 for v in d.image_size)),
        "data.image_size",
        f"must be [height, width] in pixels (1..8192) or null (got {d.image_size})",
    )
    _check(bool(d.label_column), "data.label_column", "must name a column")
    v = config.devices
    _check(v.label_bytes >= 0, "devices.label_bytes", "must be >= 0")
    _check(v.variation >= 0, "devices.variation", f"must be >= 0 (got {v.variation})")
    _check(v.variation_period >= 1, "devices.variation_period", "must be >= 1")
    _check(
        v.contention is None or isinstance(v.contention, bool),
        "devices.contention",
        "must be true, false or null (null: the preset's paper model)",
    )
    _check(
        v.d2d_rate is None or v.d2d_rate > 0, "devices.d2d_rate", f"must be > 0 (got {v.d2d_rate})"
    )

    t = config.train
    _check(
        t.lr_min <= t.lr,
        "train.lr_min",
        f"must be <= train.lr={t.lr:g} (got {t.lr_min:g}; the rate is max(lr_min, lr * decay^h))",
    )
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
    r = t.explode_recovery
    _check(
        not r or 1 <= r <= (f or r),
        "train.explode_recovery",
        f"must be in [1, train.explode_factor={f}], or 0/null to disable (got {r})",
    )
    _choice(t.aggregation, list(AGGREGATIONS), "train.aggregation")
    _check(
        t.drop_last in DROP_LAST,  # a bool or a string (the schema's coercion)
        "train.drop_last",
        f"one of false, true, single, auto (got {t.drop_last!r})",
    )
    if t.lora is not None:
        _validate_lora(t.lora)
    _validate_defence(t.defence)
    e = config.eval
    _check(e.every >= 1, "eval.every", "must be >= 1")
    _check(
        len(e.metrics) >= 1 and len(set(e.metrics)) == len(e.metrics),
        "eval.metrics",
        f"a non-empty list without repeats, like [accuracy] (got {e.metrics})",
    )
    _check(e.batch_size >= 1, "eval.batch_size", "must be >= 1")
    _validate_eval_on(config)
    _check(config.output.checkpoint_every >= 1, "output.checkpoint_every", "must be >= 1")
    points = config.split.cut_points
    _check(
        points is None or (len(points) > 0 and all(p.strip() for p in points)),
        "split.cut_points",
        "module paths, at least one and none blank (null: after every top-level child)",
    )
    _validate_tracking(config.output.tracking)
    _validate_network(config)
    _validate_parallel(config)
    check_privacy(config.privacy, config.rounds, config.data.num_clients, config.data.source)


def check_privacy(privacy: PrivacyConfig, rounds: int, num_clients: int, source: str) -> None:
    """``privacy.record``: clients (unless null) in ``[0, num_clients)`` and rounds in
    ``[1, rounds]``, each list distinct with 1 to :data:`MAX_RECORDED` entries, ``batches`` in
    ``[1, MAX_RECORDED]``; ``data.source: partition`` (the indices point into its data)."""
    rec = privacy.record
    if rec is None:
        return
    lists = [("rounds", rec.rounds, 1, rounds)]
    if rec.clients is not None:  # null: every client a recorded round selects
        lists.append(("clients", rec.clients, 0, num_clients - 1))
    for name, values, lo, hi in lists:
        path = f"privacy.record.{name}"
        _check(0 < len(values) <= MAX_RECORDED, path, f"1 to {MAX_RECORDED} entries")
        _check(len(set(values)) == len(values), path, f"entries must be distinct ({values[:9]})")
        bad = [v for v in values if not lo <= v <= hi] or [None]
        _check(bad[0] is None, path, f"each must be in [{lo}, {hi}] (got {bad[0]})")
    _check(1 <= rec.batches <= MAX_RECORDED, "privacy.record.batches", f"in [1, {MAX_RECORDED}]")
    _check(
        source == "partition",
        "privacy.record",
        "needs data.source: partition (the record's sample indices point into the server's "
        "copy of the training data; devices with their own data have none there)",
    )


def _validate_defence(c: DefenceConfig) -> None:
    """``train.defence``'s choices and combinations (ranges: ``config/ranges.py``)."""
    _choice(c.label_noise, ["none", "max_norm", "marvell"], "train.defence.label_noise")
    _check(
        c.dp_noise == 0 or c.nopeek == 0,
        "train.defence.dp_noise",
        "DP-SGD clips per-sample gradients; NoPeek's loss couples the samples of a batch "
        "(its per-sample gradients are not one sample's): set nopeek: 0 or dp_noise: 0",
    )


def _validate_eval_on(config: ExperimentConfig) -> None:
    """``eval.on``: a known value; client-side evaluation needs the clients' samples in this
    process (not ``executor: networked``) and leaves the server's test accuracy unrecorded
    with ``clients`` alone (``eval.target_accuracy`` needs it)."""
    e = config.eval
    _choice(e.on, list(EVAL_ON), "eval.on")
    _check(
        e.on == "server" or config.executor != "networked",
        "eval.on",
        f"{e.on} needs the clients' held-out samples in this process; executor: networked "
        "evaluates on the server only (use eval.on: server)",
    )
    _check(
        e.on != "clients" or e.target_accuracy is None,
        "eval.target_accuracy",
        "is the server's test accuracy; with eval.on: clients there is none (use both, or null)",
    )


#: Most workers ``executor: parallel`` may start.
MAX_WORKERS = 1024


def _validate_parallel(config: ExperimentConfig) -> None:
    """The ``parallel`` section: worker count, backend, threads, GPUs (only on a GPU device,
    and needed there with Ray, which gives an actor no GPU it did not ask for)."""
    p = config.parallel
    _check(1 <= p.workers <= MAX_WORKERS, "parallel.workers", f"must be in [1, {MAX_WORKERS}]")
    _choice(p.backend, list(PARALLEL_BACKENDS), "parallel.backend")
    _check(1 <= p.threads <= MAX_THREADS, "parallel.threads", f"must be in [1, {MAX_THREADS}]")
    _check(0 <= p.max_retries <= 100, "parallel.max_retries", "must be in [0, 100]")
    check_ray_address(p.address, "parallel.address")
    _check(
        p.address is None or p.backend == "ray",
        "parallel.address",
        "a Ray cluster address needs parallel.backend: ray",
    )
    if config.executor != "parallel":
        return
    gpu = config.device.startswith("cuda") or resolve_device(config.device) == "cuda"
    _check(
        p.gpus_per_worker == 0 or gpu,
        "parallel.gpus_per_worker",
        f"needs device: cuda (device is {config.device})",
    )
    _check(
        p.gpus_per_worker > 0 or not gpu or p.backend == "local",
        "parallel.gpus_per_worker",
        "must be > 0 with device: cuda and backend: ray (Ray actors see only GPUs they ask for)",
    )


#: A Ray cluster address: ``[scheme://]host:port`` (``ray://host:10001`` for Ray Client,
#: ``host:6379`` for the head node itself).
RAY_ADDRESS = re.compile(r"(?:[a-z][a-z0-9+.-]*://)?(\[[0-9A-Fa-f:.]+\]|[\w.-]+):(\d{1,5})")


def check_ray_address(address: str | None, field: str) -> tuple[str, int] | None:
    """One-line ConfigError on ``field`` unless ``address`` is None, ``auto`` (the cluster
    this machine belongs to), ``local`` (a new local instance) or ``[scheme://]host:port``;
    returns ``(host, port)`` for the last form, else None. Sweeps (``--address``) and
    ``executor: parallel`` (``parallel.address``, ``splitfl run --address``) share it."""
    if address is None or address in ("auto", "local"):
        return None
    match = RAY_ADDRESS.fullmatch(address)
    _check(
        match is not None and 0 < int(match[2]) < 65536,
        field,
        f"{address!r} is not a Ray cluster address; give auto, ray://host:10001 or host:6379",
    )
    return match[1].removeprefix("[").removesuffix("]"), int(match[2])


def is_loopback(host: str) -> bool:
    """Whether ``host`` (of a ``host:port`` address) is ``localhost`` or a loopback IP
    literal (``127.0.0.0/8``, ``::1``); a host *name* such as ``127.example.org`` is not."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.removeprefix("[").removesuffix("]")).is_loopback
    except ValueError:
        return False


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
    _choice(n.trust, list(TRUSTS), "network.trust")
    _choice(n.untrusted_aggregation, list(UNTRUSTED_AGGREGATIONS), "network.untrusted_aggregation")
    _check(  # FLTrust's g0 is the server's step on these samples (aggregation/robust.py)
        n.untrusted_aggregation != "fltrust" or n.bounds.reference_samples > 0,
        "network.bounds.reference_samples",
        "must be > 0 with network.untrusted_aggregation: fltrust (the server's own step "
        "on them is FLTrust's g0)",
    )
    _check(n.devices >= 0, "network.devices", f"must be >= 0 (got {n.devices})")
    _check(  # a slice of the test set: more than this is an evaluation, not a yardstick
        0 <= n.bounds.reference_samples <= 4096,
        "network.bounds.reference_samples",
        f"must be in [0, 4096] (got {n.bounds.reference_samples})",
    )
    _check(
        0 <= n.late_bench_rounds <= 1000,
        "network.late_bench_rounds",
        f"must be in [0, 1000] (got {n.late_bench_rounds})",
    )
    _check(
        n.min_devices is None or n.min_devices >= 1, "network.min_devices", "must be >= 1 or null"
    )
    _check(
        1 <= n.chunk_kb <= 65536, "network.chunk_kb", f"must be in [1, 65536] (got {n.chunk_kb})"
    )
    _check(
        n.data_dir is None or (n.devices >= 1 and config.data.source == "devices"),
        "network.data_dir",
        "needs network.devices >= 1 and data.source: devices",
    )
    for name, lo in (("max_hello_kb", 1), ("max_pending", 1), ("max_devices", 1)):
        value = getattr(n, name)
        _check(value >= lo, f"network.{name}", f"must be >= {lo} (got {value})")
    _check(n.auth_failures >= 0, "network.auth_failures", f"must be >= 0 (got {n.auth_failures})")
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
    loopback = is_loopback(host)
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
