"""What ``splitfl validate`` and a run tell a user before the first round (issue 34, item 9):
the class count, test labels no training sample has, S²FL's warm-up share of the run."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import yaml

import splitfl
from conftest import tiny_config
from splitfl.cli.main import main
from splitfl.data.base import DatasetWarning


def _npz_data(root, test_labels) -> None:
    root.mkdir()
    gen = np.random.default_rng(0)
    train_y = np.arange(40) % 3  # classes 0, 1, 2
    np.savez(root / "train.npz", x=gen.random((40, 4), dtype=np.float32), y=train_y)
    test_y = np.asarray(test_labels)
    np.savez(root / "test.npz", x=gen.random((len(test_y), 4), dtype=np.float32), y=test_y)


def _config(root, tmp_path) -> dict:
    cfg = tiny_config(algorithm="fedavg", model="mlp", rounds=1)
    cfg["data"].update(dataset="mine", format="npz", root=str(root), partition="iid", num_clients=4)
    cfg["train"]["clients_per_round"] = 2
    cfg["output"] = {"out_dir": str(tmp_path / "runs"), "progress": False}
    return cfg


def test_a_test_label_unseen_in_training_is_one_warning_line(tmp_path, capsys):
    _npz_data(tmp_path / "d", [0, 1, 2, 4, 4])
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(_config(tmp_path / "d", tmp_path)))
    assert main(["validate", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "(40 train samples, 5 classes, " in out.splitlines()[0]
    assert err.splitlines() == [
        "warning: mine: test labels [4] never occur in the training split; the model has 5 classes"
    ]


def test_no_warning_when_training_covers_every_test_label(tmp_path):
    _npz_data(tmp_path / "d", [0, 1, 2, 2])
    with warnings.catch_warnings():
        warnings.simplefilter("error", DatasetWarning)
        text = splitfl.validate(_config(tmp_path / "d", tmp_path))
    assert "3 classes" in text.splitlines()[0]


@pytest.mark.parametrize(
    ("rounds", "tail"),
    [
        (3, "every one of the 3 rounds is warm-up (none adaptive: use rounds > 3)"),
        (5, "rounds 4-5 choose cut points adaptively"),
    ],
)
def test_validate_says_how_much_of_an_s2fl_run_is_warm_up(rounds, tail):
    text = splitfl.validate(tiny_config(algorithm="s2fl", rounds=rounds))
    (note,) = [line for line in text.splitlines() if line.startswith("note: ")]
    assert note == (
        f"note: s2fl: rounds 1-{min(3, rounds)} are the warm-up (§3.1: one round per cut point; "
        f"3 cut points [1, 2, 3]); {tail}"
    )
    off = splitfl.validate(tiny_config(algorithm="s2fl+R", rounds=rounds))
    assert "note: " not in off
