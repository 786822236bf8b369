"""Issue 52 item 10 (smaller): ``train.server_optimizer=fedadam`` as shorthand, a lone
string of overrides refused in one line, ``data.root`` found beside the config as
``imports:`` are, and ``validate`` naming cut points by the user's module paths."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

import splitfl
from splitfl.config import ConfigError
from splitfl.experiment.runner import as_config
from splitfl.experiment.validation import load_config
from splitfl.testing import config_for, tiny_config

QUICKSTART = Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml"


def test_server_optimizer_takes_its_name_alone():
    cfg = as_config(tiny_config(), ["train.server_optimizer=fedadam"])
    assert cfg.train.server_optimizer.name == "fedadam" and cfg.train.server_optimizer.tau == 1e-3
    with pytest.raises(ConfigError, match=r"^train.server_optimizer.name: "):
        splitfl.validate(tiny_config(), ["train.server_optimizer=fedadamm"])


@pytest.mark.parametrize("call", ["run", "validate", "compare"])
def test_a_lone_override_string_is_one_line_not_letters(call, tmp_path):
    args = (["fedavg"],) if call == "compare" else ()
    with pytest.raises(ConfigError, match=r"^overrides: expected a list of key=value strings"):
        getattr(splitfl, call)(str(QUICKSTART), *args, "rounds=3")


def test_a_relative_data_root_is_found_beside_the_config(tmp_path, monkeypatch):
    folder = tmp_path / "project"
    (folder / "data").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for split, n in (("train", 64), ("test", 16)):
        x = rng.random((n, 1, 8, 8)).astype(np.float32)
        np.savez(folder / "data" / f"{split}.npz", x=x, y=np.arange(n) % 4)
    config = config_for("fedavg", model="mlp")
    config["data"].update(dataset="mine", format="npz", root="data", num_clients=4)
    config["train"]["clients_per_round"] = 2
    (folder / "c.yaml").write_text(yaml.safe_dump(config))
    monkeypatch.chdir(tmp_path)  # not the config's folder
    cfg = load_config(folder / "c.yaml")
    assert cfg.data.root == str(folder / "data")
    assert "64 train samples" in splitfl.validate(str(folder / "c.yaml"))
    shutil.copytree(folder / "data", tmp_path / "data")  # the current directory comes first
    assert load_config(folder / "c.yaml").data.root == "data"


MODULE = """
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU())
        self.body = nn.Sequential(nn.Linear(16, 16), nn.ReLU())
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        return self.head(self.body(self.stem(x)))

def net(input_shape, num_classes):
    return Net()
"""


def test_validate_names_cut_points_by_the_users_module_paths(tmp_path):
    (tmp_path / "cutnames52.py").write_text(MODULE)
    config = config_for("splitfed_v1", model="cutnames52:net")
    config["import_dirs"] = [str(tmp_path)]
    config["split"] = {"cut_points": ["stem", "body"]}
    said = splitfl.validate(config)
    assert "cut points [1 (stem), 2 (body)], default 2 (body)" in said, said
    assert "cut points [1, 2, 3], default 3)" in splitfl.validate(tiny_config())
