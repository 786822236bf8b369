"""Regression data without code (issue 34, item 1): float targets from CSV, npz, npy and a
``(train, test)`` pair of torch ``Dataset`` s (``data.targets``, resolved from
``train.loss``), and the printed table of a run without accuracy."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

import splitfl
from conftest import tiny_config
from splitfl.cli.main import main
from splitfl.config import ConfigError, DataConfig
from splitfl.data.base import DatasetFileError
from splitfl.data.convert import bundle_from
from splitfl.data.formats import ContainerOptions
from splitfl.data.local import load_local
from splitfl.data.source import from_object, read_dataset
from splitfl.experiment.runner import as_config
from splitfl.experiment.validation import check_config, resolve_config
from splitfl.metrics.summary import comparison_table

WEIGHTS = np.array([1.5, -2.0, 0.5, 0.25], dtype=np.float32)


def _table(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Inputs ``[n, 4]`` and targets ``x·w`` with negative and fractional values."""
    x = np.random.default_rng(seed).normal(size=(n, 4)).astype(np.float32)
    return x, (x @ WEIGHTS).astype(np.float32)


def _write_csv(path, x: np.ndarray, y) -> None:
    with open(path, "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["a", "b", "c", "d", "target"])
        out.writerows([[*map(float, row), t] for row, t in zip(x, y, strict=True)])


@pytest.fixture
def regression_files(tmp_path):
    """The same data as CSV, npz and npy; the targets as written (float32)."""
    (train_x, train_y), (test_x, test_y) = _table(48, 0), _table(16, 1)
    for fmt in ("csv", "npz", "npy"):
        (tmp_path / fmt).mkdir()
    for split, x, y in (("train", train_x, train_y), ("test", test_x, test_y)):
        _write_csv(tmp_path / "csv" / f"{split}.csv", x, [repr(float(v)) for v in y])
        np.savez(tmp_path / "npz" / f"{split}.npz", x=x, y=y)
        np.save(tmp_path / "npy" / f"x_{split}.npy", x)
        np.save(tmp_path / "npy" / f"y_{split}.npy", y)
    return tmp_path, (train_y, test_y)


def _data(root, fmt: str, targets: str | None = "values") -> DataConfig:
    return DataConfig(
        dataset="mytab", format=fmt, root=str(root / fmt), label_column="target", targets=targets
    )


@pytest.mark.parametrize("fmt", ["csv", "npz", "npy"])
def test_float_targets_are_read_as_written(regression_files, fmt):
    root, (train_y, test_y) = regression_files
    bundle = read_dataset(_data(root, fmt))
    assert bundle.train.y.dtype == torch.float32
    assert bundle.num_classes == 1  # one value per sample: the model's outputs
    np.testing.assert_array_equal(bundle.train.y.numpy(), train_y)
    np.testing.assert_array_equal(bundle.test.y.numpy(), test_y)
    assert (bundle.train.y < 0).any() and (bundle.train.y != bundle.train.y.round()).any()


def test_a_torch_dataset_pair_keeps_float_targets():
    (x, y), (tx, ty) = _table(20, 0), _table(8, 1)
    pair = tuple(
        TensorDataset(torch.from_numpy(a), torch.from_numpy(b)) for a, b in ((x, y), (tx, ty))
    )
    bundle = from_object(pair, DataConfig(dataset="mine", targets="values"))
    assert bundle.train.y.dtype == torch.float32 and bundle.num_classes == 1
    np.testing.assert_array_equal(bundle.train.y.numpy(), y)
    # as classes, fractional labels are refused (they used to be truncated to integers)
    with pytest.raises(DatasetFileError, match=r"train labels must be 20 integers.*mse"):
        bundle_from(pair, "mine")


def test_whole_number_float_labels_stay_classes_and_integer_targets_become_values(tmp_path):
    x = torch.randn(6, 4)
    pair = (TensorDataset(x, torch.tensor([0.0, 1.0, 2.0] * 2)),) * 2
    assert bundle_from(pair, "mine").train.y.tolist() == [0, 1, 2, 0, 1, 2]
    (tmp_path / "csv").mkdir()
    for split in ("train", "test"):  # integer-valued regression targets, some negative
        _write_csv(tmp_path / "csv" / f"{split}.csv", x.numpy(), [-3, 5, 0, 7, -1, 2])
    bundle = read_dataset(_data(tmp_path, "csv"))
    assert bundle.train.y.tolist() == [-3.0, 5.0, 0.0, 7.0, -1.0, 2.0]
    with pytest.raises(DatasetFileError, match="label -3 is negative"):
        read_dataset(_data(tmp_path, "csv", targets="classes"))


def test_targets_resolve_from_the_loss_and_bad_values_are_one_line():
    def config(**changes):
        return as_config(
            tiny_config(algorithm="fedavg", model="mlp", **{"data.partition": "iid", **changes})
        )

    mse = {"train.loss": "mse", "eval.metrics": ["mse"]}
    assert resolve_config(config(**mse)).data.targets == "values"
    assert resolve_config(config()).data.targets == "classes"
    kept = config(**mse, **{"data.targets": "classes"})
    assert resolve_config(kept).data.targets == "classes"
    with pytest.raises(ConfigError, match=r"^data\.targets: allowed: classes, values"):
        check_config(config(**{"data.targets": "floats"}))
    devices = {"data.source": "devices", "executor": "networked"}
    with pytest.raises(ConfigError, match=r"^data\.targets: values .* not supported"):
        check_config(config(**mse, **devices))


def test_float_labels_under_cross_entropy_say_how_to_read_them(regression_files):
    root, _ = regression_files
    with pytest.raises(DatasetFileError, match=r"train\.npz: labels must be integers.*mse"):
        read_dataset(_data(root, "npz", targets="classes"))
    with pytest.raises(DatasetFileError, match=r"train\.csv: label .* is not a whole number.*mse"):
        read_dataset(_data(root, "csv", targets="classes"))


def test_a_device_reads_float_targets_of_its_own_files(regression_files):
    root, (train_y, _) = regression_files
    data = load_local(root / "npz", "npz", ContainerOptions(targets="values"))
    np.testing.assert_array_equal(data[None][1].numpy(), train_y)


REGRESSION_RUN = {
    "model": "mlp",
    "data.dataset": "mytab",
    "data.format": "csv",
    "data.label_column": "target",
    "data.partition": "iid",
    "data.num_clients": 4,
    "train.clients_per_round": 2,
    "train.loss": "mse",
    "eval.metrics": ["mse"],
}


def test_a_csv_regression_trains_and_the_table_shows_its_loss(regression_files, tmp_path, capsys):
    root, _ = regression_files
    cfg = tiny_config(algorithm="splitfed_v1", rounds=2, **REGRESSION_RUN)
    cfg["data"]["root"] = str(root / "csv")
    result = splitfl.run(cfg, run_dir=tmp_path / "run")
    loss, mse = result.summary["final_loss"], result.summary["final_mse"]
    assert math.isfinite(loss) and math.isfinite(mse) and result.summary["final_acc"] is None
    table = comparison_table({"splitfed_v1": result.summary}).splitlines()
    assert table[0].startswith("| algorithm | final loss | final mse | total sim time |")
    assert table[2].startswith(f"| splitfed_v1 | {loss:.4g} | {mse:.4g} |")
    assert "targets: values" in (result.run_dir / "config.yaml").read_text()


def test_a_classification_table_keeps_the_accuracy_columns():
    row = {
        "final_acc": 0.5,
        "best_acc": 0.6,
        "final_loss": 1.0,
        "to_target": {"sim_time": None, "traffic_bytes": None},
        "target_accuracy": 0.4,
        "sim_time": 1.0,
        "avg_waiting": 0.0,
        "status": "ok",
    }
    table = comparison_table({"fedavg": row}).splitlines()
    assert table[0].startswith("| algorithm | final acc % | best acc % | time to 40% |")
    assert table[2].startswith("| fedavg | 50.00 | 60.00 | - |")


def test_the_cli_runs_a_csv_regression(regression_files, tmp_path, capsys):
    root, _ = regression_files
    cfg = tmp_path / "reg.yaml"
    cfg.write_text(
        "algorithm: splitfed_v1\nmodel: mlp\nrounds: 1\n"
        f"data: {{dataset: mytab, format: csv, root: {root / 'csv'}, label_column: target,"
        " partition: iid, num_clients: 4}\n"
        "train: {clients_per_round: 2, batch_size: 8, loss: mse}\neval: {metrics: [mse]}\n"
        f"output: {{out_dir: {tmp_path / 'runs'}, progress: false}}\n"
    )
    assert main(["run", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "| final loss | final mse |" in out and "| - | - |" not in out
