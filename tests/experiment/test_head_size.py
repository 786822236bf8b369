"""Issue 52 item 5: a classifier head with more outputs than the data has classes (a
10-way head on 3 classes) trains silently; ``validate`` and ``run`` say so in one
``warning:`` line."""

from __future__ import annotations

import json
import warnings

import numpy as np

from splitfl.cli.main import main
from splitfl.data.base import DatasetWarning
from splitfl.testing import config_for

MODEL = """
from torch import nn

def head10(input_shape, num_classes):  # ignores num_classes
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))
"""


def test_a_head_wider_than_the_classes_is_one_warning_line(tmp_path, capsys):
    (tmp_path / "heads52.py").write_text(MODEL)
    rng = np.random.default_rng(0)
    for split, n in (("train", 96), ("test", 24)):
        x = rng.random((n, 1, 8, 8)).astype(np.float32)
        np.savez(tmp_path / f"{split}.npz", x=x, y=np.arange(n) % 3)
    config = config_for("fedavg", rounds=1, model="heads52:head10")
    config["data"].update(
        dataset="three", format="npz", root=str(tmp_path), num_clients=4, partition="iid"
    )
    config["train"]["clients_per_round"] = 2
    config["import_dirs"] = [str(tmp_path)]
    (tmp_path / "c.json").write_text(json.dumps(config))
    warnings.simplefilter("always", DatasetWarning)  # validate and run: two processes, else
    said = "warning: model heads52:head10 has 10 outputs but three has 3 classes"
    for args in (["validate"], ["run", "--out", str(tmp_path / "run")]):
        assert main([*args[:1], str(tmp_path / "c.json"), *args[1:]]) == 0
        err = capsys.readouterr().err.strip().splitlines()
        assert [line for line in err if line.startswith("warning:")] == [err[0]], err
        assert err[0].startswith(said), err
    # the right head: no warning
    assert main(["validate", str(tmp_path / "c.json"), "model=mlp"]) == 0
    assert "warning" not in capsys.readouterr().err
