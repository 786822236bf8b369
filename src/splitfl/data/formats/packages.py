"""The optional packages the data formats read with, and the splitfl extra that installs each.

A minimal device install (``pip install --no-deps splitfl-*.whl`` plus torch, numpy, PyYAML,
grpcio) reads npz, npy and csv; the other formats import a package it may lack. Asking for
one that is missing is a one-line :class:`~splitfl.data.base.DatasetError` naming the package
and the extra (``image_folder needs the Pillow package: pip install 'pillow>=9' (splitfl's
[images] extra)``), never an ``ImportError`` traceback.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from splitfl.data.base import DatasetError

#: module → (its distribution's requirement, as pyproject.toml's extra names it; the extra)
PACKAGES: dict[str, tuple[str, str]] = {
    "PIL": ("pillow>=9", "images"),
    "datasets": ("datasets>=2.14", "hf"),
    "pyarrow": ("datasets>=2.14", "hf"),  # datasets brings pyarrow
}
#: data.format → the modules reading it imports
FORMAT_MODULES: dict[str, tuple[str, ...]] = {
    "image_folder": ("PIL",),
    "hf": ("datasets",),
    "parquet": ("datasets", "pyarrow"),
}
_DISPLAY = {"PIL": "Pillow"}


def require(module: str, what: str) -> ModuleType:
    """``module`` imported, or a one-line DatasetError: ``what`` needs it, and how to install
    it (the requirement and the splitfl extra of :data:`PACKAGES`)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        top = module.split(".")[0]
        requirement, extra = PACKAGES[top]
        name = _DISPLAY.get(top, top)
        raise DatasetError(
            f"{what} needs the {name} package: pip install '{requirement}' "
            f"(splitfl's [{extra}] extra)"
        ) from None


def require_format(fmt: str, what: str) -> None:
    """Every optional package data format ``fmt`` reads with (:data:`FORMAT_MODULES`) is
    importable, else a one-line DatasetError (:func:`require`) about ``what``."""
    for module in FORMAT_MODULES.get(fmt, ()):
        require(module, f"{what}: data format {fmt}")
