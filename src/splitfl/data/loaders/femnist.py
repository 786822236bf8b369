"""FEMNIST (LEAF): 28x28 handwritten characters, 62 classes, one writer id per sample.

Two on-disk formats, looked for in ``root/FEMNIST/`` or ``root`` itself:

* compact npz (``*.npz``; exactly one, else pass ``file=``): ``x`` uint8 ``[N, 28, 28]``
  (LEAF convention: white background = 255), ``y``, ``writer`` (index into ``writer_names``),
  ``split``. In the shipped ``femnist-leaf-niid-sf0.05.npz`` the 90 % per-writer training part
  has ``split == 0`` and the test part ``split == 1`` (its README states the reverse, but the
  per-writer counts, ~155 vs ~18, and the LEAF files it came from show 0 = train);
  ``train_split_value`` selects the value meaning "train".
* LEAF json: ``train/*.json`` and ``test/*.json`` (also under ``data/``), each
  ``{"users": [...], "num_samples": [...], "user_data": {user: {"x": [[784 floats]], "y": [...]}}}``
  with x in [0, 1] (1.0 = white background).

Both give float32 ``[N, 1, 28, 28]`` as ``(x/255 - 0.5)/0.5`` (npz) = ``(x - 0.5)/0.5`` (json):
identical tensors for identical images; the LEAF white background is kept (it becomes +1).
LEAF writers get ids in order of first appearance (train files, then test files, files in
natural order), so a writer has the same id in train and test.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from splitfl.data.base import DatasetBundle, DatasetNotFoundError, register_dataset
from splitfl.data.loaders._common import to_dataset

NPZ_KEYS = ("x", "y", "writer", "split")
_MEAN, _STD = (0.5,), (0.5,)


def _natural_key(path: Path) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path.name)]


def _bundle(train: tuple, test: tuple) -> DatasetBundle:
    def make(part: tuple):
        x, y, w = part
        return to_dataset(x.reshape(-1, 1, 28, 28), y, _MEAN, _STD, w)

    return DatasetBundle("femnist", make(train), make(test), 62, (1, 28, 28))


def load_femnist_npz(path: Path, train_split_value: int = 0) -> DatasetBundle:
    """Load the compact npz layout (see the module docstring)."""
    with np.load(path) as z:
        missing = [k for k in NPZ_KEYS if k not in z.files]
        if missing:
            raise ValueError(f"femnist: {path} lacks keys {', '.join(missing)}")
        x, y, w, split = (z[k] for k in NPZ_KEYS)
    is_train = split == train_split_value
    parts = [(x[m], y[m].astype(np.int64), w[m].astype(np.int64)) for m in (is_train, ~is_train)]
    return _bundle(parts[0], parts[1])


def load_femnist_leaf(train_dir: Path, test_dir: Path) -> DatasetBundle:
    """Load LEAF json files from ``train_dir`` and ``test_dir``."""
    ids: dict[str, int] = {}
    parts = []
    for folder in (train_dir, test_dir):
        xs, ys, ws = [], [], []
        for path in sorted(folder.glob("*.json"), key=_natural_key):
            with open(path) as fh:
                blob = json.load(fh)
            for user in blob["users"]:
                data = blob["user_data"][user]
                wid = ids.setdefault(user, len(ids))
                xs.append(np.asarray(data["x"], dtype=np.float64).reshape(-1, 784))
                ys.append(np.asarray(data["y"], dtype=np.int64))
                ws.append(np.full(len(data["y"]), wid, dtype=np.int64))
        if not xs:
            raise DatasetNotFoundError(f"femnist: no LEAF users in {folder}/*.json")
        parts.append((np.concatenate(xs), np.concatenate(ys), np.concatenate(ws)))
    return _bundle(parts[0], parts[1])


@register_dataset("femnist", "LEAF FEMNIST: compact npz or LEAF json (root/FEMNIST/), with writers")
def load_femnist(
    root: Path | None = None,
    file: str | Path | None = None,
    fmt: str = "auto",
    train_split_value: int = 0,
) -> DatasetBundle:
    """FEMNIST from ``root/FEMNIST`` (or ``root``).

    ``fmt``: ``auto`` (npz if present, else LEAF json), ``npz`` or ``leaf``; ``file`` names the
    npz explicitly (absolute, or relative to the cwd, ``root/FEMNIST`` or ``root``).
    """
    if fmt not in ("auto", "npz", "leaf"):
        raise ValueError(f"femnist: fmt must be auto, npz or leaf, got {fmt!r}")
    if root is None and file is None:
        raise DatasetNotFoundError("femnist: no data root given; pass the folder holding FEMNIST/")
    root = Path(root) if root is not None else Path(file).parent
    folders = [root / "FEMNIST", root]
    if file is not None:
        options = [Path(file)] + [f / file for f in folders if not Path(file).is_absolute()]
        path = next((p for p in options if p.is_file()), None)
        if path is None:
            looked = ", ".join(str(p) for p in options)
            raise DatasetNotFoundError(f"femnist: missing file {file} (looked for {looked})")
        return load_femnist_npz(path, train_split_value)
    if fmt in ("auto", "npz"):
        for folder in folders:
            found = sorted(folder.glob("*.npz")) if folder.is_dir() else []
            if len(found) > 1:
                names = ", ".join(p.name for p in found)
                raise ValueError(f"femnist: several npz files in {folder} ({names}); pass file=")
            if found:
                return load_femnist_npz(found[0], train_split_value)
    if fmt in ("auto", "leaf"):
        for base in (root / "FEMNIST", root / "FEMNIST" / "data", root, root / "data"):
            train_dir, test_dir = base / "train", base / "test"
            if any(train_dir.glob("*.json")) and any(test_dir.glob("*.json")):
                return load_femnist_leaf(train_dir, test_dir)
    raise DatasetNotFoundError(
        f"femnist: missing files in {folders[0]} (also looked in {root}): expected one *.npz "
        "(keys x, y, writer, split) or LEAF train/*.json and test/*.json (optionally under data/)"
    )
