"""CIFAR-10 and CIFAR-100 from the python pickle batches (no md5 or size checks).

Folder layout: CIFAR-10 in ``root/cifar-10-batches-py/`` or ``root/CIFAR10/cifar-10-batches-py/``
(``data_batch_1`` .. ``data_batch_5``, ``test_batch``; ``batches.meta`` unused); CIFAR-100 in
``root/cifar-100-python/`` or ``root/CIFAR100/cifar-100-python/`` (``train``, ``test``; ``meta``
unused). ``root`` may also point at the batch folder itself. Batches may be smaller than the
originals (e.g. class-balanced subsets). Images become float32 ``[N, 3, 32, 32]`` standardised
with the usual per-channel training-set mean/std.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

from splitfl.data.base import DatasetBundle, register_dataset
from splitfl.data.loaders._common import find_folder, to_dataset

CIFAR10_FILES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
CIFAR100_FILES = ["train", "test"]
CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN, CIFAR100_STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)


def read_batch(path: Path) -> dict:
    """Unpickle one CIFAR batch (Python-2 pickles, hence ``encoding='latin1'``)."""
    with open(path, "rb") as fh:
        return pickle.load(fh, encoding="latin1")


def _images(batch: dict) -> np.ndarray:
    data = np.asarray(batch["data"], dtype=np.uint8)
    return data.reshape(-1, 3, 32, 32)


@register_dataset("cifar10", "CIFAR-10 python batches (root/cifar-10-batches-py/)")
def load_cifar10(root: Path | None = None) -> DatasetBundle:
    """CIFAR-10: 10 classes of 32x32 colour images (any number of images per batch)."""
    folder = find_folder(
        root, ["cifar-10-batches-py", "CIFAR10/cifar-10-batches-py"], CIFAR10_FILES, "cifar10"
    )
    train_batches = [read_batch(folder / n) for n in CIFAR10_FILES[:-1]]
    test_batch = read_batch(folder / "test_batch")
    train_x = np.concatenate([_images(b) for b in train_batches])
    train_y = np.concatenate([np.asarray(b["labels"], dtype=np.int64) for b in train_batches])
    train = to_dataset(train_x, train_y, CIFAR10_MEAN, CIFAR10_STD)
    test = to_dataset(_images(test_batch), test_batch["labels"], CIFAR10_MEAN, CIFAR10_STD)
    return DatasetBundle("cifar10", train, test, 10, (3, 32, 32))


@register_dataset("cifar100", "CIFAR-100 python files (root/cifar-100-python/), fine|coarse labels")
def load_cifar100(root: Path | None = None, label_mode: str = "fine") -> DatasetBundle:
    """CIFAR-100 with ``label_mode='fine'`` (100 classes) or ``'coarse'`` (20 superclasses)."""
    if label_mode not in ("fine", "coarse"):
        raise ValueError(f"cifar100: label_mode must be 'fine' or 'coarse', got {label_mode!r}")
    folder = find_folder(
        root, ["cifar-100-python", "CIFAR100/cifar-100-python"], CIFAR100_FILES, "cifar100"
    )
    key = f"{label_mode}_labels"
    train_b, test_b = (read_batch(folder / n) for n in CIFAR100_FILES)
    train = to_dataset(_images(train_b), train_b[key], CIFAR100_MEAN, CIFAR100_STD)
    test = to_dataset(_images(test_b), test_b[key], CIFAR100_MEAN, CIFAR100_STD)
    return DatasetBundle("cifar100", train, test, 100 if label_mode == "fine" else 20, (3, 32, 32))
