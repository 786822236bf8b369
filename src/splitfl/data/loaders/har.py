"""UCI HAR (Human Activity Recognition Using Smartphones) from its standard text files.

Folder layout (the official zip): ``root/UCI HAR Dataset/`` (also ``root/HAR/UCI HAR Dataset/``
or ``root`` pointing at ``UCI HAR Dataset/`` itself) holding, for ``split`` in ``train``/``test``,
``<split>/Inertial Signals/<signal>_<split>.txt`` for the nine signals of :data:`SIGNALS` (one
window per row, 128 whitespace-separated floats), ``<split>/y_<split>.txt`` (activity 1..6) and
``<split>/subject_<split>.txt`` (volunteer id 1..30). The 561-feature ``X_<split>.txt`` files
are not used.

As MergeSFL (``ymliao98/MergeSFL``, CNN-H input, see the public-implementation facts) the nine
raw inertial signals are stacked, in :data:`SIGNALS` order, into float32 ``[N, 1, 128, 9]``
(no normalisation) and labels become 0..5. Subject ids are kept as ``ArrayDataset.writers``
(train and test volunteers are disjoint), so a by-subject natural partition works.

Checks (one-line :class:`~splitfl.data.base.DatasetFileError` naming the file): every file
parses as numbers, signal files hold 128 finite values per row, all files of a split hold the
same number of rows, labels are 1..6.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from splitfl.data.base import (
    ArrayDataset,
    DatasetBundle,
    DatasetNotFoundError,
    DatasetShape,
    register_dataset,
)
from splitfl.data.loaders._common import file_error, reading

SIGNALS = [
    "body_acc_x",
    "body_acc_y",
    "body_acc_z",
    "body_gyro_x",
    "body_gyro_y",
    "body_gyro_z",
    "total_acc_x",
    "total_acc_y",
    "total_acc_z",
]
WINDOW = 128  # readings per window (2.56 s at 50 Hz)
NUM_CLASSES = 6
FOLDER = "UCI HAR Dataset"


def split_files(split: str) -> list[str]:
    """Paths, relative to the dataset folder, that split ``split`` needs."""
    signals = [f"{split}/Inertial Signals/{s}_{split}.txt" for s in SIGNALS]
    return signals + [f"{split}/y_{split}.txt", f"{split}/subject_{split}.txt"]


def _read_ints(path: Path, count: int) -> np.ndarray:
    """One integer per row, ``count`` rows."""
    with reading("har", path):
        arr = np.loadtxt(path, dtype=np.int64, ndmin=1)
    if arr.ndim != 1 or len(arr) != count:
        raise file_error("har", path, f"holds {list(arr.shape)} values, expected {count} rows")
    return arr


def _read_signal(path: Path) -> np.ndarray:
    """``[N, 128]`` finite float32 readings of one signal file."""
    with reading("har", path):
        arr = np.loadtxt(path, dtype=np.float64, ndmin=2)
    if arr.shape[1] != WINDOW:
        raise file_error("har", path, f"has {arr.shape[1]} values per row, expected {WINDOW}")
    if not np.isfinite(arr).all():
        raise file_error("har", path, "holds NaN or infinite readings")
    return arr.astype(np.float32)


def _read_split(folder: Path, split: str) -> ArrayDataset:
    paths = [folder / split / "Inertial Signals" / f"{name}_{split}.txt" for name in SIGNALS]
    signals = [_read_signal(p) for p in paths]
    n = len(signals[0])
    for path, arr in zip(paths, signals, strict=True):
        if len(arr) != n:
            raise file_error("har", path, f"holds {len(arr)} windows but {paths[0].name} {n}")
    y_path = folder / split / f"y_{split}.txt"
    y = _read_ints(y_path, n)
    bad = np.flatnonzero((y < 1) | (y > NUM_CLASSES))
    if bad.size:
        i = int(bad[0])
        raise file_error("har", y_path, f"label {y[i]} in row {i + 1} is outside 1..{NUM_CLASSES}")
    subjects = _read_ints(folder / split / f"subject_{split}.txt", n)
    x = np.stack(signals, axis=-1)[:, None]  # [N, 1, 128, 9]
    return ArrayDataset(
        torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(y - 1), subjects.copy()
    )


def _find(root: Path | None) -> Path:
    """The first of ``root/UCI HAR Dataset``, ``root/HAR/UCI HAR Dataset``, ``root`` with every
    file; else a one-line :class:`DatasetNotFoundError` naming the folders and what is missing
    (from the candidate holding the most files)."""
    layout = (
        "<split>/Inertial Signals/<signal>_<split>.txt for the 9 signals "
        f"({', '.join(SIGNALS)}), <split>/y_<split>.txt, <split>/subject_<split>.txt, "
        "split in train, test"
    )
    if root is None:
        raise DatasetNotFoundError(f"har: no data root given; pass the folder holding {FOLDER}/")
    root = Path(root)
    names = split_files("train") + split_files("test")
    candidates = [root / FOLDER, root / "HAR" / FOLDER, root]
    missing = [[n for n in names if not (c / n).is_file()] for c in candidates]
    for folder, lacking in zip(candidates, missing, strict=True):
        if not lacking:
            return folder
    best = min(range(len(candidates)), key=lambda i: (len(missing[i]), i))
    lacking = missing[best]
    shown = ", ".join(lacking[:4]) + (f" and {len(lacking) - 4} more" if len(lacking) > 4 else "")
    others = ", ".join(str(c) for c in candidates if c != candidates[best])
    raise DatasetNotFoundError(
        f"har: missing files in {candidates[best]} (also looked in {others}): {shown}; "
        f"expected {layout}"
    )


@register_dataset(
    "har",
    "UCI HAR inertial signals (root/UCI HAR Dataset/), 1x128x9, 6 classes",
    shape=DatasetShape((1, WINDOW, len(SIGNALS)), NUM_CLASSES),
)
def load_har(root: Path | None = None) -> DatasetBundle:
    """UCI HAR: 7,352/2,947 windows of 9 inertial signals × 128 readings, 6 activities.

    Inputs are float32 ``[N, 1, 128, 9]`` (raw signals, as MergeSFL), labels 0..5, writers =
    subject ids.
    """
    folder = _find(root)
    train, test = _read_split(folder, "train"), _read_split(folder, "test")
    return DatasetBundle("har", train, test, NUM_CLASSES, (1, WINDOW, len(SIGNALS)))
