"""Helpers shared by the on-disk loaders: locating a dataset's folder and normalising images."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from splitfl.data.base import ArrayDataset, DatasetNotFoundError


def _has_all(folder: Path, names: Sequence[str], suffixes: Sequence[str]) -> bool:
    return all(any((folder / f"{n}{s}").is_file() for s in suffixes) for n in names)


def find_folder(
    root: Path | str | None,
    subdirs: Sequence[str],
    names: Sequence[str],
    dataset: str,
    suffixes: Sequence[str] = ("",),
) -> Path:
    """Return the first of ``root/<subdir>`` (in order) or ``root`` itself holding every file.

    A file counts as present under any of its ``suffixes`` (e.g. ``("", ".gz")``). Raises
    :class:`DatasetNotFoundError` with a one-line message naming the folders and expected files.
    """
    if root is None:
        raise DatasetNotFoundError(
            f"{dataset}: no data root given; pass the folder holding {subdirs[0]}/ "
            f"(expected files: {', '.join(names)})"
        )
    root = Path(root)
    candidates = [root / s for s in subdirs] + [root]
    for folder in candidates:
        if _has_all(folder, names, suffixes):
            return folder
    optional = [s for s in suffixes if s]
    note = f" (each optionally {'/'.join(optional)})" if optional else ""
    others = ", ".join(str(c) for c in candidates[1:])
    raise DatasetNotFoundError(
        f"{dataset}: missing files in {candidates[0]} (also looked in {others}): "
        f"expected {', '.join(names)}{note}"
    )


def to_dataset(
    images: np.ndarray,
    labels: np.ndarray,
    mean: Sequence[float],
    std: Sequence[float],
    writers: np.ndarray | None = None,
) -> ArrayDataset:
    """Build an :class:`ArrayDataset` from ``[N, C, H, W]`` images scaled to [0, 1].

    ``images`` may be uint8 (value ``v`` means ``v/255``) or float in [0, 1]. The result is
    ``((x - mean) / std)`` computed in float64, then cast to float32, so a uint8 image and its
    float ``v/255`` copy give identical tensors (uint8 goes through a 256-entry lookup table).
    """
    m = np.asarray(mean, dtype=np.float64)
    s = np.asarray(std, dtype=np.float64)
    if images.dtype == np.uint8:
        levels = np.arange(256, dtype=np.float64) / 255.0
        x = np.empty(images.shape, dtype=np.float32)
        for c in range(images.shape[1]):
            lut = ((levels - m[c]) / s[c]).astype(np.float32)
            x[:, c] = lut[images[:, c]]
    else:
        x64 = np.asarray(images, dtype=np.float64)
        x = ((x64 - m.reshape(1, -1, 1, 1)) / s.reshape(1, -1, 1, 1)).astype(np.float32)
    y = torch.from_numpy(np.asarray(labels, dtype=np.int64).copy())
    w = None if writers is None else np.asarray(writers, dtype=np.int64)
    return ArrayDataset(torch.from_numpy(np.ascontiguousarray(x)), y, w)
