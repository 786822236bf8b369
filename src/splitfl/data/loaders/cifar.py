"""CIFAR-10 and CIFAR-100 from the python pickle batches.

Folder layout: CIFAR-10 in ``root/cifar-10-batches-py/`` or ``root/CIFAR10/cifar-10-batches-py/``
(``data_batch_1`` .. ``data_batch_5``, ``test_batch``; ``batches.meta`` unused); CIFAR-100 in
``root/cifar-100-python/`` or ``root/CIFAR100/cifar-100-python/`` (``train``, ``test``; ``meta``
unused). ``root`` may also point at the batch folder itself. Batches may be smaller than the
originals (e.g. class-balanced subsets). Images become float32 ``[N, 3, 32, 32]`` standardised
with the usual per-channel training-set mean/std.

The batches are user-supplied pickles (any protocol, 0-5), read with :class:`BatchUnpickler`,
which resolves only the globals the format needs (numpy's array/dtype/scalar reconstructors,
``_codecs.encode`` and ``bytes()``, the last two for bytes at protocol < 3; protocol 5's
``_frombuffer`` replaced by a version that builds plain-data arrays only), never arbitrary ones.
Each batch must be a dict with ``data`` uint8 ``[N, 3072]`` (or ``[N, 3, 32, 32]``) and
exactly ``N`` labels in range (a batch may hold no images, as long as each split has some);
any failure is a one-line :class:`~splitfl.data.base.DatasetFileError` naming the file.
Batches holding the canonical
number of images are compared with their published MD5s per ``verify`` (see ``_checksums``);
subsets are not.
"""

from __future__ import annotations

import _codecs
import io
import pickle
from pathlib import Path

import numpy as np

from splitfl.data.base import DatasetBundle, DatasetShape, black_of, register_dataset
from splitfl.data.loaders._checksums import verify_file
from splitfl.data.loaders._common import check_labels, file_error, find_folder, reading, to_dataset

CIFAR10_FILES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
CIFAR100_FILES = ["train", "test"]
CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN, CIFAR100_STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)


def _frombuffer(buffer: object, dtype: object, shape: object, order: object) -> np.ndarray:
    """numpy's protocol-5 array reconstructor (``numpy.core.numeric._frombuffer``), restricted
    to what an array of plain data needs: a bytes-like buffer and a dtype holding no objects."""
    if not isinstance(buffer, bytes | bytearray) or not isinstance(dtype, np.dtype):
        raise pickle.UnpicklingError("protocol-5 array without a bytes buffer and a dtype")
    if dtype.hasobject or order not in ("C", "F"):
        raise pickle.UnpicklingError(f"protocol-5 array of {dtype} in order {order!r}")
    return np.frombuffer(buffer, dtype=dtype).reshape(shape, order=order)


def _empty_bytes(*args: object) -> bytes:
    """``bytes()``, which Python 3 writes for an empty bytes object at protocol < 3 (an empty
    array's data); ``bytes`` with arguments is not needed by the format and not allowed."""
    if args:
        raise pickle.UnpicklingError("bytes() with arguments is not allowed in a batch")
    return b""


_RECONSTRUCT = np.ndarray(0).__reduce__()[0]  # numpy's array reconstructor, any numpy version
_SCALAR = np.int64(0).__reduce__()[0]
_ALLOWED = {
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("numpy.core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy._core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy.core.multiarray", "scalar"): _SCALAR,
    ("numpy._core.multiarray", "scalar"): _SCALAR,
    ("numpy.core.numeric", "_frombuffer"): _frombuffer,  # arrays pickled at protocol 5
    ("numpy._core.numeric", "_frombuffer"): _frombuffer,  # (Python 3.14's default)
    ("_codecs", "encode"): _codecs.encode,  # bytes pickled by Python 3 at protocol < 3
    ("__builtin__", "bytes"): _empty_bytes,
    ("builtins", "bytes"): _empty_bytes,
}


class BatchUnpickler(pickle.Unpickler):
    """Unpickler for CIFAR python batches: builtin containers, numpy arrays/dtypes/scalars."""

    def find_class(self, module: str, name: str) -> object:
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a batch")
        return _ALLOWED[(module, name)]


def read_batch(path: Path) -> dict:
    """Unpickle one CIFAR batch (Python-2 pickles, hence ``encoding='latin1'``) with
    :class:`BatchUnpickler`; a decoding failure is a one-line error naming ``path``."""
    return _read_batch(Path(path), "cifar", [])[0]


def _read_batch(path: Path, dataset: str, keys: list[str]) -> tuple[dict, bytes]:
    with reading(dataset, path):
        raw = path.read_bytes()
        batch = BatchUnpickler(io.BytesIO(raw), encoding="latin1").load()
    if not isinstance(batch, dict):
        raise file_error(dataset, path, f"holds a {type(batch).__name__}, expected a dict")
    missing = [k for k in ["data", *keys] if k not in batch]
    if missing:
        has = ", ".join(sorted(map(str, batch)))
        raise file_error(dataset, path, f"lacks keys {', '.join(missing)} (has {has})")
    return batch, raw


def _checked(
    path: Path, dataset: str, label_key: str, classes: int, verify: str
) -> tuple[np.ndarray, np.ndarray, dict]:
    """Images ``[N, 3, 32, 32]`` uint8 and labels of one batch file, checked (see module)."""
    batch, raw = _read_batch(path, dataset, [label_key])
    data = batch["data"]
    ok = isinstance(data, np.ndarray) and data.dtype == np.uint8
    shape = getattr(data, "shape", None)
    if not ok or shape is None or tuple(shape[1:]) not in ((3072,), (3, 32, 32)):
        dtype = getattr(data, "dtype", type(data).__name__)
        got = f"{dtype} {list(shape or [])}"
        raise file_error(dataset, path, f"data is {got}, expected uint8 [N, 3072]")
    images = data.reshape(-1, 3, 32, 32)
    labels = check_labels(batch[label_key], classes, dataset, path, count=len(images))
    verify_file(dataset, path, raw, len(images), verify)
    return images, labels, batch


@register_dataset(
    "cifar10",
    "CIFAR-10 python batches (root/cifar-10-batches-py/)",
    shape=DatasetShape((3, 32, 32), 10),
)
def load_cifar10(root: Path | None = None, verify: str = "warn") -> DatasetBundle:
    """CIFAR-10: 10 classes of 32x32 colour images (any number of images per batch)."""
    folder = find_folder(
        root, ["cifar-10-batches-py", "CIFAR10/cifar-10-batches-py"], CIFAR10_FILES, "cifar10"
    )
    parts = [_checked(folder / n, "cifar10", "labels", 10, verify) for n in CIFAR10_FILES]
    train_x = np.concatenate([p[0] for p in parts[:-1]])
    train_y = np.concatenate([p[1] for p in parts[:-1]])
    train = to_dataset(train_x, train_y, CIFAR10_MEAN, CIFAR10_STD)
    test = to_dataset(parts[-1][0], parts[-1][1], CIFAR10_MEAN, CIFAR10_STD)
    return DatasetBundle(
        "cifar10", train, test, 10, (3, 32, 32), black_of(CIFAR10_MEAN, CIFAR10_STD)
    )


@register_dataset(
    "cifar100",
    "CIFAR-100 python files (root/cifar-100-python/), fine|coarse labels",
    shape=DatasetShape((3, 32, 32), 100),  # fine labels, the default
)
def load_cifar100(
    root: Path | None = None, label_mode: str = "fine", verify: str = "warn"
) -> DatasetBundle:
    """CIFAR-100 with ``label_mode='fine'`` (100 classes) or ``'coarse'`` (20 superclasses)."""
    if label_mode not in ("fine", "coarse"):
        raise ValueError(f"cifar100: label_mode must be 'fine' or 'coarse', got {label_mode!r}")
    folder = find_folder(
        root, ["cifar-100-python", "CIFAR100/cifar-100-python"], CIFAR100_FILES, "cifar100"
    )
    key, classes = f"{label_mode}_labels", 100 if label_mode == "fine" else 20
    (train_x, train_y, _), (test_x, test_y, _) = (
        _checked(folder / n, "cifar100", key, classes, verify) for n in CIFAR100_FILES
    )
    train = to_dataset(train_x, train_y, CIFAR100_MEAN, CIFAR100_STD)
    test = to_dataset(test_x, test_y, CIFAR100_MEAN, CIFAR100_STD)
    shape, zero = (3, 32, 32), black_of(CIFAR100_MEAN, CIFAR100_STD)
    return DatasetBundle("cifar100", train, test, classes, shape, zero)
