"""Helpers shared by the on-disk loaders: locating a dataset's folder, turning decoding failures
and inconsistent contents into one-line errors that name the file, normalising images."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from splitfl.data.base import ArrayDataset, DatasetError, DatasetFileError, DatasetNotFoundError


def file_error(dataset: str, path: Path | str, message: str) -> DatasetFileError:
    """The one-line error ``<dataset>: <path>: <message>``."""
    return DatasetFileError(f"{dataset}: {path}: {message}")


@contextmanager
def reading(dataset: str, path: Path | str) -> Iterator[None]:
    """Decode ``path`` inside this block; any failure becomes a one-line :class:`DatasetFileError`.

    The decoders of the standard formats (gzip/zlib, idx, pickle, zip/npz, json, csv, wave,
    numpy's text parser) raise a dozen unrelated exception types on truncated or bit-flipped
    input (``EOFError``, ``zlib.error``, ``BadZipFile``, ``UnpicklingError``, ``KeyError``,
    ``UnicodeDecodeError``, ...); every one of them means the file is unusable, so all
    ``Exception``s are reported as such, naming the file and the decoder's first message line.
    ``DatasetError`` passes through unchanged (it names its file already).
    """
    try:
        yield
    except DatasetError:
        raise
    except Exception as err:  # noqa: BLE001  (see the docstring)
        detail = (str(err).strip().splitlines() or [""])[0][:200]
        reason = f"{type(err).__name__}: {detail}" if detail else type(err).__name__
        raise file_error(dataset, path, f"unreadable or corrupt ({reason})") from err


def check_labels(
    labels: object, num_classes: int, dataset: str, path: Path | str, count: int | None = None
) -> np.ndarray:
    """``labels`` as int64 ``[N]``, checked: integers, one per sample (``count``), each in
    ``0..num_classes-1``; else a one-line :class:`DatasetFileError` naming ``path``."""
    try:
        arr = np.asarray(labels)
    except (ValueError, TypeError, OverflowError, RecursionError):
        raise file_error(
            dataset,
            path,
            "labels must be a list of integers, got ragged or too deeply nested lists",
        ) from None
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        shape = f"shape {list(arr.shape)}" if arr.ndim <= 4 else f"{arr.ndim} dimensions"
        raise file_error(
            dataset, path, f"labels must be a list of integers, got {arr.dtype} array of {shape}"
        )
    if count is not None and len(arr) != count:
        raise file_error(dataset, path, f"holds {len(arr)} labels for {count} samples")
    arr = arr.astype(np.int64)
    bad = np.flatnonzero((arr < 0) | (arr >= num_classes))
    if bad.size:
        i = int(bad[0])
        raise file_error(
            dataset,
            path,
            f"label {arr[i]} at index {i} is outside 0..{num_classes - 1} ({bad.size} such labels)",
        )
    return arr


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
