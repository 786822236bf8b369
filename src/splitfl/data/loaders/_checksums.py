"""Compare standard dataset files with their published MD5 checksums (``data.verify``).

The MD5s are the ones the dataset authors publish and torchvision checks after a download:
the four gzipped idx files of MNIST and of Fashion-MNIST, the six CIFAR-10 python batches and
the two CIFAR-100 python files. For the idx files the MD5 of the decompressed content (also
published, e.g. alongside QMNIST) is accepted as well, so a re-gzipped but byte-identical copy
(as in ``/work/shared/data/MNIST``) or an uncompressed one counts as canonical.

Only a file that *claims* to be a standard file is compared: its name is canonical and it
holds the canonical number of samples (60,000/10,000 for the idx files, 10,000 per CIFAR-10
batch, 50,000/10,000 for CIFAR-100). Subsets (e.g. the class-balanced CIFAR-10 subset in
``/work/shared/data``) and generated fixtures hold fewer samples and are not hashed, so they
give no warning. Modes: ``warn`` (default) emits one :class:`DatasetWarning` line naming the file,
``strict`` raises :class:`DatasetFileError`, ``off`` skips the comparison. Digests are cached per
(path, size, mtime), so a file is hashed at most once per process.
"""

from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass
from pathlib import Path

from splitfl.data.base import DatasetWarning
from splitfl.data.loaders._common import file_error


@dataclass(frozen=True)
class Canonical:
    """A standard file: samples it holds, MD5 as published, MD5 of its decompressed content."""

    samples: int
    md5: str
    content_md5: str | None = None


_IDX = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
_IDX_SAMPLES = (60_000, 60_000, 10_000, 10_000)
_MNIST_GZ = (
    "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    "d53e105ee54ea40749a09fcbcd1e9432",
    "9fb629c4189551a2d022fa330f9573f3",
    "ec29112dd5afa0611ce80d1b7f02629c",
)
_MNIST_RAW = (
    "6bbc9ace898e44ae57da46a324031adb",
    "a25bea736e30d166cdddb491f175f624",
    "2646ac647ad5339dbf082846283269ea",
    "27ae3e4e09519cfbb04c329615203637",
)
_FASHION_GZ = (
    "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
    "25c81989df183df01b3e8a0aad5dffbe",
    "bef4ecab320f06d8554ea6380940ec79",
    "bb300cfdad3c16e7a12a480ee83cd310",
)
_FASHION_RAW = (
    "f4a8712d7a061bf5bd6d2ca38dc4d50a",
    "9018921c3c673c538a1fc5bad174d6f9",
    "8181f5470baa50b63fa0f6fddb340f0a",
    "15d484375f8d13e6eb1aabb0c3f46965",
)
_CIFAR10 = {
    "data_batch_1": "c99cafc152244af753f735de768cd75f",
    "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
    "data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
    "data_batch_4": "634d18415352ddfa80567beed471001a",
    "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
    "test_batch": "40351d587109b95175f43aff81a1287e",
}

#: ``(dataset, file name without .gz)`` -> the canonical file.
CANONICAL: dict[tuple[str, str], Canonical] = {
    **{
        ("mnist", n): Canonical(s, g, r)
        for n, s, g, r in zip(_IDX, _IDX_SAMPLES, _MNIST_GZ, _MNIST_RAW, strict=True)
    },
    **{
        ("fashion_mnist", n): Canonical(s, g, r)
        for n, s, g, r in zip(_IDX, _IDX_SAMPLES, _FASHION_GZ, _FASHION_RAW, strict=True)
    },
    **{("cifar10", n): Canonical(10_000, m) for n, m in _CIFAR10.items()},
    ("cifar100", "train"): Canonical(50_000, "16019d7e3df5f24257cddd939b257f8d"),
    ("cifar100", "test"): Canonical(10_000, "f0ef6b0ae62326f3e7ffdfab6717acfc"),
}

_DIGESTS: dict[tuple[str, int, int, str], str] = {}


def _md5(path: Path, data: bytes, kind: str) -> str:
    """MD5 of ``data`` (read from ``path``), cached by (path, size, mtime, kind)."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns, kind)
    if key not in _DIGESTS:
        _DIGESTS[key] = hashlib.md5(data, usedforsecurity=False).hexdigest()
    return _DIGESTS[key]


def verify_file(
    dataset: str,
    path: Path,
    file_bytes: bytes,
    samples: int,
    mode: str,
    content: bytes | None = None,
) -> None:
    """Compare ``path`` (its bytes ``file_bytes``; decompressed ``content`` for ``.gz``) with
    the canonical file of that name, if it holds the canonical number of ``samples``."""
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    canon = CANONICAL.get((dataset, name))
    if mode == "off" or canon is None or samples != canon.samples:
        return
    got = _md5(path, file_bytes, "file")
    if got in (canon.md5, canon.content_md5):
        return
    if content is not None and content is not file_bytes and canon.content_md5 is not None:
        if _md5(path, content, "content") == canon.content_md5:
            return
    expected = canon.md5 + (f" (or {canon.content_md5} uncompressed)" if canon.content_md5 else "")
    message = f"differs from the canonical file (md5 {got}, expected {expected})"
    if mode == "strict":
        raise file_error(dataset, path, f"{message}; set data.verify=warn or off to use it")
    warnings.warn(f"{dataset}: {path}: {message}", DatasetWarning, stacklevel=2)
