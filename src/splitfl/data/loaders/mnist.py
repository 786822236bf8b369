"""MNIST and Fashion-MNIST from the idx files (gzipped or not), plus MNIST writer ids.

Folder layout (torchvision's): ``root/MNIST/raw/`` (resp. ``root/FashionMNIST/raw/``), or
``root`` itself pointing at the folder with the four files ``train-images-idx3-ubyte``,
``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte``, each
optionally ``.gz``. Images become float32 ``[N, 1, 28, 28]`` with ``(x/255 - 0.5)/0.5``.

MNIST writer ids: if ``mnist-writer-ids.csv.gz`` (QMNIST-derived CSV with columns
``split,index,label,writer_id,hsf_series``, ``split`` in ``{"train", "test"}``) sits in
``root/MNIST/``, ``root``, the files' folder or its parent, ``ArrayDataset.writers`` is filled.

Checks (one-line :class:`~splitfl.data.base.DatasetFileError` naming the file): gzip and idx
decode cleanly (no truncation, no trailing bytes), images are uint8 ``[N, 28, 28]``, labels
uint8 ``[N]`` with the same ``N`` as their images and values in 0..9, writer CSV rows match the
labels. ``verify`` compares the standard files with their published MD5s (see ``_checksums``).
"""

from __future__ import annotations

import csv
import gzip
import math
from pathlib import Path

import numpy as np

from splitfl.data.base import DatasetBundle, DatasetShape, black_of, register_dataset
from splitfl.data.loaders._checksums import verify_file
from splitfl.data.loaders._common import check_labels, file_error, find_folder, reading, to_dataset

IDX_FILES = [
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
]
WRITER_CSV = "mnist-writer-ids.csv.gz"
_IDX_DTYPES = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def parse_idx(data: bytes) -> np.ndarray:
    """Decode an idx buffer: magic ``0x00 0x00 <dtype> <ndim>``, big-endian uint32 dims, data."""
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_DTYPES:
        raise ValueError(f"not an idx file (magic bytes {data[:4].hex()})")
    dtype, ndim = _IDX_DTYPES[data[2]], data[3]
    dims = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    offset = 4 + 4 * ndim
    count = math.prod(dims)
    if len(data) - offset < count * dtype.itemsize:
        raise ValueError(f"idx file truncated: header says {dims}, {len(data) - offset} bytes left")
    if len(data) - offset > count * dtype.itemsize:
        extra = len(data) - offset - count * dtype.itemsize
        raise ValueError(f"idx file has {extra} bytes after the {dims} data its header declares")
    arr = np.frombuffer(data, dtype=dtype, count=count, offset=offset)
    return arr.astype(dtype.newbyteorder("="), copy=True).reshape(dims)


def read_idx(path: Path) -> np.ndarray:
    """Read an idx file; ``path`` without ``.gz`` falls back to ``path.gz`` (and vice versa)."""
    path = Path(path)
    if not path.is_file():
        alt = path.with_name(path.name[:-3]) if path.suffix == ".gz" else Path(f"{path}.gz")
        path = alt
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return parse_idx(raw)


def _read_checked(path: Path, dataset: str, ndim: int, verify: str) -> np.ndarray:
    """Read one idx file (``path`` or ``path.gz``): uint8 with ``ndim`` dims (images
    ``[N, 28, 28]``); checked against its published MD5 per ``verify``."""
    if not path.is_file():
        path = Path(f"{path}.gz")
    with reading(dataset, path):
        raw = path.read_bytes()
        data = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
        arr = parse_idx(data)
    want = "[N, 28, 28]" if ndim == 3 else "[N]"
    if arr.dtype != np.uint8 or arr.ndim != ndim or (ndim == 3 and arr.shape[1:] != (28, 28)):
        got = f"{arr.dtype} {list(arr.shape)}"
        raise file_error(dataset, path, f"holds {got}, expected uint8 {want}")
    verify_file(dataset, path, raw, len(arr), verify, content=data)
    return arr


def _read_writers(csv_path: Path, train_y: np.ndarray, test_y: np.ndarray) -> dict[str, np.ndarray]:
    """Writer id per sample for ``train``/``test``; checks coverage and labels against the idx."""
    labels = {"train": train_y, "test": test_y}
    out = {s: np.full(len(y), -1, dtype=np.int64) for s, y in labels.items()}
    with gzip.open(csv_path, "rt", newline="") as fh:
        for row in csv.DictReader(fh):
            split, index = row["split"], int(row["index"])
            if split not in out or not 0 <= index < len(out[split]):
                raise file_error("mnist", csv_path, f"row {split},{index} matches no loaded image")
            if int(row["label"]) != labels[split][index]:
                raise file_error("mnist", csv_path, f"label mismatch at {split} index {index}")
            out[split][index] = int(row["writer_id"])
    for split, w in out.items():
        if (w < 0).any():
            missing = int((w < 0).sum())
            raise file_error("mnist", csv_path, f"{missing} {split} images have no writer id")
    return out


def _load_split(folder: Path, name: str, images: str, labels: str, verify: str) -> tuple:
    """Images and labels of one split, checked against each other (counts, label range)."""
    x = _read_checked(folder / images, name, 3, verify)
    y = _read_checked(folder / labels, name, 1, verify)
    label_path = next(p for p in (folder / labels, folder / f"{labels}.gz") if p.is_file())
    if len(y) != len(x):
        raise file_error(
            name,
            label_path,
            f"holds {len(y)} labels but {images} holds {len(x)} images "
            "(train and test files swapped or truncated?)",
        )
    return x, check_labels(y, 10, name, label_path)


def _load_idx_dataset(
    name: str, root: Path | None, subdir: str, writer_csv: bool, verify: str = "warn"
) -> DatasetBundle:
    folder = find_folder(root, [f"{subdir}/raw", subdir], IDX_FILES, name, ("", ".gz"))
    train_x, train_y = _load_split(folder, name, IDX_FILES[0], IDX_FILES[1], verify)
    test_x, test_y = _load_split(folder, name, IDX_FILES[2], IDX_FILES[3], verify)
    writers: dict[str, np.ndarray | None] = {"train": None, "test": None}
    if writer_csv:
        places = [Path(root) / subdir, Path(root), folder, folder.parent] if root else [folder]
        found = next((p / WRITER_CSV for p in places if (p / WRITER_CSV).is_file()), None)
        if found is not None:
            with reading(name, found):
                writers.update(_read_writers(found, train_y, test_y))
    mean, std = (0.5,), (0.5,)
    train = to_dataset(train_x[:, None], train_y, mean, std, writers["train"])
    test = to_dataset(test_x[:, None], test_y, mean, std, writers["test"])
    return DatasetBundle(name, train, test, 10, (1, 28, 28), black_of(mean, std))


@register_dataset(
    "mnist",
    "MNIST idx files (root/MNIST/raw/), writer ids if the CSV is present",
    shape=DatasetShape((1, 28, 28), 10),
)
def load_mnist(root: Path | None = None, verify: str = "warn") -> DatasetBundle:
    """MNIST, 60,000/10,000 28x28 digits; writers filled from ``mnist-writer-ids.csv.gz``."""
    return _load_idx_dataset("mnist", root, "MNIST", writer_csv=True, verify=verify)


@register_dataset(
    "fashion_mnist",
    "Fashion-MNIST idx files (root/FashionMNIST/raw/)",
    shape=DatasetShape((1, 28, 28), 10),
)
def load_fashion_mnist(root: Path | None = None, verify: str = "warn") -> DatasetBundle:
    """Fashion-MNIST, 60,000/10,000 28x28 clothing images, 10 classes."""
    return _load_idx_dataset("fashion_mnist", root, "FashionMNIST", writer_csv=False, verify=verify)
