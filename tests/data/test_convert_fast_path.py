"""Data given from Python, taken at memory speed (issue 54 item 1): a ``TensorDataset`` is
taken whole (no item read), a map-style dataset read once; both give the tensors the
item-by-item read gives, and a run on either writes the same model bytes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

import splitfl
from fast_path_fixtures import Items, tensors
from splitfl.data import base
from splitfl.data.convert import bundle_from
from splitfl.data.lazy import is_lazy
from splitfl.testing import tiny_config

CASES = {
    "float32": (torch.rand(30, 3, 4), torch.randint(0, 5, (30,))),
    "float64 inputs, int32 labels": (
        torch.rand(30, 6, dtype=torch.float64),
        torch.randint(0, 5, (30,), dtype=torch.int32),
    ),
    "uint8 inputs, whole-number float labels": (
        torch.randint(0, 255, (30, 2, 2), dtype=torch.uint8),
        torch.randint(0, 5, (30,)).float(),
    ),
    "token ids, uint8 labels": (torch.randint(0, 99, (30, 7)), torch.randint(0, 3, (30,)).byte()),
    "bool inputs": (torch.rand(30, 4) > 0.5, torch.randint(0, 2, (30,))),
    "non-contiguous inputs": (torch.rand(4, 30).t(), torch.randint(0, 5, (30,))),
}


def _same_split(a, b) -> None:
    assert a.x.dtype == b.x.dtype and a.y.dtype == b.y.dtype
    torch.testing.assert_close(a.x, b.x, rtol=0, atol=0)
    assert torch.equal(a.y, b.y)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("lazy", [False, True])
def test_a_tensor_dataset_gives_what_reading_its_items_gives(case, lazy):
    x, y = CASES[case]
    fast = bundle_from((TensorDataset(x, y),) * 2, "mine", lazy)
    slow = bundle_from((Items(x, y),) * 2, "mine", lazy)
    assert is_lazy(fast.train.x) == is_lazy(slow.train.x) == lazy
    if lazy:
        fast.train.x, slow.train.x = fast.train.x.materialize(), slow.train.x.materialize()
    _same_split(fast.train, slow.train)
    assert (fast.num_classes, fast.input_shape) == (slow.num_classes, slow.input_shape)


def test_values_targets_of_a_tensor_dataset_match_the_item_read():
    x, y = torch.rand(20, 3), torch.rand(20, 2)
    fast = bundle_from((TensorDataset(x, y),) * 2, "mine", targets="values")
    slow = bundle_from((Items(x, y),) * 2, "mine", targets="values")
    _same_split(fast.train, slow.train)


def test_a_tensor_dataset_is_taken_without_reading_an_item_or_copying(monkeypatch):
    reads = []
    original = TensorDataset.__getitem__
    monkeypatch.setattr(
        TensorDataset, "__getitem__", lambda self, i: reads.append(i) or original(self, i)
    )
    x, y = tensors(500, 0)
    bundle = bundle_from((TensorDataset(x, y), TensorDataset(x[:10], y[:10])), "mine")
    assert reads == []
    assert bundle.train.x.data_ptr() == x.data_ptr()  # float32, contiguous: the same memory
    np.testing.assert_array_equal(bundle.train.y.numpy(), y.numpy())


def test_a_map_style_dataset_is_read_once():
    """Each item once, plus item 0 for the shape (the read before issue 54 was 2n + 1)."""
    train, test = Items(*tensors(50, 0)), Items(*tensors(10, 1))
    bundle_from((train, test), "mine")
    assert (train.reads, test.reads) == (51, 11)


def test_a_subclass_with_its_own_getitem_is_read_item_by_item():
    class Doubled(TensorDataset):
        def __getitem__(self, i):
            x, y = super().__getitem__(i)
            return 2 * x, y

    x, y = tensors(20, 0)
    bundle = bundle_from((Doubled(x, y),) * 2, "mine")
    torch.testing.assert_close(bundle.train.x, 2 * x)


def test_runs_on_a_tensor_dataset_and_on_its_items_write_the_same_model(tmp_path):
    def model_bytes(name: str) -> bytes:
        changes = {
            "algorithm": "splitfed_v1",
            "model": "mlp",
            "rounds": 2,
            "data.dataset": f"fast_path_fixtures:{name}",
            "data.num_clients": 6,
            "data.min_samples": 4,
            "train.clients_per_round": 3,
            "import_dirs": [str(Path(__file__).parents[1])],
        }
        result = splitfl.run(tiny_config(**changes), run_dir=tmp_path / name)
        return (result.run_dir / "model.pt").read_bytes()

    assert model_bytes("tensor_pair") == model_bytes("item_pair")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("row", [0, 1, 4095, 4096, 9999])
def test_all_finite_finds_a_bad_value_in_any_block(monkeypatch, bad, row):
    """Checked a block of rows at a time (here 4,096 rows of 3x4 per block): a bad value in
    the first, a middle or the last block is found; contiguous or not, expanded or not."""
    monkeypatch.setattr(base, "FINITE_CHUNK", 4096 * 12)
    x = torch.rand(10_000, 3, 4)
    assert base.all_finite(x) and base.all_finite(x.transpose(1, 2))
    assert base.all_finite(torch.zeros(1, 3, 4).expand(10_000, 3, 4))
    x[row, 2, 1] = bad
    assert not base.all_finite(x)
    assert not base.all_finite(x.transpose(1, 2))
    assert not base.all_finite(x[:, 2])  # a strided view
