"""Issue 52 item 1: BatchNorm's batch of one, and the user's model failing inside a round.

``train.drop_last`` (default ``auto``: ``single`` for a BatchNorm model) keeps a one-sample
last batch away from BatchNorm; with ``false`` the crash is one line naming the round, the
client and the module, exit 2, and no run directory. A model that raises in a later round
keeps the rounds before it as a stopped run; a LoRA target typo lists the module names.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import yaml

import splitfl
from hf_fixtures import save_tiny
from splitfl.cli.main import main
from splitfl.data.partition import batch_sizes, epoch_batch_sizes
from splitfl.experiment.runner import as_config, prepare
from splitfl.roles.common import client_batches
from splitfl.testing import config_for

MODELS = textwrap.dedent(
    """
    import torch
    from torch import nn

    def bn_mlp(input_shape, num_classes):
        return nn.Sequential(
            nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 16),
            nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, num_classes),
        )

    class Late(nn.Module):
        calls, limit = 0, None  # training forwards so far; raise past ``limit``

        def forward(self, x):
            if self.training and torch.is_grad_enabled():
                Late.calls += 1
                if Late.limit is not None and Late.calls > Late.limit:
                    raise KeyError("late")
            return x

    def late_mlp(input_shape, num_classes):
        return nn.Sequential(
            nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), Late(), nn.Linear(16, num_classes)
        )
    """
)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A module of models and a config: 4 IID clients of 360, 360, 359, 359 digits at
    batch 179, so clients 2 and 3 end every epoch with a batch of one; cut after the
    first Linear (BatchNorm on the server)."""
    (tmp_path / "bnmodels52.py").write_text(MODELS)
    config = config_for("splitfed_v1", rounds=1, model="bnmodels52:bn_mlp")
    config["data"].update(partition="iid", num_clients=4)
    config["train"].update(clients_per_round=4, batch_size=179)
    config["options"] = {"splitfed_v1": {"cut": 2}}
    config["import_dirs"] = [str(tmp_path)]
    config["output"]["out_dir"] = str(tmp_path / "runs")
    (tmp_path / "bn.yaml").write_text(yaml.safe_dump(config))
    return tmp_path


def test_auto_drops_the_batch_of_one_of_a_batchnorm_model(project, capsys):
    assert main(["run", str(project / "bn.yaml"), "--out", str(project / "run")]) == 0
    written = yaml.safe_load((project / "run" / "config.yaml").read_text())
    assert written["train"]["drop_last"] == "single"  # auto, resolved for BatchNorm
    # no BatchNorm, nothing dropped: auto resolves to false
    cfg = splitfl.validate(config_for("fedavg", model="mlp"))
    assert "ok:" in cfg
    prepared = prepare(as_config(config_for("fedavg", model="mlp")))
    assert prepared.config.train.drop_last is False


def test_a_batch_of_one_through_batchnorm_is_one_line_and_writes_nothing(project, capsys):
    runs = project / "runs"
    code = main(["run", str(project / "bn.yaml"), "train.drop_last=false", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("error: model: round 1, client 2: module 4 (BatchNorm1d) raised "), err
    assert "Expected more than 1 value per channel" in err[0] and "train.drop_last" in err[0]
    assert not runs.exists() or not any(runs.iterdir())  # no half-made run directory
    code = main(["run", str(project / "bn.yaml"), "train.drop_last=false", "executor=vectorized"])
    assert code == 2 and "round 1, client 2: module 4 (BatchNorm1d)" in capsys.readouterr().err


def test_a_model_failing_in_a_later_round_keeps_the_rounds_before(project, capsys):
    """The model raises on its first training forward after round 1 (counted on a 1-round
    run): exit 2, one line naming round 2; round 1 stays, checkpointed, as a stopped run."""
    args = ["model=bnmodels52:late_mlp", "train.batch_size=128", "--no-progress"]
    loaded = sys.modules.get("bnmodels52")  # imported by an earlier test of this process
    if loaded is not None:
        loaded.Late.calls = 0
    assert main(["run", str(project / "bn.yaml"), *args, "--out", str(project / "one")]) == 0
    late = sys.modules["bnmodels52"].Late
    late.limit, late.calls = late.calls, 0
    run_dir = project / "late"
    code = main(["run", str(project / "bn.yaml"), *args, "rounds=3", "--out", str(run_dir)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    said = "round 2, client 0: module 3 (Late) raised KeyError: 'late' (bnmodels52.py line"
    assert said in err[0], err
    assert "checkpoint at round 1 kept" in err[0] and "splitfl run --resume" in err[0]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"].startswith("stopped at round 2: model: round 2, client 0")


def test_drop_last_is_a_checked_config_value(project):
    with pytest.raises(splitfl.ConfigError, match=r"^train.drop_last: one of false, true, single"):
        splitfl.validate(config_for("fedavg", **{"train.drop_last": "sometimes"}))
    with pytest.raises(splitfl.ConfigError, match=r"^train.drop_last: expected bool or str"):
        splitfl.validate(config_for("fedavg", **{"train.drop_last": 3}))


@pytest.mark.parametrize("drop", [False, True, "single"])
def test_the_batches_drawn_are_the_batches_priced(drop):
    """``client_batches`` (what trains) and ``batch_sizes`` (what the clock prices) agree for
    every setting; ``single`` drops exactly the one-sample last batch, ``true`` every
    incomplete one, and a client with less than a batch keeps it."""
    for n in (1, 5, 16, 17, 33, 40):
        for steps in (1, 3, 7):
            drawn = client_batches(np.arange(n), 16, steps, seed=1, drop_last=drop)
            assert [len(b) for b in drawn] == batch_sizes(n, 16, steps, drop), (n, steps)
    assert epoch_batch_sizes(33, 16, "single") == [16, 16]
    assert epoch_batch_sizes(34, 16, "single") == [16, 16, 2]
    assert epoch_batch_sizes(34, 16, True) == [16, 16]
    assert epoch_batch_sizes(34, 16, False) == [16, 16, 2]
    assert epoch_batch_sizes(1, 16, "single") == [1]
    # nothing dropped: the very batches of before (the same permutations, the same order)
    kept = client_batches(np.arange(34), 16, 6, seed=2, drop_last="single")
    assert [b.tolist() for b in kept] == [
        b.tolist() for b in client_batches(np.arange(34), 16, 6, seed=2)
    ]


def test_a_lora_target_typo_is_one_line_listing_the_module_names(tmp_path, capsys):
    """peft's NoMatchingPeftModuleError (a 47-line traceback before) is one line on
    ``train.lora.target_modules`` naming the model's modules; nothing is written."""
    folder = save_tiny(tmp_path / "roberta", "roberta")
    config = {
        "model": f"hf-config:{folder}",
        "algorithm": "splitfed_v1",
        "data": {"dataset": "hf_fixtures:token_classification_data", "num_clients": 4},
        "train": {"clients_per_round": 2, "lora": {"r": 2, "target_modules": ["qurey"]}},
        "import_dirs": [str(Path(__file__).parents[1])],
        "output": {"out_dir": str(tmp_path / "runs")},
    }
    (tmp_path / "lora.yaml").write_text(yaml.safe_dump(config))
    capsys.readouterr()  # saving the model shows transformers' progress
    for command in ("validate", "run"):
        assert main([command, str(tmp_path / "lora.yaml")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err
        assert err[0].startswith("error: train.lora.target_modules: ['qurey'] match no module")
        assert "key, " in err[0] and "query, " in err[0] and "value" in err[0]
    assert not (tmp_path / "runs").exists()
