"""A device's own training data (``splitfl device --data PATH``) and the test set a server
holds when the devices bring their data (``data.source: devices``, ``data.test_path``).

Kept to one small entry point, :func:`load_local`, so that it can be pointed at the general
container loaders. Supported layouts (``fmt="npz"``):

* a file ``PATH.npz`` with arrays ``x`` (inputs ``[N, *input_shape]``, floats, already
  normalised as the model expects) and ``y`` (integer labels ``[N]``); optionally ``client``
  (integer ``[N]``): the samples of several clients in one file, each client's in file order.
  Without ``client`` the file is one client's whole data (its id is given by the device's
  ``--client-id`` or assigned by the server).
* a folder of files ``<client id>.npz`` (each with ``x`` and ``y``): one client per file — the
  layout :func:`write_partition` writes.

A test file may also hold ``num_classes`` (a scalar) when its labels do not show every class.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from splitfl.data.base import DatasetError

#: ``--format`` values.
FORMATS = ("npz",)
#: client id → (inputs, labels); the key None is one unnamed client.
LocalData = dict[int | None, tuple[torch.Tensor, torch.Tensor]]


def load_local(path: str | Path, fmt: str = "npz") -> LocalData:
    """The samples at ``path`` by client (see the module docstring for the layouts).

    Raises:
        DatasetError: one line naming the file at fault (missing, unreadable, inconsistent).
    """
    if fmt not in FORMATS:
        raise DatasetError(f"--format: {fmt!r} is not one of {list(FORMATS)}")
    path = Path(path)
    if path.is_dir():
        files = sorted(path.glob("*.npz"))
        named = {f: f.stem for f in files}
        bad = [f.name for f, stem in named.items() if not stem.isdigit()]
        if bad or not files:
            what = f"files not named <client id>.npz: {bad[:3]}" if bad else "no .npz files"
            raise DatasetError(f"{path}: {what}")
        return {int(stem): _single(_read(f), f) for f, stem in sorted(named.items())}
    if not path.is_file():
        raise DatasetError(f"{path}: no such file or folder")
    arrays = _read(path)
    if "client" not in arrays:
        return {None: _single(arrays, path)}
    x, y = _single(arrays, path)
    owner = arrays["client"]
    if owner.shape != (len(y),) or owner.dtype.kind not in "iu" or (owner < 0).any():
        raise DatasetError(f"{path}: 'client' must be non-negative integers, one per sample")
    out: LocalData = {}
    for c in np.unique(owner):
        idx = torch.as_tensor(np.flatnonzero(owner == c))
        out[int(c)] = (x[idx], y[idx])
    return out


def load_test(path: str | Path) -> tuple[torch.Tensor, torch.Tensor, int]:
    """A server's test set (one unnamed client's file): inputs, labels and the class count
    (the file's ``num_classes`` if given, else the largest label + 1)."""
    arrays = _read(Path(path))
    x, y = _single(arrays, Path(path))
    classes = int(y.max()) + 1
    if "num_classes" in arrays:
        given = arrays["num_classes"]
        if given.shape != () or given.dtype.kind not in "iu" or int(given) < classes:
            raise DatasetError(f"{path}: 'num_classes' must be an integer > every label")
        classes = int(given)
    return x, y, classes


def _read(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as f:
            return {k: f[k] for k in f.files}
    except (OSError, ValueError, EOFError) as err:
        raise DatasetError(f"{path}: not a readable .npz file ({err})") from None


def _single(arrays: dict[str, np.ndarray], path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` as float32 and ``y`` as int64, checked against each other."""
    if "x" not in arrays or "y" not in arrays:
        raise DatasetError(f"{path}: needs arrays 'x' and 'y' (has {sorted(arrays)})")
    x, y = arrays["x"], arrays["y"]
    if x.dtype.kind not in "fiu" or y.dtype.kind not in "iu" or y.ndim != 1:
        raise DatasetError(f"{path}: 'x' must be numbers and 'y' 1-D integer labels")
    if len(y) == 0 or x.ndim < 2 or x.shape[0] != len(y):
        raise DatasetError(f"{path}: {x.shape[0] if x.ndim else 0} inputs for {len(y)} labels")
    if (y < 0).any():
        raise DatasetError(f"{path}: negative labels")
    xt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    if not torch.isfinite(xt).all():
        raise DatasetError(f"{path}: non-finite inputs")
    return xt, torch.from_numpy(y.astype(np.int64))


def write_local(path: str | Path, x: torch.Tensor, y: torch.Tensor) -> Path:
    """One client's samples as ``path`` (an .npz :func:`load_local` reads back exactly)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, x=x.numpy(), y=y.numpy())
    return path
