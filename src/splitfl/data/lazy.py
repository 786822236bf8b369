"""Inputs read on demand: a dataset's ``x`` that reads only the samples it is indexed with.

A :class:`LazyInputs` stands where an :class:`~splitfl.data.base.ArrayDataset` holds its
``x`` tensor. It supports what the executors, the evaluation and the device processes do with
``x`` — ``x[index_tensor]`` (any shape of int64 indices: one client's batch, or the
``[rows, batch]`` indices of the vectorised executor), ``x[:k]``, ``x[i]``, ``len(x)``,
``x.shape``, ``x.dtype``, ``x.to(dtype)`` — and reads nothing else: a device process
(:mod:`splitfl.net.device.agent`) that indexes it with its own clients' samples reads only those,
and a simulated round reads each client's batches as they are drawn. Labels are never lazy
(the partitioners need all of them). ``materialize()`` reads everything (one tensor).

Backing stores: a map-style torch ``Dataset`` (``dataset[i][0]``), image files, a
memory-mapped ``.npy`` array, a Hugging Face ``datasets.Dataset`` (see
:mod:`splitfl.data.formats`); each gives a ``read(indices) -> Tensor[k, *sample_shape]``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

Reader = Callable[[np.ndarray], torch.Tensor]  # read(int64 indices [k]) -> [k, *sample_shape]

#: ``data.lazy: null`` (auto) keeps a split lazy when its inputs as float32 would exceed this.
AUTO_LAZY_BYTES = 1 << 30


class LazyInputs:
    """``x`` of ``length`` samples of ``sample_shape``, read through ``read`` when indexed.

    ``post`` (optional) maps every read batch (e.g. the ``normalize`` transform, a dtype
    cast); it must work sample by sample, so that any batch gives the same values per sample.
    """

    def __init__(
        self,
        read: Reader,
        length: int,
        sample_shape: tuple[int, ...],
        dtype: torch.dtype = torch.float32,
        post: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ):
        self._read, self._length = read, int(length)
        self.sample_shape, self._dtype, self._post = tuple(sample_shape), dtype, post

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self._length, *self.sample_shape))

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def __len__(self) -> int:
        return self._length

    def is_floating_point(self) -> bool:
        return self._dtype.is_floating_point

    def dim(self) -> int:
        return 1 + len(self.sample_shape)

    def __getitem__(self, index) -> torch.Tensor:
        if isinstance(index, int | np.integer):
            return self._fetch(np.array([int(index)]))[0]
        if isinstance(index, slice):
            return self._fetch(np.arange(self._length)[index])
        idx = np.asarray(index.cpu() if isinstance(index, torch.Tensor) else index)
        if idx.dtype == np.bool_ or idx.dtype.kind not in "iu":
            raise TypeError(f"lazy inputs take integer indices, got {idx.dtype}")
        flat = self._fetch(idx.reshape(-1).astype(np.int64))
        return flat.reshape(*idx.shape, *self.sample_shape)

    def _fetch(self, idx: np.ndarray) -> torch.Tensor:
        if idx.size and (idx.min() < -self._length or idx.max() >= self._length):
            raise IndexError(f"index out of range for {self._length} samples")
        idx = np.where(idx < 0, idx + self._length, idx)
        if idx.size == 0:
            return torch.empty((0, *self.sample_shape), dtype=self._dtype)
        x = self._read(idx)
        if self._post is not None:
            x = self._post(x)
        return x.to(self._dtype)

    def to(self, *args, **kwargs) -> LazyInputs:
        """``x.to(dtype)``: cast on read. Another device than the CPU is refused: lazy inputs
        are read per batch (an executor that stacks all inputs materialises a subset)."""
        dtype = kwargs.get("dtype") or next((a for a in args if isinstance(a, torch.dtype)), None)
        device = kwargs.get("device") or next(
            (a for a in args if isinstance(a, str | torch.device)), None
        )
        if device is not None and torch.device(device).type != "cpu":
            raise TypeError("lazy inputs stay on the CPU; index them and move the batch")
        if dtype is None:
            return self
        return LazyInputs(self._read, self._length, self.sample_shape, dtype, self._post)

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> LazyInputs:
        """The same inputs with ``fn`` applied to every read batch (after any earlier map)."""
        post = fn if self._post is None else (lambda x, f=self._post: fn(f(x)))
        return LazyInputs(self._read, self._length, self.sample_shape, self._dtype, post)

    def materialize(self) -> torch.Tensor:
        """Every sample, read now (one tensor)."""
        return self._fetch(np.arange(self._length))


def is_lazy(x: object) -> bool:
    return isinstance(x, LazyInputs)


def want_lazy(lazy: bool | None, length: int, sample_shape: tuple[int, ...]) -> bool:
    """``data.lazy``: true/false as given; null (auto) → lazy when the float32 inputs would
    exceed :data:`AUTO_LAZY_BYTES`."""
    if lazy is not None:
        return lazy
    return 4 * length * int(np.prod(sample_shape, dtype=np.int64)) > AUTO_LAZY_BYTES


def finish_inputs(x: LazyInputs, lazy: bool | None) -> torch.Tensor | LazyInputs:
    """``x`` as it is (lazy) or read into one tensor, per :func:`want_lazy`."""
    return x if want_lazy(lazy, len(x), x.sample_shape) else x.materialize()
