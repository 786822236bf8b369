"""Embedded default: scikit-learn's bundled 8×8 digits (1,797 images, 10 classes, no download)."""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import numpy as np
import torch

from splitfl.data.base import ArrayDataset, DatasetBundle, DatasetShape, register_dataset


@register_dataset(
    "digits",
    "scikit-learn's bundled 8x8 digits (embedded, no download)",
    False,
    DatasetShape((1, 8, 8), 10),
)
def load_digits(
    root: Path | None = None, test_fraction: float = 0.2, seed: int = 0
) -> DatasetBundle:
    """Digits scaled to [0, 1] and standardised, split train/test with a fixed permutation."""
    images, target = digits_arrays()
    x = (images.astype(np.float32) / 16.0 - 0.5) / 0.5
    y = target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    n_test = int(round(len(y) * test_fraction))
    test_idx, train_idx = order[:n_test], order[n_test:]

    def make(idx: np.ndarray) -> ArrayDataset:
        return ArrayDataset(torch.from_numpy(x[idx]).unsqueeze(1), torch.from_numpy(y[idx]))

    return DatasetBundle("digits", make(train_idx), make(test_idx), 10, (1, 8, 8), (-1.0,))


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits as ``(images (1797, 8, 8) float64, labels)``, the arrays of
    ``sklearn.datasets.load_digits()``: read from its bundled ``digits.csv.gz`` as it does,
    without importing scikit-learn (about a second of start-up); ``load_digits`` itself where
    that file is not found."""
    spec = importlib.util.find_spec("sklearn")
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    files = [Path(r) / "datasets" / "data" / "digits.csv.gz" for r in roots]
    path = next((f for f in files if f.is_file()), None)
    if path is None:
        from sklearn.datasets import load_digits as sk_load_digits

        raw = sk_load_digits()
        return raw.images, raw.target
    with gzip.open(path, mode="rt", encoding="utf-8") as f:
        data = np.loadtxt(f, delimiter=",")
    return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int, copy=False)
