"""Datasets the user brings: standard on-disk containers under ``data.root`` (``data.format``).

==============  ==========================================================================
format          files under ``data.root``
==============  ==========================================================================
image_folder    ``train/<class>/*.png|jpg|...`` and ``test/<class>/...`` (Pillow)
npz             ``train.npz`` and ``test.npz`` holding ``x`` and ``y``; or ``data.root`` is
                one ``.npz`` file holding ``x_train``, ``y_train``, ``x_test``, ``y_test``
npy             ``x_train.npy``, ``y_train.npy``, ``x_test.npy``, ``y_test.npy`` (``x``
                memory-mapped: lazy splits read only the rows they are indexed with)
csv             ``train.csv`` and ``test.csv``: a header, the label column
                (``data.label_column``), numeric feature columns
hf              a Hugging Face ``DatasetDict`` saved with ``save_to_disk`` (``train``, ``test``)
parquet         ``train.parquet`` and ``test.parquet`` (Hugging Face / pyarrow tables)
==============  ==========================================================================

With ``data.partition: folders`` the training split is ``clients/<id>/<class>/*`` (image
folder), ``clients/<id>.npz`` or ``clients/<id>.csv``: each entry is one client's data, in the
order of the ids (numeric when every id is a number, else by name); the test split stays as
above. Formats and conversions of each container: :mod:`.images`, :mod:`.arrays`, :mod:`.hf`.
Every problem with a file is a one-line :class:`~splitfl.data.base.DatasetError` naming it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from splitfl.data.base import ArrayDataset, DatasetBundle, DatasetNotFoundError
from splitfl.data.formats import arrays, hf, images, text

FORMATS = ("image_folder", "npz", "npy", "csv", "hf", "parquet", "text")
SPLITS = ("train", "test")
#: formats whose training split may come from ``clients/`` (``data.partition: folders``)
CLIENT_FORMATS = ("image_folder", "npz", "csv")


@dataclass(frozen=True)
class ContainerOptions:
    """What a container needs beyond its folder (``data.*`` fields of the same names)."""

    label_column: str = "label"
    image_size: list[int] | None = None
    lazy: bool | None = None
    clients: bool = False
    text_columns: list[str] | None = None
    tokenizer: str | None = None
    max_length: int = 128
    text_target: str = "label"
    #: ``data.targets`` as resolved: ``classes`` (integer labels or class names) or
    #: ``values`` (numbers read as float32 targets: regression, multi-hot).
    targets: str = "classes"

    @property
    def values(self) -> bool:
        return self.targets == "values"


def client_entries(root: Path, suffix: str, name: str) -> list[Path]:
    """``root/clients/*<suffix>`` (folders when ``suffix`` is empty), in id order."""
    folder = root / "clients"
    if not folder.is_dir():
        raise DatasetNotFoundError(f"{name}: missing folder {folder} (data.partition: folders)")
    entries = [
        p for p in folder.iterdir() if (p.is_dir() if not suffix else p.suffix.lower() == suffix)
    ]
    if not entries:
        raise DatasetNotFoundError(f"{name}: {folder} holds no client entries (*{suffix or '/'})")
    numeric = all(p.stem.isdigit() for p in entries)
    return sorted(entries, key=lambda p: (int(p.stem), p.name) if numeric else (0, p.name))


def _split(x, y: np.ndarray, writers: np.ndarray | None = None) -> ArrayDataset:
    """A split; float targets stay float32, labels become int64."""
    y = np.asarray(y)
    return ArrayDataset(
        x, torch.from_numpy(y if y.dtype == np.float32 else y.astype(np.int64)), writers
    )


def _writers(sizes: list[int]) -> np.ndarray:
    return np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)


def _bundle(name: str, train: ArrayDataset, test: ArrayDataset, classes: int | None):
    """The bundle; ``num_classes`` is the model's outputs: the class count, or the target
    values per sample for float targets."""
    if train.y.is_floating_point():
        top = int(train.y[0].numel())
    else:
        top = int(max(train.y.max(), test.y.max())) + 1
    shape = tuple(int(s) for s in train.x.shape[1:])
    return DatasetBundle(name, train, test, max(classes or 0, top), shape)


def _image_folder(root: Path, name: str, o: ContainerOptions) -> DatasetBundle:
    if o.clients:
        dirs = client_entries(root, "", name)
        classes = sorted({c for d in dirs for c in images.class_folders(d, name)})
        listed = [images.list_images(d, classes, name) for d in dirs]
        paths = [p for ps, _ in listed for p in ps]
        labels = np.concatenate([ys for _, ys in listed])
        writers = _writers([len(ys) for _, ys in listed])
    else:
        classes = images.class_folders(root / "train", name)
        paths, labels = images.list_images(root / "train", classes, name)
        writers = None
    test_paths, test_labels = images.list_images(root / "test", classes, name)
    decoder = images.ImageDecoder.from_file(paths[0], name, o.image_size)
    train = _split(images.image_inputs(paths, decoder, o.lazy), labels, writers)
    test = _split(images.image_inputs(test_paths, decoder, o.lazy), test_labels)
    bundle = _bundle(name, train, test, len(classes))
    bundle.class_names = tuple(classes)
    return bundle


def _need(path: Path, name: str) -> Path:
    if not path.exists():
        raise DatasetNotFoundError(f"{name}: missing file {path}")
    return path


def _npz(root: Path, name: str, o: ContainerOptions) -> DatasetBundle:
    if root.is_file():
        keys = {"train": ("x_train", "y_train"), "test": ("x_test", "y_test")}
        stored = {s: [(root, *arrays.load_npz(root, name, k))] for s, k in keys.items()}
    else:
        if o.clients:
            files = client_entries(root, ".npz", name)
        else:
            files = [_need(root / "train.npz", name)]
        test = _need(root / "test.npz", name)
        stored = {
            "train": [(f, *arrays.load_npz(f, name)) for f in files],
            "test": [(test, *arrays.load_npz(test, name))],
        }
    arrays.check_inputs([(f, x) for parts in stored.values() for f, x, _ in parts], name)
    splits = {}
    for s, parts in stored.items():
        read = [arrays.converted(x, y, name, f, o.values) for f, x, y in parts]
        writers = _writers([len(y) for _, y in read]) if o.clients and s == "train" else None
        x = read[0][0] if len(read) == 1 else torch.cat([x for x, _ in read])
        splits[s] = _split(x, np.concatenate([y for _, y in read]), writers)
    return _bundle(name, splits["train"], splits["test"], None)


def _npy(root: Path, name: str, o: ContainerOptions) -> DatasetBundle:
    paths = {s: tuple(_need(root / f"{v}_{s}.npy", name) for v in ("x", "y")) for s in SPLITS}
    arrays.check_inputs([(x, arrays.mapped(x, name)) for x, _ in paths.values()], name)
    train, test = (
        _split(*arrays.read_npy(x, y, name, o.lazy, o.values)) for x, y in paths.values()
    )
    return _bundle(name, train, test, None)


def _csv(root: Path, name: str, o: ContainerOptions) -> DatasetBundle:
    files = client_entries(root, ".csv", name) if o.clients else [_need(root / "train.csv", name)]
    test_file = _need(root / "test.csv", name)
    parts = [arrays.read_csv(f, name, o.label_column) for f in files]
    test_x, test_raw = arrays.read_csv(test_file, name, o.label_column)
    raw = [v for _, r in parts for v in r]
    labels = arrays.encode_labels(raw, test_raw, name, (files[0], test_file), o.values)
    y, test_y, classes, names = labels
    widths = {x.shape[1] for x, _ in parts} | {test_x.shape[1]}
    if len(widths) > 1:
        raise arrays.file_error(name, test_file, f"feature counts differ: {sorted(widths)}")
    writers = _writers([len(r) for _, r in parts]) if o.clients else None
    train = _split(torch.cat([x for x, _ in parts]), y, writers)
    bundle = _bundle(name, train, _split(test_x, test_y), classes)
    bundle.class_names = names
    return bundle


def _text_label(o: ContainerOptions) -> str | None:
    """The label column of a text dataset; None when the targets are the next tokens."""
    return None if o.text_target == "next_token" else o.label_column


def _tokenized(name: str, rows: tuple, where: tuple, o: ContainerOptions) -> DatasetBundle:
    return text.tokenized_bundle(
        name, rows, where, o.tokenizer or "", o.max_length, o.text_target == "next_token"
    )


def _hf_bundle(name: str, splits: tuple, where: tuple, o: ContainerOptions) -> DatasetBundle:
    if o.text_columns:  # raw text: tokenised (data.format text's rules)
        rows = tuple(
            text.table_rows(ds, name, at, o.text_columns, _text_label(o))
            for ds, at in zip(splits, where, strict=True)
        )
        return _tokenized(name, rows, where, o)
    out, classes = [], None
    for ds, at in zip(splits, where, strict=True):
        y, classes = hf.hf_labels(ds, o.label_column, name, at, o.values)
        out.append(_split(hf.hf_inputs(ds, o.label_column, name, at, o.image_size, o.lazy), y))
    bundle = _bundle(name, out[0], out[1], classes)
    names = getattr(splits[0].features[o.label_column], "names", None)  # a ClassLabel's
    bundle.class_names = tuple(names) if names else None
    return bundle


def load_container(fmt: str, root: str | Path, name: str, options: ContainerOptions):
    """The :class:`DatasetBundle` of container ``fmt`` (one of :data:`FORMATS`) at ``root``."""
    root = Path(root)
    if not root.exists():
        raise DatasetNotFoundError(f"{name}: data.root {root} does not exist")
    if fmt == "image_folder":
        return _image_folder(root, name, options)
    if fmt == "npz":
        return _npz(root, name, options)
    if fmt == "npy":
        return _npy(root, name, options)
    if fmt == "csv":
        return _csv(root, name, options)
    if fmt == "hf":
        where = (root / "train", root / "test")
        return _hf_bundle(name, hf.load_saved(root, name), where, options)
    if fmt == "parquet":
        files = (_need(root / "train.parquet", name), _need(root / "test.parquet", name))
        return _hf_bundle(name, tuple(hf.load_parquet(f, name) for f in files), files, options)
    if fmt == "text":
        o = options
        rows, files = text.file_splits(root, name, o.text_columns or [], _text_label(o))
        return _tokenized(name, rows, files, o)
    raise ValueError(f"unknown data.format {fmt!r}; allowed: {', '.join(FORMATS)}")
