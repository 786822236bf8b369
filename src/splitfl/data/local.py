"""A device's own training data (``splitfl device --data PATH --format F``) and the test set a
server holds when the devices bring their data (``data.source: devices``, ``data.test_path``).

Every file is read by the container readers of :mod:`splitfl.data.formats` (the ones
``data.format`` uses): this module only says where a device's clients are. ``F`` is one of
:data:`FORMATS` (default ``npz``); the layouts of ``PATH``:

* ``PATH/clients/<id>...``: several clients, the per-client layout of ``data.partition:
  folders`` — ``clients/<id>/<class>/*.png`` (image_folder), ``clients/<id>.npz``,
  ``clients/<id>.csv``; for npy, hf and parquet ``clients/<id>/`` is one client's folder as
  below. Ids are integers.
* one client (its id given by ``--client-id`` or assigned by the server): image_folder
  ``PATH/<class>/*`` or ``PATH/train/<class>/*``; npz a file with ``x``, ``y`` or
  ``PATH/train.npz``; csv a file or ``PATH/train.csv``; npy ``PATH/x_train.npy`` and
  ``PATH/y_train.npy``; hf a ``save_to_disk`` ``Dataset`` or ``DatasetDict`` (its ``train``);
  parquet a file or ``PATH/train.parquet``.
* npz only (kept from the first own-data layout): a folder of ``<client id>.npz`` files (what
  :func:`write_local` writes), or one ``.npz`` whose optional integer array ``client`` names
  each sample's client.

Labels as in the containers: integers, or class names (image folders' class folders, CSV
names) sorted over the device's own clients — so every device must hold the same class
folders / names (empty class folders allowed), or use integer labels. Inputs are read as the
containers read them (``uint8`` scaled to [0, 1], images resized to ``data.image_size``,
lazy per ``data.lazy``); the device applies the server's ``data.transforms`` to them
(:meth:`splitfl.net.device.agent.ClientData.from_local`), as a simulation run does.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from splitfl.data.base import DatasetError
from splitfl.data.formats import FORMATS, ContainerOptions, arrays, client_entries, hf, images
from splitfl.data.formats.packages import require_format
from splitfl.data.loaders._common import file_error, reading

NAME = "--data"
#: suffix of one client's entry under ``clients/`` ("" = a folder)
_ENTRY = {"npz": ".npz", "csv": ".csv"}
#: client id → (inputs, labels); the key None is one unnamed client.
LocalData = dict[int | None, tuple[torch.Tensor, torch.Tensor]]

__all__ = ["FORMATS", "LocalData", "launch_format", "load_local", "load_test", "write_local"]


def load_local(
    path: str | Path, fmt: str = "npz", options: ContainerOptions | None = None
) -> LocalData:
    """The samples at ``path`` by client (layouts: the module docstring); ``options`` are
    the server's ``data.label_column``, ``image_size``, ``lazy``.

    Raises:
        DatasetError: one line naming the file at fault (missing, unreadable, inconsistent).
    """
    if fmt not in FORMATS:
        raise DatasetError(f"--format: {fmt!r} is not one of {list(FORMATS)}")
    require_format(fmt, NAME)  # a minimal device install may lack the package (one line)
    path, o = Path(path), options or ContainerOptions()
    if not path.exists():
        raise DatasetError(f"{path}: no such file or folder")
    if (path / "clients").is_dir():
        return _clients(path, fmt, o)
    if fmt == "npz" and (path.is_file() or not (path / "train.npz").exists()):
        return _npz_layouts(path, o)
    return {None: _checked(*_split(path, fmt, o, "train"), path)}


def load_test(
    path: str | Path, fmt: str | None = None, options: ContainerOptions | None = None
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """A server's test set (``data.test_path`` in ``data.format``, npz when null): a file,
    or a folder holding that container's test split (``test/<class>/``, ``test.npz``,
    ``test.csv``, ``x_test.npy``/``y_test.npy``, a saved ``DatasetDict``'s ``test``,
    ``test.parquet``). Inputs, labels and the class count: the .npz's ``num_classes``, the
    image folder's class folders, else the largest label + 1."""
    path, fmt, o = Path(path), fmt or "npz", options or ContainerOptions()
    if not path.exists():
        raise DatasetError(f"{path}: no such file or folder")
    x, y = _split(path, fmt, o, "test")
    _checked(x, y, path)
    if y.is_floating_point():  # targets: the model's outputs are the values per sample
        return x, y, int(y[0].numel())
    classes = y.max().item() + 1
    if fmt == "image_folder":
        classes = max(classes, len(images.class_folders(_folder(path, "test"), NAME)))
    if fmt == "npz" and path.is_file():
        with reading(NAME, path), np.load(path, allow_pickle=False) as z:
            given = z["num_classes"] if "num_classes" in z.files else None
        if given is not None:
            if given.shape != () or given.dtype.kind not in "iu" or int(given) < classes:
                raise file_error(NAME, path, "'num_classes' must be an integer > every label")
            classes = int(given)
    return x, y, int(classes)  # x may be lazy (read per evaluation batch)


def launch_format(folder: Path, data_format: str | None) -> str:
    """The ``--format`` of a device ``splitfl launch --data-dir`` starts on ``folder``: npz
    for ``<client id>.npz`` files (what ``--write-partition`` writes), else the run's
    ``data.format`` (npz when null)."""
    return "npz" if any(Path(folder).glob("*.npz")) else data_format or "npz"


def _folder(path: Path, split: str) -> Path:
    return path / split if (path / split).is_dir() else path


def _file(path: Path, split: str, suffix: str) -> Path:
    return path if path.is_file() else path / f"{split}{suffix}"


def _split(path: Path, fmt: str, o: ContainerOptions, split: str):
    """One client's ``(x, y)`` (y an int64 tensor, or float32 targets with ``data.targets:
    values``) at ``path`` (a file or a container folder)."""
    if fmt == "image_folder":
        folder = _folder(path, split)
        return _images([folder], images.class_folders(folder, NAME), o)[0]
    if fmt == "npz":
        x, y = arrays.read_npz(_need(_file(path, split, ".npz")), NAME, values=o.values)
    elif fmt == "npy":
        pair = (_need(path / f"{v}_{split}.npy") for v in ("x", "y"))
        x, y = arrays.read_npy(*pair, NAME, o.lazy, o.values)
    elif fmt == "csv":
        file = _need(_file(path, split, ".csv"))
        x, raw = arrays.read_csv(file, NAME, o.label_column)
        y = arrays.encode_labels(raw, raw, NAME, (file, file), o.values)[0]
    else:
        if fmt == "hf":
            ds, where = hf.load_split(path, NAME, split), path
        else:
            where = _need(_file(path, split, ".parquet"))
            ds = hf.load_parquet(where, NAME)
        y = hf.hf_labels(ds, o.label_column, NAME, where, o.values)[0]
        x = hf.hf_inputs(ds, o.label_column, NAME, where, o.image_size, o.lazy)
    y = np.asarray(y)
    return x, torch.from_numpy(y if y.dtype == np.float32 else y.astype(np.int64))


def _images(folders: list[Path], classes: list[str], o: ContainerOptions) -> list[tuple]:
    """Each image folder's ``(x, y)``, one decoder (the first image's mode and size)."""
    listed = [images.list_images(f, classes, NAME) for f in folders]
    decoder = images.ImageDecoder.from_file(listed[0][0][0], NAME, o.image_size)
    return [
        (images.image_inputs(paths, decoder, o.lazy), torch.from_numpy(ys)) for paths, ys in listed
    ]


def _clients(path: Path, fmt: str, o: ContainerOptions) -> LocalData:
    """``path/clients/<id>...``: one entry per client (the ``folders`` partition's layout)."""
    entries = client_entries(path, _ENTRY.get(fmt, ""), NAME)
    bad = [e.name for e in entries if not e.stem.isdigit()]
    if bad:
        raise file_error(NAME, path / "clients", f"entries not named by client id: {bad[:3]}")
    ids = [int(e.stem) for e in entries]
    if fmt == "image_folder":
        classes = sorted({c for e in entries for c in images.class_folders(e, NAME)})
        data = _images(entries, classes, o)
    else:
        data = [_split(e, fmt, o, "train") for e in entries]
    return {c: _checked(x, y, e) for c, (x, y), e in zip(ids, data, entries, strict=True)}


def _npz_layouts(path: Path, o: ContainerOptions) -> LocalData:
    """The npz layouts kept from the first own-data format (a folder of ``<id>.npz``, or one
    file with an optional ``client`` array)."""
    if path.is_dir():
        files = sorted(path.glob("*.npz"))
        bad = [f.name for f in files if not f.stem.isdigit()]
        if bad or not files:
            what = f"files not named <client id>.npz: {bad[:3]}" if bad else "no .npz files"
            raise DatasetError(f"{path}: {what}")
        return {int(f.stem): _checked(*_split(f, "npz", o, ""), f) for f in files}
    x, y = _checked(*_split(path, "npz", o, ""), path)
    with reading(NAME, path), np.load(path, allow_pickle=False) as z:
        owner = z["client"] if "client" in z.files else None
    if owner is None:
        return {None: (x, y)}
    if owner.shape != (len(y),) or owner.dtype.kind not in "iu" or (owner < 0).any():
        raise file_error(NAME, path, "'client' must be non-negative integers, one per sample")
    out: LocalData = {}
    for c in np.unique(owner):
        idx = torch.as_tensor(np.flatnonzero(owner == c))
        out[int(c)] = (x[idx], y[idx])
    return out


def _need(path: Path) -> Path:
    if not path.exists():
        raise DatasetError(f"{path}: no such file or folder")
    return path


def _checked(x, y: torch.Tensor, path: Path) -> tuple:
    """``(x, y)`` with at least one sample and finite inputs (eager ones: lazy inputs are
    checked as they are read, like the containers')."""
    if len(y) == 0:
        raise file_error(NAME, path, "holds no samples")
    if isinstance(x, torch.Tensor) and not torch.isfinite(x).all():
        raise file_error(NAME, path, "holds NaN or infinite inputs")
    return x, y


def write_local(path: str | Path, x: torch.Tensor, y: torch.Tensor) -> Path:
    """One client's samples as ``path`` (an .npz :func:`load_local` reads back exactly)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, x=x.numpy(), y=y.numpy())
    return path
