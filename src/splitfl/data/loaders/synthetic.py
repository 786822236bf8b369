"""A generated CIFAR-shaped dataset for benchmarks and scale tests (no files, no download)."""

from __future__ import annotations

from pathlib import Path

import torch

from splitfl.data.base import ArrayDataset, DatasetBundle, DatasetShape, register_dataset

#: Sizes of the generated splits (3×32×32 float32: 20,000 images ≈ 246 MB).
SYNTHETIC_TRAIN, SYNTHETIC_TEST, SYNTHETIC_CLASSES = 20_000, 2_000, 10


def _make(n: int, prototypes: torch.Tensor, gen: torch.Generator) -> ArrayDataset:
    y = torch.randint(0, prototypes.shape[0], (n,), generator=gen)
    x = prototypes[y] + torch.randn(n, *prototypes.shape[1:], generator=gen)
    return ArrayDataset(x, y)


@register_dataset(
    "synthetic_cifar",
    "generated CIFAR-shaped images (3x32x32, 10 classes: class prototype + unit noise), "
    "for benchmarks; embedded, no download",
    False,
    DatasetShape((3, 32, 32), SYNTHETIC_CLASSES),
)
def load_synthetic_cifar(root: Path | None = None, seed: int = 0) -> DatasetBundle:
    """Each class is a fixed random image (scaled by 0.5) plus N(0, 1) noise per sample, so
    models can learn it; the same ``seed`` always gives the same tensors."""
    del root
    gen = torch.Generator().manual_seed(seed)
    prototypes = 0.5 * torch.randn(SYNTHETIC_CLASSES, 3, 32, 32, generator=gen)
    train = _make(SYNTHETIC_TRAIN, prototypes, gen)
    test = _make(SYNTHETIC_TEST, prototypes, gen)
    return DatasetBundle("synthetic_cifar", train, test, SYNTHETIC_CLASSES, (3, 32, 32))
