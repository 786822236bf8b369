"""Hugging Face ``datasets``: ``data.format: hf`` (a ``DatasetDict`` saved with
``save_to_disk``, splits ``train`` and ``test``), ``data.format: parquet`` (``train.parquet``
and ``test.parquet``, read with pyarrow, no cache written), and in-memory ``datasets.Dataset``
objects given from Python (:func:`splitfl.data.convert.bundle_from`).

Columns: the label column (``data.label_column``, default ``label``; a ``ClassLabel`` gives
the number of classes) and the inputs — every other column: one ``Image`` column (decoded as
the image folder does, :class:`~splitfl.data.formats.images.ImageDecoder`), one array column
(``[*input_shape]`` per row), or several numeric scalar columns (a feature vector, in column
order). Needs the optional ``datasets`` package (the ``hf`` extra; from a checkout
``pip install -e '.[hf]'``). Inputs are read through :class:`~splitfl.data.lazy.LazyInputs`
(Arrow tables are memory-mapped), kept lazy or read at once per ``data.lazy``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from splitfl.data.base import DatasetNotFoundError
from splitfl.data.formats.arrays import as_inputs, as_labels
from splitfl.data.formats.images import ImageDecoder
from splitfl.data.formats.packages import require
from splitfl.data.lazy import LazyInputs, finish_inputs
from splitfl.data.loaders._common import file_error, reading


def _datasets(name: str):
    return require("datasets", f"{name}: Hugging Face data")


def load_saved(root: Path, name: str) -> tuple:
    """The ``train`` and ``test`` splits of a ``save_to_disk`` folder."""
    datasets = _datasets(name)
    if not root.is_dir():
        raise DatasetNotFoundError(f"{name}: missing folder {root} (a save_to_disk DatasetDict)")
    with reading(name, root):
        saved = datasets.load_from_disk(str(root))
    return dict_splits(saved, name, root)


def load_split(root: Path, name: str, split: str):
    """Split ``split`` of a ``save_to_disk`` folder: a ``DatasetDict``'s, or a saved
    ``Dataset`` itself (a device's own data, :mod:`splitfl.data.local`)."""
    datasets = _datasets(name)
    if not root.is_dir():
        raise DatasetNotFoundError(f"{name}: missing folder {root} (a save_to_disk dataset)")
    with reading(name, root):
        saved = datasets.load_from_disk(str(root))
    if isinstance(saved, datasets.Dataset):
        return saved
    if split not in saved:
        raise file_error(name, root, f"has no split {split!r} (holds {list(saved)})")
    return saved[split]


def dict_splits(saved, name: str, where: Path | str) -> tuple:
    """``(train, test)`` of a ``DatasetDict`` (or a ``{"train", "test"}`` mapping)."""
    missing = [s for s in ("train", "test") if s not in getattr(saved, "keys", dict)()]
    if missing:
        raise file_error(name, where, f"needs splits train and test (missing {missing[0]})")
    return saved["train"], saved["test"]


def load_parquet(path: Path, name: str):
    """A ``datasets.Dataset`` over one parquet file, in memory (no cache files written)."""
    datasets = _datasets(name)
    pq = require("pyarrow.parquet", f"{name}: parquet data")
    from datasets.table import InMemoryTable

    if not path.is_file():
        raise DatasetNotFoundError(f"{name}: missing file {path}")
    with reading(name, path):
        return datasets.Dataset(InMemoryTable(pq.read_table(path)))


def hf_labels(
    ds, label_column: str, name: str, where: Path | str, values: bool = False
) -> tuple[np.ndarray, int | None]:
    """The label column as int64 (``values``: float32 targets), and its ``ClassLabel`` class
    count (None if not one)."""
    if label_column not in ds.column_names:
        raise file_error(name, where, f"has no column {label_column!r} (data.label_column)")
    feature = ds.features[label_column]
    with reading(name, where):
        y = np.asarray(ds.with_format("numpy")[label_column])
    labels = as_labels(y, name, Path(str(where)), len(ds), values)
    return labels, getattr(feature, "num_classes", None)


def hf_inputs(ds, label_column: str, name: str, where: Path | str, image_size, lazy: bool | None):
    """The input columns of ``ds`` as a tensor or :class:`LazyInputs` (see the module)."""
    datasets = _datasets(name)
    cols = [c for c in ds.column_names if c != label_column]
    if not cols:
        raise file_error(name, where, "has no input column besides the label")
    if len(cols) == 1 and isinstance(ds.features[cols[0]], datasets.Image):
        col = cols[0]
        decoder = ImageDecoder(ds[0][col], name, image_size)

        def read(idx: np.ndarray) -> torch.Tensor:
            images = ds[[int(i) for i in idx]][col]
            return decoder.scaled(
                [decoder.array(im, f"{where} row {i}") for im, i in zip(images, idx, strict=True)]
            )

        shape = decoder.sample_shape
    else:
        table = ds.with_format("numpy", columns=cols)

        def read(idx: np.ndarray) -> torch.Tensor:
            with reading(name, where):
                rows = table[[int(i) for i in idx]]
                parts = [np.asarray(rows[c]) for c in cols]
                x = parts[0] if len(cols) == 1 else np.stack(parts, axis=1)
            return as_inputs(np.asarray(x), name, Path(str(where)))

        shape = tuple(read(np.array([0])).shape[1:])
    return finish_inputs(LazyInputs(read, len(ds), shape), lazy)
