"""FEMNIST (LEAF): 28x28 handwritten characters, 62 classes, one writer id per sample.

Two on-disk formats, looked for in ``root/FEMNIST/`` or ``root`` itself:

* compact npz (``*.npz``; exactly one, else point ``data.root`` — or ``file=`` — at the one to
  use): ``x`` uint8 ``[N, 28, 28]``
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
Checks (one-line :class:`~splitfl.data.base.DatasetFileError` naming the file): the npz/json
decodes; npz ``x`` is uint8 ``[N, 28, 28]`` (or ``[N, 784]``) and ``y``/``writer``/``split``
are integer ``[N]``; json users have as many 784-value rows in [0, 1] as labels; labels are in
0..61; both splits are non-empty.
LEAF writers get ids in order of first appearance (train files, then test files, files in
natural order), so a writer has the same id in train and test.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from splitfl.data.base import (
    DatasetBundle,
    DatasetError,
    DatasetNotFoundError,
    DatasetShape,
    black_of,
    register_dataset,
)
from splitfl.data.loaders._common import check_labels, file_error, reading, to_dataset

NPZ_KEYS = ("x", "y", "writer", "split")
NUM_CLASSES = 62
_MEAN, _STD = (0.5,), (0.5,)


def _natural_key(path: Path) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path.name)]


def _bundle(train: tuple, test: tuple) -> DatasetBundle:
    def make(part: tuple):
        x, y, w = part
        return to_dataset(x.reshape(-1, 1, 28, 28), y, _MEAN, _STD, w)

    zero = black_of(_MEAN, _STD)
    return DatasetBundle("femnist", make(train), make(test), NUM_CLASSES, (1, 28, 28), zero)


def _npz_arrays(path: Path) -> tuple[np.ndarray, ...]:
    """``x, y, writer, split`` of the npz at ``path``, checked for dtypes and shapes."""
    with reading("femnist", path), np.load(path) as z:
        missing = [k for k in NPZ_KEYS if k not in z.files]
        if missing:
            raise file_error("femnist", path, f"lacks keys {', '.join(missing)}")
        x, y, w, split = (z[k] for k in NPZ_KEYS)
    n = len(x) if x.ndim else 0
    if x.dtype != np.uint8 or x.shape[1:] not in ((28, 28), (784,)):
        raise file_error(
            "femnist", path, f"x is {x.dtype} {list(x.shape)}, expected uint8 [N, 28, 28]"
        )
    for key, arr in (("writer", w), ("split", split)):
        if arr.shape != (n,) or arr.dtype.kind not in "iu":
            got = f"{arr.dtype} {list(arr.shape)}"
            raise file_error("femnist", path, f"{key} is {got}, expected integers [{n}]")
    return x, check_labels(y, NUM_CLASSES, "femnist", path, count=n), w, split


def load_femnist_npz(path: Path, train_split_value: int = 0) -> DatasetBundle:
    """Load the compact npz layout (see the module docstring)."""
    x, y, w, split = _npz_arrays(path)
    is_train = split == train_split_value
    if is_train.all() or not is_train.any():
        side = "train" if not is_train.any() else "test"
        raise file_error(
            "femnist", path, f"no {side} samples (split == {train_split_value} marks train)"
        )
    parts = [(x[m], y[m], w[m].astype(np.int64)) for m in (is_train, ~is_train)]
    return _bundle(parts[0], parts[1])


def _leaf_user(path: Path, blob: dict, user: str) -> tuple[np.ndarray, np.ndarray]:
    """One LEAF user's images ``[n, 784]`` in [0, 1] and labels, checked."""
    data = blob["user_data"][user]
    x = np.asarray(data["x"], dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != 784:
        raise file_error(
            "femnist", path, f"user {user}: x has shape {list(x.shape)}, expected [n, 784]"
        )
    if not np.isfinite(x).all() or x.min(initial=0) < 0 or x.max(initial=0) > 1:
        raise file_error("femnist", path, f"user {user}: x values outside [0, 1]")
    y = check_labels(data["y"], NUM_CLASSES, "femnist", f"{path} (user {user})", count=len(x))
    return x, y


def _read_leaf(path: Path) -> dict:
    with reading("femnist", path), open(path) as fh:
        blob = json.load(fh)
    if (
        not isinstance(blob, dict)
        or not isinstance(blob.get("users"), list)
        or not isinstance(blob.get("user_data"), dict)
    ):
        raise file_error("femnist", path, "expected a LEAF json object with users and user_data")
    return blob


def load_femnist_leaf(train_dir: Path, test_dir: Path) -> DatasetBundle:
    """Load LEAF json files from ``train_dir`` and ``test_dir``."""
    ids: dict[str, int] = {}
    parts = []
    for folder in (train_dir, test_dir):
        xs, ys, ws = [], [], []
        for path in sorted(folder.glob("*.json"), key=_natural_key):
            blob = _read_leaf(path)
            for user in blob["users"]:
                with reading("femnist", path):
                    x, y = _leaf_user(path, blob, user)
                wid = ids.setdefault(user, len(ids))
                xs.append(x)
                ys.append(y)
                ws.append(np.full(len(y), wid, dtype=np.int64))
        if not xs:
            raise DatasetNotFoundError(f"femnist: no LEAF users in {folder}/*.json")
        parts.append((np.concatenate(xs), np.concatenate(ys), np.concatenate(ws)))
    return _bundle(parts[0], parts[1])


@register_dataset(
    "femnist",
    "LEAF FEMNIST: compact npz or LEAF json (root/FEMNIST/), with writers",
    shape=DatasetShape((1, 28, 28), NUM_CLASSES),
)
def load_femnist(
    root: Path | None = None,
    file: str | Path | None = None,
    fmt: str = "auto",
    train_split_value: int = 0,
) -> DatasetBundle:
    """FEMNIST from ``root/FEMNIST`` (or ``root``), or from the npz file ``root`` itself.

    ``fmt``: ``auto`` (npz if present, else LEAF json), ``npz`` or ``leaf``; ``file`` names the
    npz explicitly (absolute, or relative to the cwd, ``root/FEMNIST`` or ``root``).
    """
    if fmt not in ("auto", "npz", "leaf"):
        raise ValueError(f"femnist: fmt must be auto, npz or leaf, got {fmt!r}")
    if root is None and file is None:
        raise DatasetNotFoundError("femnist: no data root given; pass the folder holding FEMNIST/")
    if file is None and root is not None and Path(root).is_file():  # data.root: the npz itself
        return load_femnist_npz(Path(root), train_split_value)
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
                raise DatasetError(
                    f"femnist: several npz files in {folder} ({names}); set data.root to the "
                    "one to use"
                )
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
