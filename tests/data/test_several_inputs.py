"""Issue 52 item 3: a dataset whose items hold several inputs (``((img, meta), y)``,
``({"img": .., "meta": ..}, y)``) and a model whose forward takes several are refused in one
line with the workaround (one tensor per sample, split again in forward), exit 2, nothing
written; a tuple of numbers stays one input vector."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from splitfl.cli.main import main
from splitfl.data import DatasetError
from splitfl.data.convert import bundle_from
from splitfl.testing import config_for

WORKAROUND = "concatenate them into one tensor in __getitem__"


class Items(torch.utils.data.Dataset):
    """``n`` items whose input is ``make(i)``, label ``i % 2``."""

    def __init__(self, n, make):
        self.n, self.make = n, make

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.make(i), i % 2


def _img(i):
    return torch.full((1, 4, 4), float(i))


CASES = {
    "tuple": (lambda i: (_img(i), torch.ones(3)), "a tuple of 2 inputs ([1, 4, 4], [3])"),
    "list": (lambda i: [_img(i), np.ones(3)], "a list of 2 inputs ([1, 4, 4], [3])"),
    "dict": (
        lambda i: {"img": _img(i), "meta": torch.ones(3)},
        "a mapping of 2 entries (img: [1, 4, 4], meta: [3])",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_items_with_several_inputs_are_one_line_with_the_workaround(case):
    make, said = CASES[case]
    with pytest.raises(DatasetError) as err:
        bundle_from((Items(6, make), Items(4, make)), "pairs")
    line = str(err.value)
    assert "\n" not in line
    assert line.startswith(f"pairs: train item 0's input is {said}; "), line
    assert "several inputs are not supported" in line and WORKAROUND in line


def test_a_tuple_of_numbers_is_still_one_input_vector():
    b = bundle_from((Items(6, lambda i: (float(i), 1.0, 2.0)), Items(4, lambda i: (0.0,) * 3)), "v")
    assert b.input_shape == (3,)
    assert b.train.x[5].tolist() == [5.0, 1.0, 2.0]


MODULE = """
import torch
from torch import nn

class Items(torch.utils.data.Dataset):
    def __init__(self, n, single):
        self.n, self.single = n, single
    def __len__(self):
        return self.n
    def __getitem__(self, i):
        img = torch.full((1, 4, 4), float(i))
        return (img if self.single else (img, torch.ones(3))), i % 2

def pairs():
    return Items(16, False), Items(8, False)

def images():
    return Items(16, True), Items(8, True)

class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.fc = nn.Conv2d(1, 2, 3), nn.Linear(2 * 4 + 3, 2)
    def forward(self, img, meta):
        return self.fc(torch.cat([self.conv(img).flatten(1), meta], 1))

def two_inputs(input_shape, num_classes):
    return TwoInputs()
"""


def test_the_command_refuses_several_inputs_exit_2_nothing_written(tmp_path, capsys):
    (tmp_path / "several52.py").write_text(MODULE)
    config = config_for("splitfed_v1", rounds=1, model="several52:two_inputs")
    config["data"].update(dataset="several52:pairs", num_clients=2, partition="iid")
    config["train"]["clients_per_round"] = 2
    config["import_dirs"] = [str(tmp_path)]
    (tmp_path / "c.json").write_text(json.dumps(config))
    out = tmp_path / "run"
    assert main(["run", str(tmp_path / "c.json"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: several52:pairs: train item 0's input")
    assert WORKAROUND in err[0] and not out.exists()
    # one tensor per sample, a forward of two inputs: the model is refused in one line
    assert main(["validate", str(tmp_path / "c.json"), "data.dataset=several52:images"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "several52:two_inputs's forward takes 2 inputs (img, meta)" in err[0]
    assert "several inputs are not supported" in err[0]


def test_a_bundle_of_torch_datasets_is_read_as_a_pair_is():
    """A ``DatasetBundle`` whose splits are torch ``Dataset`` s (not ``ArrayDataset`` s) was an
    ``AttributeError: ... has no attribute 'y'`` traceback (found rerunning issue 52's
    cases): its splits are read as a ``(train, test)`` pair, the bundle's fields kept, and
    several inputs per item are refused in the same one line."""
    from splitfl.data.base import DatasetBundle

    train, test = Items(6, _img), Items(4, _img)
    bundle = bundle_from(DatasetBundle("mine", train, test, 3, (1, 4, 4)), "mine")
    pair = bundle_from((train, test), "mine")
    assert bundle.num_classes == 3 and bundle.input_shape == (1, 4, 4)
    assert torch.equal(bundle.train.x[:], pair.train.x[:])
    assert torch.equal(bundle.test.y, pair.test.y)
    several = Items(6, CASES["tuple"][0])
    with pytest.raises(DatasetError, match=WORKAROUND):
        bundle_from(DatasetBundle("mine", several, several, 2, (1, 4, 4)), "mine")
