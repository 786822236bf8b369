"""Your own model and data for splitfl: a plain ``nn.Sequential`` and a pair of torch Datasets.

Nothing here imports splitfl's internals. splitfl finds this module because the config names
it (``imports: [my_project]``, ``model: my_project:small_cnn``, ``data.dataset:
my_project:digit_images``) and it sits next to the config; a device process finds it the same
way, or on its ``PYTHONPATH``.

The data are scikit-learn's bundled 8x8 digits (no download), served as a map-style torch
``Dataset`` of ``(image, label)`` items, as a user's own dataset class would be.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset


class DigitImages(Dataset):
    """``(image [1, 8, 8] in [0, 1], label)`` items of the digits at ``indices``."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, indices: np.ndarray):
        self.images = torch.as_tensor(images[indices] / 16.0, dtype=torch.float32).unsqueeze(1)
        self.targets = torch.as_tensor(labels[indices], dtype=torch.int64)  # spares a scan

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.images[i], int(self.targets[i])


def digit_images(root=None) -> tuple[Dataset, Dataset]:
    """The dataset callable: a ``(train, test)`` pair of torch Datasets (80 % / 20 %)."""
    from sklearn.datasets import load_digits

    raw = load_digits()
    order = np.random.default_rng(0).permutation(len(raw.target))
    cut = int(0.8 * len(order))
    return (
        DigitImages(raw.images, raw.target, order[:cut]),
        DigitImages(raw.images, raw.target, order[cut:]),
    )


def small_cnn(input_shape: tuple[int, ...], num_classes: int) -> nn.Sequential:
    """The model callable: a plain ``nn.Sequential``. Each top-level child is one block; a
    split may cut between any two of them (or declare ``cut_points`` on the Sequential)."""
    channels = input_shape[0]
    model = nn.Sequential(
        nn.Sequential(nn.Conv2d(channels, 16, 3, padding=1), nn.ReLU()),
        nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)),
        nn.Sequential(nn.Flatten(), nn.Linear(32 * (input_shape[1] // 2) ** 2, 64), nn.ReLU()),
        nn.Linear(64, num_classes),
    )
    model.cut_points = [1, 2, 3]  # optional: the default is every block boundary
    return model
