"""``data.format: npz | npy | csv``: arrays and tables.

Inputs are used as stored, ``[N, *input_shape]`` (images channels-first, ``[N, C, H, W]``),
cast to float32; ``uint8`` inputs are scaled to ``[0, 1]`` (``v / 255``). Labels are
integers of any dtype (cast to int64) or, in CSV, class names (sorted; label ``k`` is the
``k``-th name of the training split). With ``data.targets: values`` (the default under
``train.loss: mse``/``bce_logits``) the label array or column holds numbers, read as float32
targets ``[N]`` or ``[N, C]`` (regression, multi-hot).

* ``npz``: a split is a ``.npz`` file with arrays ``x`` and ``y``.
* ``npy``: a split is a pair of ``.npy`` files ``x_<split>.npy``/``y_<split>.npy``; ``x`` is
  memory-mapped, so a lazy split reads only the rows it is indexed with.
* ``csv``: a split is a ``.csv`` file with a header row: the label column
  (``data.label_column``) and numeric feature columns (every other column, in file order).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import torch

from splitfl.data.lazy import LazyInputs, finish_inputs
from splitfl.data.loaders._common import file_error, reading


def as_inputs(x: np.ndarray, name: str, path: Path) -> torch.Tensor:
    """An input array as float32 (uint8 pixels scaled to [0, 1]), or int64 for other integer
    arrays (token ids, category codes: an ``nn.Embedding`` needs them as integers);
    non-numeric is an error."""
    if x.dtype.kind not in "biuf" or x.ndim < 2:
        raise file_error(
            name, path, f"inputs must be a numeric [N, ...] array, got {x.dtype} {list(x.shape)}"
        )
    if x.dtype == np.uint8:
        return torch.from_numpy(x.astype(np.float32) / 255.0)
    if x.dtype.kind in "iu":
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.int64))
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))


def as_labels(y: np.ndarray, name: str, path: Path, count: int, values: bool = False) -> np.ndarray:
    """Integer labels of any dtype, or whole-number floats (``3.0``), as int64 ``[count]``
    (``values``: numeric targets as float32 ``[count, ...]``, :func:`as_values`); else an
    error naming ``path`` (fractional floats: float targets need ``data.targets: values``)."""
    y = np.asarray(y)
    if values:
        return as_values(y, name, path, count)
    if y.dtype.kind == "f" and y.size and np.isfinite(y).all() and (y == np.round(y)).all():
        y = y.astype(np.int64)  # whole-number float labels (3.0) are class labels
    if y.ndim != 1 or y.dtype.kind not in "iu":
        hint = " (float targets: train.loss mse or data.targets: values)" * (y.dtype.kind == "f")
        raise file_error(
            name, path, f"labels must be integers [N], got {y.dtype} {list(y.shape)}{hint}"
        )
    if len(y) != count:
        raise file_error(name, path, f"holds {len(y)} labels for {count} samples")
    if y.size and y.min() < 0:
        raise file_error(name, path, f"label {int(y.min())} is negative")
    return y.astype(np.int64)


def as_values(y: np.ndarray, name: str, path: Path, count: int) -> np.ndarray:
    """Numeric targets (``data.targets: values``) as finite float32 ``[count, ...]``."""
    if y.dtype.kind not in "biuf" or y.ndim < 1:
        raise file_error(name, path, f"targets must be numbers [N, ...], got {y.dtype}")
    if len(y) != count:
        raise file_error(name, path, f"holds {len(y)} targets for {count} samples")
    out = np.ascontiguousarray(y, dtype=np.float32)
    if not np.isfinite(out).all():
        raise file_error(name, path, "holds NaN or infinite targets")
    return out


def load_npz(path: Path, name: str, keys: tuple[str, str] = ("x", "y")):
    """The arrays ``keys`` (inputs, labels) of ``path`` as stored."""
    with reading(name, path), np.load(path, allow_pickle=False) as z:
        missing = [k for k in keys if k not in z.files]
        if missing:
            raise file_error(name, path, f"has no array {missing[0]!r} (holds {z.files})")
        return z[keys[0]], z[keys[1]]


def read_npz(path: Path, name: str, keys: tuple[str, str] = ("x", "y"), values: bool = False):
    """``(x, y)`` from arrays ``keys`` of ``path`` (``values``: float targets)."""
    x, y = load_npz(path, name, keys)
    return converted(x, y, name, path, values)


def converted(x: np.ndarray, y: np.ndarray, name: str, path: Path, values: bool = False):
    """Stored arrays ``(x, y)`` of ``path`` as ``(inputs, labels)`` (:func:`as_inputs`,
    :func:`as_labels`)."""
    return as_inputs(x, name, path), as_labels(y, name, path, len(x), values)


def check_inputs(parts: list[tuple[Path, np.ndarray]], name: str) -> None:
    """The stored input arrays of one dataset (its splits, its clients' files), each with
    its file: every one holds samples, of one sample shape, and all are read alike — uint8
    arrays are scaled by 1/255 and others are not, so a uint8 training split beside a float
    0-255 test split would put the two 255-fold apart."""
    first_path, first = parts[0]
    for path, x in parts:
        if x.ndim >= 1 and len(x) == 0:
            raise file_error(name, path, "holds no samples")
        if (x.dtype == np.uint8) != (first.dtype == np.uint8):
            raise file_error(
                name,
                path,
                f"inputs are {x.dtype} but {first_path.name}'s are {first.dtype}: uint8 inputs "
                "are scaled by 1/255 and others are not (store every split in one dtype)",
            )
        if x.ndim >= 2 and x.shape[1:] != first.shape[1:]:
            raise file_error(
                name,
                path,
                f"inputs have sample shape {list(x.shape[1:])}, {first_path.name}'s "
                f"{list(first.shape[1:])}",
            )


def mapped(path: Path, name: str) -> np.ndarray:
    """A ``.npy`` file memory-mapped (its rows are read when indexed)."""
    with reading(name, path):
        return np.load(path, mmap_mode="r", allow_pickle=False)


def read_npy(x_path: Path, y_path: Path, name: str, lazy: bool | None, values: bool = False):
    """``(x, y)`` from a pair of ``.npy`` files; ``x`` memory-mapped (lazy) or read
    (``values``: float targets)."""
    x = mapped(x_path, name)
    with reading(name, y_path):
        y = np.load(y_path, allow_pickle=False)
    if x.dtype.kind not in "biuf" or x.ndim < 2:
        as_inputs(np.empty((0,), x.dtype), name, x_path)  # raises the one-line error
    labels = as_labels(y, name, y_path, len(x), values)

    def read(idx: np.ndarray) -> torch.Tensor:
        with reading(name, x_path):
            rows = np.asarray(x[np.sort(idx)])
        order = np.argsort(np.argsort(idx, kind="stable"), kind="stable")
        return as_inputs(rows[order], name, x_path)

    dtype = torch.int64 if x.dtype.kind in "iu" and x.dtype != np.uint8 else torch.float32
    return finish_inputs(LazyInputs(read, len(x), tuple(x.shape[1:]), dtype), lazy), labels


def read_csv(path: Path, name: str, label_column: str):
    """``(features float32 [N, F], raw label strings [N])`` of a CSV file with a header."""
    with reading(name, path), open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    if not rows:
        raise file_error(name, path, "is empty (expected a header row)")
    header, body = rows[0], [r for r in rows[1:] if r]
    if label_column not in header:
        raise file_error(name, path, f"has no column {label_column!r} (data.label_column)")
    col = header.index(label_column)
    if len(header) < 2 or not body:
        raise file_error(name, path, "needs a label column, a feature column and a data row")
    feats = np.empty((len(body), len(header) - 1), dtype=np.float32)
    labels = []
    for line, row in enumerate(body, start=2):
        if len(row) != len(header):
            raise file_error(name, path, f"line {line} has {len(row)} fields, not {len(header)}")
        labels.append(row[col].strip())
        try:
            feats[line - 2] = [float(v) for i, v in enumerate(row) if i != col]
        except ValueError as err:
            raise file_error(name, path, f"line {line}: {err}") from None
    if not np.isfinite(feats).all():
        raise file_error(name, path, "holds NaN or infinite feature values")
    return torch.from_numpy(feats), labels


def parse_values(raw: list[str], name: str, path: Path) -> np.ndarray:
    """A CSV label column as float32 targets (``data.targets: values``)."""
    out = np.empty(len(raw), dtype=np.float32)
    for row, v in enumerate(raw):
        try:
            out[row] = float(v)
        except ValueError:
            raise file_error(
                name, path, f"line {row + 2}: target {v[:40]!r} is not a number (data.targets)"
            ) from None
    return as_values(out, name, path, len(raw))


def encode_labels(
    train: list[str], test: list[str], name: str, paths: tuple[Path, Path], values: bool = False
) -> tuple[np.ndarray, np.ndarray, int, tuple[str, ...] | None]:
    """String labels → ``(train ints, test ints, num_classes, class names)``: integers as
    they are when every label is a whole number (``3`` and ``3.0`` alike; a fractional one is
    an error; no names), else the training split's class names sorted (as Python sorts
    strings: label ``k`` is the ``k``-th name). ``values``: numbers as float32 targets
    (:func:`parse_values`), and 1 target per sample."""
    if values:
        return parse_values(train, name, paths[0]), parse_values(test, name, paths[1]), 1, None
    ints = [_whole_numbers(s, name, p) for s, p in zip((train, test), paths, strict=True)]
    if any(i is None for i in ints):
        classes = sorted(set(train))
        index = {c: k for k, c in enumerate(classes)}
        unknown = sorted(set(test) - set(classes))
        if unknown:
            hint = " (numeric targets: train.loss mse or data.targets: values)" * _numeric(unknown)
            raise file_error(
                name, paths[1], f"label {unknown[0]!r} is not in the training split{hint}"
            )
        return (
            np.array([index[v] for v in train], dtype=np.int64),
            np.array([index[v] for v in test], dtype=np.int64),
            len(classes),
            tuple(classes),
        )
    for arr, path in zip(ints, paths, strict=True):
        as_labels(arr, name, path, len(arr))
    return ints[0], ints[1], int(max(ints[0].max(), ints[1].max())) + 1, None


def _whole_numbers(raw: list[str], name: str, path: Path) -> np.ndarray | None:
    """Labels that are all numbers as int64 (``3``, ``3.0``); None if one is not a number (the
    labels are class names); a fractional or non-finite one is an error (class labels are
    whole numbers; numeric targets need ``data.targets: values``)."""
    out = np.empty(len(raw), dtype=np.int64)
    for row, v in enumerate(raw):
        try:
            out[row] = int(v)  # exact, however large
            continue
        except ValueError:
            pass
        try:
            number = float(v)
        except ValueError:
            return None
        if not math.isfinite(number) or number != round(number):
            raise file_error(
                name,
                path,
                f"label {v[:40]!r} is not a whole number (class labels are "
                "integers or names; numeric targets: train.loss mse or data.targets: values)",
            )
        out[row] = int(number)
    return out


def _numeric(raw: list[str]) -> bool:
    try:
        [float(v) for v in raw]
    except ValueError:
        return False
    return True
