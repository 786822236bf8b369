"""Optional experiment tracking (output.tracking): validation, MLflow and TensorBoard hooks."""

import json
import sys
import types

import pytest

import splitfl
from conftest import tiny_config
from splitfl.config import ConfigError, load_config


def test_tracking_is_off_by_default_and_validated(monkeypatch):
    assert load_config(None).output.tracking == []
    with pytest.raises(ConfigError, match="output.tracking: unknown 'wandb'"):
        load_config(None, ["output.tracking=[wandb]"])
    monkeypatch.setitem(sys.modules, "mlflow", None)  # not importable
    with pytest.raises(
        ConfigError, match=r"needs the mlflow package: pip install -e '\.\[mlflow\]'"
    ):
        load_config(None, ["output.tracking=mlflow"])


def test_mlflow_tracker_logs_every_round_row(tmp_path, monkeypatch):
    calls = []
    fake = types.ModuleType("mlflow")
    fake.start_run = lambda **kw: calls.append(("start", kw))
    fake.log_params = lambda params: calls.append(("params", params))
    fake.set_tag = lambda key, value: calls.append(("tag", key))
    fake.log_metrics = lambda metrics, step: calls.append(("metrics", step, metrics))
    fake.end_run = lambda: calls.append(("end",))
    monkeypatch.setitem(sys.modules, "mlflow", fake)
    cfg = tiny_config(rounds=2, **{"output.tracking": ["mlflow"]})
    result = splitfl.run(cfg, run_dir=tmp_path / "r")
    assert calls[0] == ("start", {"run_name": "r"}) and calls[-1] == ("end",)
    params = dict(calls[1][1])
    assert params["algorithm"] == "s2fl" and params["train.lr"] == "0.05"
    logged = [c for c in calls if c[0] == "metrics"]
    assert [c[1] for c in logged] == [1, 2]
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").open()]
    for (_, _, metrics), row in zip(logged, rows, strict=True):
        assert metrics["test_acc"] == row["test_acc"] and metrics["sim_time"] == row["sim_time"]
        assert "clients" not in metrics  # lists stay in metrics.jsonl only


def test_tensorboard_tracker_writes_event_files(tmp_path):
    pytest.importorskip("tensorboard")
    cfg = tiny_config(rounds=1, **{"output.tracking": "tensorboard"})  # a string means [it]
    result = splitfl.run(cfg, run_dir=tmp_path / "r")
    assert result.config.output.tracking == ["tensorboard"]
    assert list((tmp_path / "r" / "tensorboard").glob("events.out.tfevents.*"))
