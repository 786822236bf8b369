"""``data.format: image_folder``: ``<split>/<class>/<image>`` trees read with Pillow.

Classes are the training split's sub-folder names, sorted; label ``k`` is the ``k``-th name.
Every image is converted to the colour mode of the first training image (grayscale ``L`` for
``1``/``L``/``LA``/``I``/``F`` images, else ``RGB``), resized to ``data.image_size`` when given
(bilinear) — else every image must have the first one's size — and scaled to ``[0, 1]``:
float32 ``[C, H, W]``. Eager splits decode every image at load time (a corrupt file is an error
then); lazy splits (:class:`~splitfl.data.lazy.LazyInputs`) decode an image when its sample is
read, and check it then. Either way a PNG without its end chunk (``IEND``: a truncated copy,
which Pillow may decode without complaint) is refused when the folder is listed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from splitfl.data.base import DatasetNotFoundError
from splitfl.data.formats.packages import require
from splitfl.data.lazy import LazyInputs, finish_inputs
from splitfl.data.loaders._common import file_error, reading

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
#: The chunk a complete PNG ends with, and how far from its end it is looked for.
PNG_END, PNG_TAIL = b"IEND", 1024
_GRAY = {"1", "L", "LA", "I", "I;16", "F"}


def class_folders(folder: Path, name: str) -> list[str]:
    """The sorted class sub-folder names of ``folder`` (a one-line error if there are none)."""
    if not folder.is_dir():
        raise DatasetNotFoundError(f"{name}: missing folder {folder} (expected <class>/<image>)")
    classes = sorted(p.name for p in folder.iterdir() if p.is_dir())
    if not classes:
        raise DatasetNotFoundError(f"{name}: {folder} holds no class folders")
    return classes


def list_images(folder: Path, classes: list[str], name: str) -> tuple[list[Path], np.ndarray]:
    """Every image under ``folder/<class>/`` (sorted per class) and its label (class index).
    A class folder that ``classes`` does not name is an error naming it."""
    index = {c: k for k, c in enumerate(classes)}
    paths: list[Path] = []
    labels: list[int] = []
    for sub in sorted(p for p in folder.iterdir() if p.is_dir()):
        if sub.name not in index:
            raise file_error(name, sub, f"class {sub.name!r} is not among the training classes")
        files = sorted(p for p in sub.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        for path in files:
            check_complete(path, name)
        paths += files
        labels += [index[sub.name]] * len(files)
    if not paths:
        raise DatasetNotFoundError(f"{name}: no images ({', '.join(IMAGE_SUFFIXES)}) in {folder}")
    return paths, np.asarray(labels, dtype=np.int64)


def _pil(name: str):
    """Pillow's ``PIL.Image``, or a one-line DatasetError: ``name``'s image files need it."""
    return require("PIL.Image", f"{name}: image files")


def check_complete(path: Path, name: str) -> None:
    """A PNG must end with its ``IEND`` chunk: a truncated one is a one-line error naming it
    (a read of its last bytes; other formats are checked when decoded)."""
    if path.suffix.lower() != ".png":
        return
    with reading(name, path), open(path, "rb") as fh:
        size = fh.seek(0, 2)
        fh.seek(max(0, size - PNG_TAIL))
        tail = fh.read()
    if PNG_END not in tail:
        raise file_error(name, path, f"is truncated ({size} bytes, no PNG end chunk)")


class ImageDecoder:
    """Turns images into ``[C, H, W]`` arrays in one colour mode and size (those of the
    first image, or ``data.image_size``)."""

    def __init__(self, first, name: str, image_size: list[int] | None):
        self.name = name
        self.mode = "L" if first.mode in _GRAY else "RGB"
        w, h = first.size
        self.size = (int(image_size[1]), int(image_size[0])) if image_size else (w, h)
        self.resize = image_size is not None

    @classmethod
    def from_file(cls, path: Path, name: str, image_size: list[int] | None) -> ImageDecoder:
        Image = _pil(name)

        with reading(name, path), Image.open(path) as im:
            return cls(im, name, image_size)

    @property
    def sample_shape(self) -> tuple[int, int, int]:
        return (1 if self.mode == "L" else 3, self.size[1], self.size[0])

    def array(self, im, where: Path | str) -> np.ndarray:
        """A PIL image as uint8 ``[C, H, W]``; a one-line error naming ``where`` if its size
        differs from the first image's (and no ``data.image_size`` is set)."""
        Image = _pil(self.name)

        with reading(self.name, where):
            im = im.convert(self.mode)
            if self.resize:
                im = im.resize(self.size, Image.Resampling.BILINEAR)
            arr = np.asarray(im, dtype=np.uint8)
        if arr.shape[:2] != (self.size[1], self.size[0]):
            raise file_error(
                self.name,
                where,
                f"is {arr.shape[1]}x{arr.shape[0]}, the first image {self.size[0]}x"
                f"{self.size[1]}; set data.image_size to resize",
            )
        return arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)

    def pixels(self, path: Path) -> np.ndarray:
        """Image file ``path`` as uint8 ``[C, H, W]`` (one-line errors name it)."""
        Image = _pil(self.name)

        with reading(self.name, path), Image.open(path) as im:
            return self.array(im, path)

    def scaled(self, arrays: list[np.ndarray]) -> torch.Tensor:
        return torch.from_numpy(np.stack(arrays).astype(np.float32) / 255.0)

    def read(self, paths: list[Path]) -> torch.Tensor:
        return self.scaled([self.pixels(p) for p in paths])


def image_inputs(paths: list[Path], decoder: ImageDecoder, lazy: bool | None):
    """The images as one tensor, or lazy (decoded when read), per ``data.lazy``."""
    x = LazyInputs(
        lambda idx: decoder.read([paths[i] for i in idx]), len(paths), decoder.sample_shape
    )
    return finish_inputs(x, lazy)
