"""Embedded default: scikit-learn's bundled 8×8 digits (1,797 images, 10 classes, no download)."""

from __future__ import annotations

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
    from sklearn.datasets import load_digits as sk_load_digits

    raw = sk_load_digits()
    x = (raw.images.astype(np.float32) / 16.0 - 0.5) / 0.5
    y = raw.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    n_test = int(round(len(y) * test_fraction))
    test_idx, train_idx = order[:n_test], order[n_test:]

    def make(idx: np.ndarray) -> ArrayDataset:
        return ArrayDataset(torch.from_numpy(x[idx]).unsqueeze(1), torch.from_numpy(y[idx]))

    return DatasetBundle("digits", make(train_idx), make(test_idx), 10, (1, 8, 8), (-1.0,))
