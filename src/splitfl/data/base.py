"""In-memory datasets and the loader registry (``data.dataset: mnist`` in a config)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from splitfl.config import ConfigError
from splitfl.config.choices import unknown_choice
from splitfl.core.usercode import user_code
from splitfl.training.losses import IGNORE


class DatasetError(ValueError):
    """A dataset cannot be used; ``str(err)`` is one line naming the file or folder at fault.

    The CLI turns it into ``error: ...`` with exit code 2 before any run directory exists."""


class DatasetNotFoundError(DatasetError, FileNotFoundError):
    """A dataset's files are missing; the message names the path and the expected files."""


class DatasetFileError(DatasetError):
    """A dataset file is corrupt or inconsistent (unreadable, wrong counts, shapes, dtypes or
    labels, or, with ``data.verify: strict``, not the canonical file); the message names it."""


class DatasetWarning(UserWarning):
    """Something about a dataset's files is worth a one-line note (e.g. a checksum differs)."""


#: Most classes (or outputs) a dataset may have: labels are class indices, and each client's
#: label histogram holds a count per class (a label of 2**40 would ask for terabytes).
MAX_CLASSES = 1 << 20

#: ``data.verify`` modes: compare standard files with their published checksums and warn,
#: fail, or skip the comparison (see :mod:`splitfl.data.loaders._checksums`).
VERIFY_MODES = ("warn", "strict", "off")


@dataclass
class ArrayDataset:
    """A dataset held as tensors.

    Attributes:
        x: Inputs, shape ``[N, *input_shape]``: float32 (already normalised), or int64
            (token ids, category codes: integer arrays keep their integers).
        y: Labels, int64, shape ``[N]``.
        writers: Optional per-sample writer/user id (int array ``[N]``) for natural partitions.
    """

    x: torch.Tensor
    y: torch.Tensor
    writers: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def subset(self, indices: np.ndarray) -> ArrayDataset:
        idx = torch.as_tensor(np.asarray(indices, dtype=np.int64))
        writers = None if self.writers is None else self.writers[np.asarray(indices)]
        return ArrayDataset(self.x[idx], self.y[idx], writers)


@dataclass
class DatasetBundle:
    """Train and test splits plus the facts a model needs. ``black``: per channel, the value
    a black (0) pixel has in the stored inputs, for loaders that normalise images (a padded
    ``random_crop`` fills with it, as torchvision pads before normalising); None = 0."""

    name: str
    train: ArrayDataset
    test: ArrayDataset
    num_classes: int
    input_shape: tuple[int, ...]
    black: tuple[float, ...] | None = None
    #: Class ``k``'s name where the data names classes (an image folder's class folders, in
    #: label order); recorded in the run directory's ``data.json``.
    class_names: tuple[str, ...] | None = None


Loader = Callable[..., DatasetBundle]  # loader(root: Path | None, **options) -> DatasetBundle


@dataclass(frozen=True)
class DatasetShape:
    """What a dataset's samples look like, known without reading its files."""

    input_shape: tuple[int, ...]
    num_classes: int
    #: The inputs' dtype (int64 for token ids).
    dtype: torch.dtype = torch.float32


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    loader: Loader
    description: str
    needs_root: bool
    #: Per-sample input shape and classes where fixed by the format (``data.train_samples``).
    shape: DatasetShape | None = None


DATASETS: dict[str, DatasetSpec] = {}


def register_dataset(
    name: str,
    description: str = "",
    needs_root: bool = True,
    shape: DatasetShape | None = None,
    *,
    replace: bool = False,
):
    """Decorator adding ``loader(root, **options) -> DatasetBundle`` to :data:`DATASETS`
    under ``name`` (``data.dataset: name``). A name already registered (``mnist`` included)
    is a ``ValueError`` unless ``replace=True``; names hold no ``:`` (an import path)."""
    if not isinstance(name, str) or not name or ":" in name:
        raise ValueError(f"dataset name must be a non-empty string without ':' (got {name!r})")

    def wrap(loader: Loader) -> Loader:
        old = DATASETS.get(name)
        if old is not None and old.loader is not loader and not replace:
            raise ValueError(
                f"dataset {name!r} is already registered "
                f"({old.loader.__module__}.{old.loader.__qualname__}); "
                "pick another name or pass replace=True"
            )
        about = description or (inspect.getdoc(loader) or "").strip().split("\n")[0]
        DATASETS[name] = DatasetSpec(name, loader, about, needs_root, shape)
        return loader

    return wrap


def black_of(mean: tuple[float, ...], std: tuple[float, ...]) -> tuple[float, ...]:
    """The normalised value ``(0 - mean) / std`` of a black pixel per channel
    (:attr:`DatasetBundle.black` of a loader that normalises with ``mean``/``std``)."""
    return tuple(-m / s for m, s in zip(mean, std, strict=True))


def labels_only(name: str, train_samples: int) -> DatasetBundle:
    """``name``'s shape with ``train_samples`` class-balanced training labels (sample ``i``
    has label ``i mod C``) and no images: inputs are one zero sample broadcast to every index
    (no memory), the test split one sample per class. For ``executor: timing``, which
    partitions labels and prices rounds but trains nothing. Raises ``KeyError`` for a dataset
    whose shape is not registered."""
    _load_all()
    shape = DATASETS[name].shape if name in DATASETS else None
    if shape is None:
        raise KeyError(name)
    c = shape.num_classes

    def split(n: int) -> ArrayDataset:
        x = torch.zeros(1, *shape.input_shape, dtype=shape.dtype).expand(n, *shape.input_shape)
        return ArrayDataset(x, torch.arange(n, dtype=torch.int64) % c)

    return DatasetBundle(name, split(train_samples), split(c), c, shape.input_shape)


def dataset_names() -> list[str]:
    _load_all()
    return sorted(DATASETS)


def load_dataset(
    name: str, root: str | Path | None = None, verify: str = "warn", **options
) -> DatasetBundle:
    """Load registered dataset ``name`` from ``root`` (ignored by embedded datasets).

    ``verify`` (one of :data:`VERIFY_MODES`) goes to the loaders that know published checksums
    (MNIST, Fashion-MNIST, CIFAR-10/100); other ``options`` (``tokenizer``, ``max_length``)
    to the loaders whose signature takes them. Every bundle is checked by :func:`check_bundle`.
    Raises :class:`DatasetError` (one line) for missing, corrupt or inconsistent files.
    """
    _load_all()
    if name not in DATASETS:
        raise KeyError(f"data.dataset: {unknown_choice(name, sorted(DATASETS))}")
    if verify not in VERIFY_MODES:
        raise ValueError(f"verify must be one of {', '.join(VERIFY_MODES)}, got {verify!r}")
    spec = DATASETS[name]
    takes = inspect.signature(spec.loader).parameters
    if "verify" in takes:
        options["verify"] = verify
    options = {k: v for k, v in options.items() if k in takes or k == "verify"}
    with user_code(f"{name}: loader {_named(spec)}", DatasetError, (DatasetError, ConfigError)):
        try:
            bundle = spec.loader(Path(root) if root is not None else None, **options)
        except ModuleNotFoundError as err:  # a package the loader imports is missing
            raise DatasetError(missing_package(name, err)) from None
    if not isinstance(bundle, DatasetBundle):
        raise DatasetError(
            f"{name}: loader {_named(spec)} returned {type(bundle).__name__}, not a DatasetBundle"
        )
    where = f"{name}: files in {root}" if root is not None else f"{name}: loader {_named(spec)}"
    check_bundle(cast_labels(bundle), where)
    return bundle


#: Import name → the distribution pip installs it from, where they differ.
DISTRIBUTIONS = {
    "sklearn": "scikit-learn",
    "PIL": "pillow",
    "yaml": "pyyaml",
    "cv2": "opencv-python",
}


def missing_package(name: str, err: ModuleNotFoundError) -> str:
    """One line: dataset ``name``'s loader needs the package ``err`` did not find, and the
    command that installs it (``digits`` reads scikit-learn's bundled file: ``pip install
    scikit-learn``)."""
    module = (err.name or str(err)).split(".")[0]
    package = DISTRIBUTIONS.get(module, module)
    return (
        f"{name}: its loader needs the {package} package (import {module}): pip install {package}"
    )


def _named(spec: DatasetSpec) -> str:
    return f"{spec.loader.__module__}.{getattr(spec.loader, '__qualname__', spec.loader)}"


def cast_labels(bundle: DatasetBundle) -> DatasetBundle:
    """``bundle`` with integer labels of any dtype (int8..int32, uint8, ...) as int64
    (other dtypes are left for :func:`check_bundle` to refuse)."""
    for part in (bundle.train, bundle.test):
        y = part.y if isinstance(part.y, torch.Tensor) else torch.as_tensor(np.asarray(part.y))
        if not y.is_floating_point() and not y.is_complex() and y.dtype != torch.bool:
            y = y.to(torch.int64)
        part.y = y
    return bundle


def _check_split(part: ArrayDataset, split: str, bundle: DatasetBundle, where: str) -> None:
    def fail(message: str) -> None:
        raise DatasetFileError(f"{where}: {split} split {message}")

    n = len(part.x)
    if n == 0:
        fail("holds no samples")
    targets = part.y.is_floating_point()  # regression / multi-hot targets (train.loss)
    tokens = part.y.dtype == torch.int64 and part.y.dim() == 2  # next-token ids (causal_lm)
    if targets and (part.y.dim() == 0 or len(part.y) != n):
        fail(f"targets must be float [{n}, ...], got {list(part.y.shape)}")
    if tokens and len(part.y) != n:
        fail(f"token targets must be int64 [{n}, T], got {list(part.y.shape)}")
    if not (targets or tokens) and (part.y.dtype != torch.int64 or tuple(part.y.shape) != (n,)):
        fail(
            f"labels must be int64 [{n}] (or token ids [{n}, T]), got {part.y.dtype} "
            f"{list(part.y.shape)}"
        )
    if tuple(part.x.shape[1:]) != tuple(bundle.input_shape):
        fail(f"inputs have shape {list(part.x.shape[1:])}, expected {list(bundle.input_shape)}")
    if targets and not bool(torch.isfinite(part.y).all()):
        fail("holds NaN or infinite targets")
    real = part.y[part.y != IGNORE] if tokens else part.y  # padding positions carry IGNORE
    lo, hi = (0, 0) if targets or not real.numel() else (int(real.min()), int(real.max()))
    if lo < 0 or hi >= bundle.num_classes:
        fail(f"labels span {lo}..{hi}, outside 0..{bundle.num_classes - 1}")
    if part.writers is not None and part.writers.shape != (n,):
        fail(f"has {part.writers.shape[0]} writer ids for {n} samples")
    lazy = not isinstance(part.x, torch.Tensor)  # LazyInputs: checked as samples are read
    if not lazy and part.x.is_floating_point() and not all_finite(part.x):
        fail("holds NaN or infinite input values")


#: Elements :func:`all_finite` checks at a time (16 MiB of float32).
FINITE_CHUNK = 1 << 22


def all_finite(x: torch.Tensor) -> bool:
    """No NaN or infinity in ``x``, checked a block of rows at a time: ``torch.isfinite`` of
    the whole tensor holds a float copy and two masks (1.6x the inputs' bytes, the peak of
    preparing an in-memory dataset; issue 54)."""
    if x.dim() == 0 or not x.is_floating_point():
        return bool(torch.isfinite(x).all())
    rows = max(1, FINITE_CHUNK // max(1, x[0].numel()))
    return all(bool(torch.isfinite(x[i : i + rows]).all()) for i in range(0, len(x), rows))


def check_bundle(bundle: DatasetBundle, where: str) -> None:
    """Invariants every loader's output must meet, whatever the format: both splits non-empty,
    int64 labels in ``0..num_classes-1`` (or finite float targets ``[N, ...]`` for
    ``train.loss: mse``/``bce_logits``, or int64 token ids ``[N, T]`` with ``IGNORE`` at
    padding for ``causal_lm``; checked against the loss when the run is built),
    inputs of ``input_shape``, finite values, one writer id per sample, at most
    :data:`MAX_CLASSES` classes. Raises a one-line
    :class:`DatasetFileError` starting with ``where``."""
    if bundle.num_classes > MAX_CLASSES:
        raise DatasetFileError(
            f"{where}: {bundle.num_classes} classes (labels must be class indices 0..C-1, "
            f"C at most {MAX_CLASSES})"
        )
    for split, part in (("train", bundle.train), ("test", bundle.test)):
        _check_split(part, split, bundle, where)


def unseen_test_labels(bundle: DatasetBundle) -> list[int]:
    """Class labels of the test split that no training sample has (sorted); none for float
    targets, token ids or an empty training split (the devices hold it)."""
    train, test = bundle.train.y, bundle.test.y
    if train.is_floating_point() or train.dim() != 1 or not len(train) or test.dim() != 1:
        return []
    return sorted(set(test.unique().tolist()) - set(train.unique().tolist()))


def require_files(folder: Path, names: list[str], dataset: str) -> None:
    """Raise :class:`DatasetNotFoundError` (one line) unless every file in ``names`` exists."""
    missing = [n for n in names if not (folder / n).exists()]
    if missing:
        raise DatasetNotFoundError(
            f"{dataset}: missing files in {folder}: expected {', '.join(names)}"
        )


def _load_all() -> None:
    import splitfl.data.loaders  # noqa: F401  (registers the loaders)
