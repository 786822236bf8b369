"""A dataset given from Python as a :class:`DatasetBundle` (:func:`bundle_from`).

Accepted objects (what ``data.dataset: pkg.mod:callable`` may return, or a registered
loader):

* a :class:`~splitfl.data.base.DatasetBundle` (labels of any integer dtype are cast to int64;
  splits that are map-style torch ``Dataset`` s rather than ``ArrayDataset`` s are read as a
  ``(train, test)`` pair is, below, keeping the bundle's other fields);
* a ``(train, test)`` pair of map-style torch ``Dataset`` s whose items are ``(x, y)``: ``x``
  a tensor, an array or a PIL image (scaled to ``[0, 1]``, channels first), ``y`` an integer
  (a whole-number float counts as one; a fractional one is refused), or numbers read as
  float32 targets with ``targets="values"`` (``data.targets``: regression, multi-hot).
  Labels come from a ``targets`` (or ``labels``) attribute when the dataset has one, else by
  reading every item once. ``input_shape`` and ``num_classes`` are taken from attributes of the
  training dataset when present (``num_classes``, or ``len(classes)``), else inferred from the
  first item and the largest label. The inputs' dtype is the first item's (integer items —
  token ids — stay int64), or the ``input_dtype`` attribute (default float32) of a dataset
  that declares ``input_shape`` (its items are then read only when a batch needs them).
  Inputs are read lazily through ``dataset[i]`` or all at once, per ``lazy`` (``data.lazy``;
  null: lazy above 1 GiB). Every item read is checked — its input of the dataset's shape,
  its label a number (a class name, None or a string is refused naming the item), whatever
  ``__getitem__`` raises one line naming the item — : all of them at load when the labels
  come from the items; a few spread over the dataset (the last included: a ``len()`` larger
  than the items), whose labels must agree with a ``targets`` attribute, when they come from
  one; none at load for a dataset that declares ``input_shape`` (each when a batch reads it);
* a ``torch.utils.data.TensorDataset`` pair (its own ``__getitem__``, CPU tensors) is taken
  whole: its tensors are the split (float32 inputs without a copy), no item is read, and the
  result is the item-by-item read's (issue 54). Any other map-style dataset is read once
  (inputs into one preallocated tensor, labels in the same pass) unless it is kept lazy;
* a Hugging Face ``datasets.DatasetDict`` with ``train`` and ``test`` splits, or a pair of
  ``datasets.Dataset`` s (columns as in :mod:`splitfl.data.formats.hf`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np
import torch
from torch.utils.data import TensorDataset

from splitfl.core.usercode import user_code
from splitfl.data.base import (
    ArrayDataset,
    DatasetBundle,
    DatasetError,
    DatasetFileError,
    cast_labels,
)
from splitfl.data.formats import ContainerOptions, _hf_bundle
from splitfl.data.lazy import LazyInputs, finish_inputs, want_lazy

#: Items of a user's dataset read at load to check them against the rest (spread over it).
SPOT_CHECKS = 8


def _is_hf(obj: object) -> bool:
    return type(obj).__module__.split(".")[0] == "datasets"


def _as_tensor(x: object) -> torch.Tensor:
    """One sample: PIL images as float32 scaled to [0, 1] ``[C, H, W]``; integer tensors and
    arrays (token ids) as int64; anything else as float32."""
    if hasattr(x, "convert") and hasattr(x, "getbands"):  # a PIL image
        arr = np.asarray(x, dtype=np.uint8)
        arr = arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)
        return torch.from_numpy(arr.astype(np.float32) / 255.0)
    t = torch.as_tensor(np.asarray(x) if not isinstance(x, torch.Tensor) else x)
    integer = not t.is_floating_point() and not t.is_complex() and t.dtype != torch.bool
    return t.long() if integer else t.float()


def _item(ds, i: int, name: str, split: str) -> tuple:
    """Item ``i`` of a user's dataset as ``(x, y)``; whatever its ``__getitem__`` raises is
    one line naming the item (:func:`~splitfl.core.usercode.user_code`)."""
    with user_code(f"{name}: {split} item {i} of {len(ds)}", DatasetFileError, (DatasetError,)):
        item = ds[i]
    if not isinstance(item, tuple | list) or len(item) < 2:
        raise DatasetFileError(
            f"{name}: {split} item {i} must be (x, y), got {type(item).__name__}"
        )
    several = _several_inputs(item[0])
    if several:
        raise DatasetFileError(
            f"{name}: {split} item {i}'s input is {several}; splitfl feeds a model one input "
            "tensor per sample (models with several inputs are not supported): concatenate "
            "them into one tensor in __getitem__ (e.g. torch.cat([img.flatten(), meta])) and "
            "split it again at the start of forward"
        )
    return item[0], item[1]


def _several_inputs(x: object) -> str | None:
    """What ``x`` holds when it is several inputs — a mapping, or a tuple/list with a tensor,
    an array or a PIL image among its entries (``(img, meta)``, ``{"ids": .., "mask": ..}``)
    — else None (a tuple of numbers is one vector, as before)."""

    def kind(v: object) -> str:
        if isinstance(v, torch.Tensor | np.ndarray):
            return str(list(v.shape))
        return "image" if hasattr(v, "getbands") else type(v).__name__

    if isinstance(x, Mapping):
        parts = ", ".join(f"{k}: {kind(v)}" for k, v in x.items())
        return f"a mapping of {len(x)} entries ({parts})"
    tensors = (torch.Tensor, np.ndarray, Mapping, tuple, list)
    if isinstance(x, tuple | list) and any(
        isinstance(v, tensors) or hasattr(v, "getbands") for v in x
    ):
        return f"a {type(x).__name__} of {len(x)} inputs ({', '.join(kind(v) for v in x)})"
    return None


def _checked(x: object, i: int, name: str, split: str, shape: tuple[int, ...]) -> torch.Tensor:
    """Item ``i``'s input ``x`` as a tensor, which must have the dataset's sample ``shape``."""
    t = _as_tensor(x)
    if tuple(t.shape) != tuple(shape):
        raise DatasetFileError(
            f"{name}: {split} item {i} has inputs of shape {list(t.shape)}; the dataset's "
            f"are {list(shape)} (every item must have the same shape)"
        )
    return t


def _label(y: object, i: int, name: str, split: str) -> np.ndarray:
    """Item ``i``'s label as an array: a number, or numbers (targets); anything else (a class
    name, None, a string of digits) is one line naming the item."""
    if isinstance(y, list | tuple) and all(isinstance(v, int | float) for v in y):
        y = np.asarray(y)
    arr = None
    if isinstance(y, np.ndarray | np.generic | torch.Tensor | int | float):
        arr = np.asarray(y.cpu() if isinstance(y, torch.Tensor) else y)
    if arr is None or arr.dtype.kind not in "biuf":
        raise DatasetFileError(
            f"{name}: {split} item {i} has label {y!r} ({type(y).__name__}); labels must be "
            "integer class indices (or numbers with data.targets: values)"
        )
    return arr


def _read_labels(ds, name: str, split: str, shape: tuple[int, ...]) -> list[np.ndarray]:
    """Every item's label, read item by item (each input checked against ``shape``)."""
    return _read_items(ds, name, split, shape)


def _read_items(ds, name: str, split: str, shape, into: torch.Tensor | None = None) -> list:  # noqa: ANN001
    """Every item's label, item by item, its input checked against ``shape`` and, with
    ``into``, stored in row ``i`` of it; each label of item 0's shape."""
    labels = []
    for i in range(len(ds)):
        x, y = _item(ds, i, name, split)
        x = _checked(x, i, name, split, shape)
        if into is not None:
            into[i] = x
        labels.append(_label(y, i, name, split))
        if labels[i].shape != labels[0].shape:
            raise DatasetFileError(
                f"{name}: {split} item {i}'s label has shape {list(labels[i].shape)}, "
                f"item 0's {list(labels[0].shape)}"
            )
    return labels


def _as_labels(given: object, n: int, name: str, split: str, values: bool) -> np.ndarray:
    """The labels (int64 ``[N]``) or, with ``values``, the float32 targets ``[N, ...]``."""
    y = np.asarray(given.cpu() if isinstance(given, torch.Tensor) else given)
    if values and y.dtype.kind in "biuf" and y.ndim >= 1 and len(y) == n:
        return np.ascontiguousarray(y, dtype=np.float32)
    if y.dtype.kind == "f" and np.isfinite(y).all() and (y == np.round(y)).all():
        y = y.astype(np.int64)  # whole-number float labels (1.0) are class labels
    if y.ndim != 1 or y.dtype.kind not in "iu" or len(y) != n:
        hint = " (float targets: train.loss mse or data.targets: values)" * (y.dtype.kind == "f")
        raise DatasetFileError(
            f"{name}: {split} labels must be {n} integers, got {y.dtype} {list(y.shape)}{hint}"
        )
    return y.astype(np.int64)


def _torch_labels(ds, name: str, split: str, values: bool, shape) -> np.ndarray:  # noqa: ANN001
    """The labels from a ``targets`` (or ``labels``) attribute, else read from every item
    (their inputs checked against ``shape``). Labels from an attribute are checked against a
    few items (:func:`_spot_check`) unless the dataset declares ``input_shape``: its items
    are then read only when a batch needs them (and checked then)."""
    given = _given_labels(ds)
    if given is None:
        return _as_labels(_read_labels(ds, name, split, shape), len(ds), name, split, values)
    y = _as_labels(given, len(ds), name, split, values)
    if getattr(ds, "input_shape", None) is None:
        _spot_check(ds, name, split, shape, y)
    return y


def _spot_check(ds, name: str, split: str, shape, y: np.ndarray) -> None:  # noqa: ANN001
    """A few items spread over the dataset, the last one included (a ``len()`` larger than
    the items), must have inputs of ``shape`` and the label its ``targets`` attribute gives."""
    spread = np.linspace(0, len(ds) - 1, SPOT_CHECKS).astype(int).tolist()
    for i in sorted(set(spread), reverse=True):  # the last first: a len() too large
        x, label = _item(ds, i, name, split)
        _checked(x, i, name, split, shape)
        got = _label(label, i, name, split)
        if got.shape != y[i].shape or not np.array_equal(got.astype(y.dtype), y[i]):
            raise DatasetFileError(
                f"{name}: {split} item {i} has label {got.tolist()} but the dataset's "
                f"targets attribute says {y[i].tolist()}"
            )


def _torch_split(ds, name: str, split: str, lazy: bool | None, values: bool) -> ArrayDataset:
    if len(ds) == 0:
        raise DatasetFileError(f"{name}: {split} dataset holds no samples")
    held = _held_tensors(ds)
    if held is not None:
        return _from_held(*held, name, split, lazy, values)
    shape, dtype = getattr(ds, "input_shape", None), getattr(ds, "input_dtype", torch.float32)
    if shape is None:  # read from the first item (a device then reads one sample not its own)
        first = _as_tensor(_item(ds, 0, name, split)[0])
        shape, dtype = first.shape, first.dtype
    shape = tuple(shape)

    def read(idx: np.ndarray) -> torch.Tensor:
        out = torch.empty((len(idx), *shape), dtype=dtype)
        for row, i in enumerate(idx.tolist()):
            out[row] = _checked(_item(ds, i, name, split)[0], i, name, split, shape)
        return out

    given = _given_labels(ds)
    if given is None and not want_lazy(lazy, len(ds), shape):  # one pass: inputs and labels
        x, labels = _read_all(ds, name, split, shape, dtype)
        return ArrayDataset(x, torch.from_numpy(_as_labels(labels, len(ds), name, split, values)))
    y = _torch_labels(ds, name, split, values, shape)
    x = finish_inputs(LazyInputs(read, len(ds), shape, dtype), lazy)
    return ArrayDataset(x, torch.from_numpy(y))


def _read_all(ds, name: str, split: str, shape, dtype) -> tuple[torch.Tensor, list]:  # noqa: ANN001
    """Every item's input (into one preallocated tensor: no list of samples and a stack, which
    held the data twice) and label, in one pass, each checked as :func:`_read_labels` does."""
    x = torch.empty((len(ds), *shape), dtype=dtype)
    return x, _read_items(ds, name, split, shape, into=x)


#: Label dtypes a :class:`torch.utils.data.TensorDataset` is taken whole with (numpy has them).
_HELD_LABEL_DTYPES = (
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.float32,
    torch.float64,
)


def _held_tensors(ds) -> tuple[torch.Tensor, torch.Tensor] | None:  # noqa: ANN001
    """The ``(inputs, labels)`` tensors of a ``TensorDataset`` whose items are exactly their
    rows — its own ``__getitem__``, CPU tensors, real or integer inputs, labels of a dtype
    numpy holds, no ``targets``/``labels``/``input_shape`` attribute — else None (read item by
    item). Such a dataset is taken without a pass over its items (issue 54)."""
    if not isinstance(ds, TensorDataset) or type(ds).__getitem__ is not TensorDataset.__getitem__:
        return None
    if any(getattr(ds, a, None) is not None for a in ("targets", "labels", "input_shape")):
        return None
    if len(ds.tensors) < 2:
        return None
    x, y = ds.tensors[0], ds.tensors[1]
    if x.device.type != "cpu" or y.device.type != "cpu" or x.is_complex() or x.dim() < 1:
        return None
    return (x, y) if y.dtype in _HELD_LABEL_DTYPES else None


def _from_held(
    x: torch.Tensor, y: torch.Tensor, name: str, split: str, lazy: bool | None, values: bool
) -> ArrayDataset:
    """A ``TensorDataset``'s tensors as the split the item-by-item read gives: integer inputs
    as int64, others as float32 (the user's tensor itself where it already is one), labels by
    :func:`_as_labels`; kept behind :class:`LazyInputs` where ``lazy`` says so."""
    integer = not x.is_floating_point() and x.dtype != torch.bool
    inputs = (x.long() if integer else x.float()).contiguous()
    labels = torch.from_numpy(_as_labels(y.numpy(), len(inputs), name, split, values))
    shape = tuple(inputs.shape[1:])
    if not want_lazy(lazy, len(inputs), shape):
        return ArrayDataset(inputs, labels)

    def read(idx: np.ndarray) -> torch.Tensor:
        return inputs[torch.from_numpy(idx)]

    return ArrayDataset(LazyInputs(read, len(inputs), shape, inputs.dtype), labels)


def _given_labels(ds) -> object | None:  # noqa: ANN001
    """A dataset's ``targets`` (else ``labels``) attribute, None without one."""
    given = getattr(ds, "targets", None)
    return getattr(ds, "labels", None) if given is None else given


def _from_torch(train, test, name: str, o: ContainerOptions) -> DatasetBundle:
    a = _torch_split(train, name, "train", o.lazy, o.values)
    b = _torch_split(test, name, "test", o.lazy, o.values)
    classes = getattr(train, "num_classes", None)
    if classes is None and getattr(train, "classes", None) is not None:
        classes = len(train.classes)
    top = int(a.y[0].numel()) if o.values else int(max(a.y.max(), b.y.max())) + 1
    shape = tuple(getattr(train, "input_shape", None) or a.x.shape[1:])
    return DatasetBundle(name, a, b, int(classes or top), tuple(int(s) for s in shape))


def bundle_from(obj: object, name: str, lazy: bool | None = None, **options) -> DatasetBundle:
    """``obj`` (see the module docstring) as a :class:`DatasetBundle` named ``name``;
    ``options``: ``label_column``, ``image_size`` for Hugging Face data. Raises a one-line
    :class:`DatasetError` for anything else."""
    opts = ContainerOptions(lazy=lazy, **options)
    if isinstance(obj, DatasetBundle):
        if not all(isinstance(s, ArrayDataset) for s in (obj.train, obj.test)):
            read = _from_torch(obj.train, obj.test, name, opts)  # torch Datasets inside
            obj = dataclasses.replace(obj, train=read.train, test=read.test)
        return cast_labels(obj)
    if _is_hf(obj) and hasattr(obj, "keys"):
        if not {"train", "test"} <= set(obj.keys()):
            raise DatasetError(f"{name}: a DatasetDict needs splits train and test")
        return _hf_bundle(name, (obj["train"], obj["test"]), ("train", "test"), opts)
    if isinstance(obj, tuple | list) and len(obj) == 2:
        if all(_is_hf(s) for s in obj):
            return _hf_bundle(name, tuple(obj), ("train", "test"), opts)
        if all(hasattr(s, "__getitem__") and hasattr(s, "__len__") for s in obj):
            return _from_torch(obj[0], obj[1], name, opts)
    raise DatasetError(
        f"{name}: expected a DatasetBundle, a (train, test) pair of torch Datasets or a "
        f"Hugging Face DatasetDict, got {type(obj).__name__}"
    )
