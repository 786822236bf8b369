"""The run's clients' data: the dataset split among ``data.num_clients`` clients.

:func:`client_partition` is the one place the partition of a run is drawn (seeded by
``(seed, "partition")``): the experiment uses it for the simulated clients, and a device
process (:mod:`splitfl.net.device.agent`) uses it to find its own clients' samples in its copy of
the dataset, so both see the same samples.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import torch

from splitfl.config import ConfigError, ExperimentConfig
from splitfl.core.seeding import rng_for
from splitfl.data.base import DatasetBundle
from splitfl.data.local import write_local
from splitfl.data.partition import partition_indices
from splitfl.data.source import read_dataset


def _dirichlet_alpha(config: ExperimentConfig) -> tuple[str, float | None]:
    """``p = 1/δ`` convention: p = 0 means IID."""
    d = config.data
    if d.partition == "dirichlet" and d.p is not None:
        return ("iid", None) if d.p == 0 else ("dirichlet", 1.0 / d.p)
    return d.partition, d.alpha


def client_partition(config: ExperimentConfig, bundle: DatasetBundle) -> list[np.ndarray]:
    """Training-sample indices of each client (``config.data``'s scheme, seeded).

    Raises:
        ConfigError: where the data cannot be split as configured.
    """
    d = config.data
    n_train = len(bundle.train)
    if d.num_clients * d.min_samples > n_train:
        raise ConfigError(
            "data.num_clients",
            f"{d.num_clients} clients x min_samples {d.min_samples} exceeds the "
            f"{n_train} training samples of {d.dataset}",
        )
    scheme, alpha = _dirichlet_alpha(config)
    classes = len(np.unique(bundle.train.y.numpy()))
    if scheme == "shards" and d.classes_per_client > classes:
        raise ConfigError(
            "data.classes_per_client",
            f"must be <= the {classes} classes in the training labels of {d.dataset} for the "
            f"shards partition (got {d.classes_per_client})",
        )
    if scheme in ("natural", "folders") and bundle.train.writers is None:
        raise ConfigError("data.partition", f"{scheme!r} needs writer ids; {d.dataset} has none")
    try:
        return partition_indices(
            scheme,
            bundle.train.y.numpy(),
            d.num_clients,
            rng_for(config.seed, "partition"),
            alpha=alpha,
            dirichlet_cap=d.dirichlet_cap,
            classes_per_client=d.classes_per_client,
            writers=bundle.train.writers,
            min_samples=d.min_samples,
        )
    except ValueError as err:
        raise ConfigError("data.partition", str(err).splitlines()[0]) from err


def holdout_split(
    parts: list[np.ndarray], fraction: float, seed: int
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each client's partition split into its training samples and its held-out validation
    samples (``eval.client_holdout``; Flower's convention of a per-client validation split,
    scored by the client in federated evaluation): ``ceil(fraction · n)`` of its ``n``
    samples, at most ``n − 1``, drawn by the stream ``(seed, "holdout", client)`` — the same
    on every rerun and independent of the other clients. Both keep the partition's order.
    Returns (training indices, held-out indices) per client."""
    train, held = [], []
    for client, idx in enumerate(parts):
        k = min(math.ceil(fraction * len(idx)), max(len(idx) - 1, 0))
        out = np.zeros(len(idx), dtype=bool)
        out[rng_for(seed, "holdout", client).permutation(len(idx))[:k]] = True
        train.append(idx[~out])
        held.append(idx[out])
    return train, held


def write_partition(config: ExperimentConfig, folder: Path, devices: int) -> dict[str, list[int]]:
    """Write the run's seeded partition as own-data files: device ``local-<i>`` (the names
    ``splitfl launch`` gives its device processes) gets ``folder/local-<i>/<client>.npz`` for
    its clients ``k % devices == i``, each client's samples in partition order (so a device
    reading them draws the batches the simulation draws). Returns device → clients."""
    d = config.data
    # as stored (before data.transforms' normalize, which the devices apply as they read)
    bundle = read_dataset(dataclasses.replace(d, transforms=[]))
    parts = client_partition(config, bundle)
    out: dict[str, list[int]] = {}
    for i in range(devices):
        name = f"local-{i}"
        out[name] = [k for k in range(len(parts)) if k % devices == i]
        for k in out[name]:
            idx = torch.as_tensor(parts[k], dtype=torch.long)
            write_local(Path(folder) / name / f"{k}.npz", bundle.train.x[idx], bundle.train.y[idx])
    return out
