"""In-memory datasets and the loader registry (``data.dataset: mnist`` in a config)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch


class DatasetNotFoundError(FileNotFoundError):
    """A dataset's files are missing; the message names the path and the expected files."""


@dataclass
class ArrayDataset:
    """A dataset held as tensors.

    Attributes:
        x: Inputs, float32, shape ``[N, *input_shape]`` (already normalised).
        y: Labels, int64, shape ``[N]``.
        writers: Optional per-sample writer/user id (int array ``[N]``) for natural partitions.
    """

    x: torch.Tensor
    y: torch.Tensor
    writers: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def subset(self, indices: np.ndarray) -> ArrayDataset:
        idx = torch.as_tensor(np.asarray(indices, dtype=np.int64))
        writers = None if self.writers is None else self.writers[np.asarray(indices)]
        return ArrayDataset(self.x[idx], self.y[idx], writers)


@dataclass
class DatasetBundle:
    """Train and test splits plus the facts a model needs."""

    name: str
    train: ArrayDataset
    test: ArrayDataset
    num_classes: int
    input_shape: tuple[int, ...]


Loader = Callable[..., DatasetBundle]  # loader(root: Path | None, **options) -> DatasetBundle


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    loader: Loader
    description: str
    needs_root: bool


DATASETS: dict[str, DatasetSpec] = {}


def register_dataset(name: str, description: str, needs_root: bool = True):
    """Decorator adding a loader to :data:`DATASETS` under ``name``."""

    def wrap(loader: Loader) -> Loader:
        DATASETS[name] = DatasetSpec(name, loader, description, needs_root)
        return loader

    return wrap


def dataset_names() -> list[str]:
    _load_all()
    return sorted(DATASETS)


def load_dataset(name: str, root: str | Path | None = None, **options) -> DatasetBundle:
    """Load registered dataset ``name`` from ``root`` (ignored by embedded datasets)."""
    _load_all()
    if name not in DATASETS:
        raise KeyError(f"unknown dataset {name!r}; choose one of {', '.join(sorted(DATASETS))}")
    spec = DATASETS[name]
    return spec.loader(Path(root) if root is not None else None, **options)


def require_files(folder: Path, names: list[str], dataset: str) -> None:
    """Raise :class:`DatasetNotFoundError` (one line) unless every file in ``names`` exists."""
    missing = [n for n in names if not (folder / n).exists()]
    if missing:
        raise DatasetNotFoundError(
            f"{dataset}: missing files in {folder}: expected {', '.join(names)}"
        )


def _load_all() -> None:
    import splitfl.data.loaders  # noqa: F401  (registers the loaders)
