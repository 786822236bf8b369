"""The same small dataset as a ``TensorDataset`` pair (taken whole, issue 54) and as plain
map-style datasets read item by item, for ``data.dataset: fast_path_fixtures:<name>``."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset, TensorDataset


def tensors(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` inputs of 1x8x8 and labels 0..9, drawn from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(n, 1, 8, 8, generator=gen), torch.randint(0, 10, (n,), generator=gen)


class Items(Dataset):
    """``(x[i], y[i])`` item by item (no attribute a fast path could take)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor):
        self._x, self._y = x, y
        self.reads = 0

    def __len__(self) -> int:
        return len(self._x)

    def __getitem__(self, i: int):
        self.reads += 1
        return self._x[i], self._y[i]


def tensor_pair():
    return TensorDataset(*tensors(600, 1)), TensorDataset(*tensors(100, 2))


def item_pair():
    return Items(*tensors(600, 1)), Items(*tensors(100, 2))
