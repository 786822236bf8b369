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
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from splitfl.data.base import ArrayDataset, DatasetBundle, DatasetNotFoundError, register_dataset

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


def _read_ints(path: Path) -> np.ndarray:
    return np.loadtxt(path, dtype=np.int64, ndmin=1)


def _read_split(folder: Path, split: str) -> ArrayDataset:
    signals = []
    for name in SIGNALS:
        path = folder / split / "Inertial Signals" / f"{name}_{split}.txt"
        arr = np.loadtxt(path, dtype=np.float64, ndmin=2)
        if arr.shape[1] != WINDOW:
            raise ValueError(f"har: {path} has {arr.shape[1]} values per row, expected {WINDOW}")
        signals.append(arr.astype(np.float32))
    y = _read_ints(folder / split / f"y_{split}.txt")
    subjects = _read_ints(folder / split / f"subject_{split}.txt")
    n = len(y)
    counts = {s.shape[0] for s in signals} | {len(subjects)}
    if counts != {n}:
        raise ValueError(f"har: {split} files in {folder} disagree on the number of windows")
    if n and (y.min() < 1 or y.max() > NUM_CLASSES):
        raise ValueError(f"har: labels in {folder / split} outside 1..{NUM_CLASSES}")
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


@register_dataset("har", "UCI HAR inertial signals (root/UCI HAR Dataset/), 1x128x9, 6 classes")
def load_har(root: Path | None = None) -> DatasetBundle:
    """UCI HAR: 7,352/2,947 windows of 9 inertial signals × 128 readings, 6 activities.

    Inputs are float32 ``[N, 1, 128, 9]`` (raw signals, as MergeSFL), labels 0..5, writers =
    subject ids.
    """
    folder = _find(root)
    train, test = _read_split(folder, "train"), _read_split(folder, "test")
    return DatasetBundle("har", train, test, NUM_CLASSES, (1, WINDOW, len(SIGNALS)))
