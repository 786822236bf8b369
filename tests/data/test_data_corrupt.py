"""Corrupt, truncated or inconsistent data files: one line naming the file, exit 2 through
``splitfl validate`` and ``splitfl run``, no run directory (checksums: test_data_checksums.py)."""

from __future__ import annotations

import gzip
import json
import pickle
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import tiny_config
from fixtures_data import (
    _idx_bytes,
    write_cifar10,
    write_cifar100,
    write_femnist_leaf,
    write_femnist_npz,
    write_har,
    write_mnist_idx,
    write_qnli,
    write_speech_commands,
)
from splitfl.cli.main import main
from splitfl.config import ConfigError
from splitfl.data import load_dataset
from splitfl.data.base import ArrayDataset, DatasetBundle, DatasetFileError, check_bundle
from splitfl.experiment.context import _check_label_range
from splitfl.experiment.runner import as_config

# ---------------------------------------------------------------- corruptions

QNLI_HEADER = "index\tquestion\tsentence\tlabel\n"


def _mnist_raw(root: Path, folder: str = "MNIST") -> Path:
    return root / folder / "raw"


def _gz_idx(path: Path, arr: np.ndarray) -> None:
    path.write_bytes(gzip.compress(_idx_bytes(arr), mtime=0))


def _truncate(path: Path, keep: float = 0.5) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    return path


def _flip(path: Path, at: int) -> Path:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))
    return path


def _pickle(path: Path, obj: object) -> Path:
    with open(path, "wb") as fh:
        pickle.dump(obj, fh, protocol=2)
    return path


def _cifar_edit(path: Path, protocol: int = 2, **changes: object) -> Path:
    with open(path, "rb") as fh:
        batch = pickle.load(fh, encoding="latin1")
    batch.update(changes)
    for key in [k for k, v in changes.items() if v is None]:
        del batch[key]
    path.write_bytes(pickle.dumps(batch, protocol=protocol))
    return path


class _FromBuffer:
    """Pickles as a call of numpy's protocol-5 array reconstructor with the given dtype."""

    def __init__(self, dtype: np.dtype):
        self.dtype = dtype

    def __reduce__(self):
        return np.zeros(1).__reduce_ex__(5)[0], (bytearray(80), self.dtype, (10,), "C")


def _deep(depth: int) -> list:
    """A label nested ``depth`` lists deep."""
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value  # type: ignore[return-value]


def _npz_edit(path: Path, drop: str | None = None, **changes: np.ndarray) -> Path:
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files if k != drop}
    arrays.update(changes)
    np.savez_compressed(path, **arrays)
    return path


def _leaf_edit(path: Path, edit: Callable[[dict], object]) -> Path:
    blob = json.loads(path.read_text())
    path.write_text(json.dumps(edit(blob)))
    return path


def _first_user(blob: dict) -> dict:
    return blob["user_data"][blob["users"][0]]


def _mnist(root: Path, name: str, corrupt: Callable[[Path], Path]) -> Path:
    write_mnist_idx(root, n_train=60, n_test=20, gz=not name.endswith("plain"))
    return corrupt(_mnist_raw(root))


def _swap_labels(raw: Path) -> Path:
    a, b = raw / "train-labels-idx1-ubyte.gz", raw / "t10k-labels-idx1-ubyte.gz"
    data_a, data_b = a.read_bytes(), b.read_bytes()
    a.write_bytes(data_b)
    b.write_bytes(data_a)
    return a


def _labels(raw: Path, values: list[int], name: str = "train-labels-idx1-ubyte.gz") -> Path:
    arr = (np.arange(60) % 10).astype(np.uint8)
    arr[: len(values)] = values
    _gz_idx(raw / name, arr)
    return raw / name


def _evil(marker: Path) -> object:
    class Evil:
        def __reduce__(self):
            return (marker.touch, ())

    return Evil()


MNIST_CASES: dict[str, Callable[[Path], Path]] = {
    "gz_truncated": lambda r: _truncate(r / "train-images-idx3-ubyte.gz"),
    "gz_bitflip": lambda r: _flip(r / "train-images-idx3-ubyte.gz", 5000),
    "gz_not_gzip_tail": lambda r: _flip(r / "t10k-labels-idx1-ubyte.gz", -3),
    "idx_truncated_plain": lambda r: _truncate(r / "train-images-idx3-ubyte", 0.9),
    "idx_bad_magic_plain": lambda r: _flip(r / "t10k-images-idx3-ubyte", 2),
    "idx_trailing_bytes_plain": lambda r: (
        (r / "t10k-labels-idx1-ubyte").open("ab").write(b"xx") and r / "t10k-labels-idx1-ubyte"
    ),
    "idx_labels_2d": lambda r: (
        _gz_idx(r / "t10k-labels-idx1-ubyte.gz", np.zeros((20, 1), np.uint8)),
        r / "t10k-labels-idx1-ubyte.gz",
    )[1],
    "idx_images_wrong_dims": lambda r: (
        _gz_idx(r / "train-images-idx3-ubyte.gz", np.zeros((60, 28, 27), np.uint8)),
        r / "train-images-idx3-ubyte.gz",
    )[1],
    "labels_fewer_than_images": lambda r: (
        _gz_idx(r / "train-labels-idx1-ubyte.gz", np.zeros(59, np.uint8)),
        r / "train-labels-idx1-ubyte.gz",
    )[1],
    "labels_swapped_train_test": _swap_labels,
    "label_200": lambda r: _labels(r, [200]),
    "label_10": lambda r: _labels(r, [3, 10]),
}


def _cases() -> list[tuple[str, str, Callable[[Path], Path]]]:
    """``(id, dataset, make)``: ``make(root)`` writes a fixture, corrupts one file, returns it."""
    out = [(f"mnist-{k}", "mnist", lambda root, c=c, k=k: _mnist(root, k, c))
           for k, c in MNIST_CASES.items()]  # fmt: skip

    def fashion(root: Path) -> Path:
        write_mnist_idx(root, folder="FashionMNIST")
        return _labels(_mnist_raw(root, "FashionMNIST"), [11], "train-labels-idx1-ubyte.gz")

    def writer_csv(root: Path) -> Path:
        write_mnist_idx(root, writer_ids=True)
        return _truncate(root / "MNIST" / "mnist-writer-ids.csv.gz", 0.6)

    out += [
        ("fashion-label_11", "fashion_mnist", fashion),
        ("mnist-writer_csv", "mnist", writer_csv),
    ]

    def c10(edit: Callable[[Path], Path], name: str = "data_batch_2") -> Callable[[Path], Path]:
        return lambda root: (write_cifar10(root), edit(root / "cifar-10-batches-py" / name))[1]

    out += [
        ("cifar10-fewer_labels", "cifar10", c10(lambda p: _cifar_edit(p, labels=[1] * 9))),
        ("cifar10-label_10", "cifar10", c10(lambda p: _cifar_edit(p, labels=[10] + [1] * 9))),
        ("cifar10-label_-1", "cifar10", c10(lambda p: _cifar_edit(p, labels=[-1] + [1] * 9))),
        ("cifar10-float_labels", "cifar10", c10(lambda p: _cifar_edit(p, labels=[0.5] * 10))),
        ("cifar10-not_a_dict", "cifar10", c10(lambda p: _pickle(p, [1, 2, 3]))),
        ("cifar10-no_labels_key", "cifar10", c10(lambda p: _cifar_edit(p, labels=None))),
        ("cifar10-data_float", "cifar10",
         c10(lambda p: _cifar_edit(p, data=np.zeros((10, 3072))))),
        ("cifar10-data_shape", "cifar10",
         c10(lambda p: _cifar_edit(p, data=np.zeros((10, 3000), np.uint8)))),
        ("cifar10-truncated", "cifar10", c10(lambda p: _truncate(p), "test_batch")),
        ("cifar10-bad_opcode", "cifar10", c10(lambda p: _flip(p, 0))),
        ("cifar10-empty", "cifar10", c10(lambda p: _truncate(p, 0.0), "data_batch_5")),
        ("cifar10-ragged_labels", "cifar10",
         c10(lambda p: _cifar_edit(p, labels=[[1, 2], [3]] + [1] * 8))),
        ("cifar10-deep_labels", "cifar10", c10(lambda p: _cifar_edit(p, labels=[_deep(100)] * 10))),
        ("cifar10-frombuffer_object_dtype", "cifar10",
         c10(lambda p: _cifar_edit(p, protocol=5, labels=_FromBuffer(np.dtype(object))))),
        ("cifar10-foreign_global", "cifar10",
         c10(lambda p: _pickle(p, {"data": _evil(p.with_name("PWNED")), "labels": []}))),
    ]  # fmt: skip

    def c100(edit: Callable[[Path], Path]) -> Callable[[Path], Path]:
        return lambda root: (write_cifar100(root), edit(root / "cifar-100-python" / "train"))[1]

    out += [
        ("cifar100-label_100", "cifar100",
         c100(lambda p: _cifar_edit(p, fine_labels=[100] + [0] * 29))),
        ("cifar100-truncated", "cifar100", c100(lambda p: _truncate(p, 0.3))),
    ]  # fmt: skip

    def npz(edit: Callable[[Path], Path]) -> Callable[[Path], Path]:
        return lambda root: (
            write_femnist_npz(root),
            edit(root / "FEMNIST" / "femnist-fixture.npz"),
        )[1]

    out += [
        ("femnist_npz-truncated", "femnist", npz(lambda p: _truncate(p, 0.7))),
        ("femnist_npz-garbage", "femnist", npz(lambda p: (p.write_bytes(b"not a zip" * 9), p)[1])),
        ("femnist_npz-no_writer", "femnist", npz(lambda p: _npz_edit(p, drop="writer"))),
        ("femnist_npz-label_99", "femnist",
         npz(lambda p: _npz_edit(p, y=np.full(48, 99, np.uint8)))),
        ("femnist_npz-x_shape", "femnist",
         npz(lambda p: _npz_edit(p, x=np.zeros((48, 27, 28), np.uint8)))),
        ("femnist_npz-short_split", "femnist",
         npz(lambda p: _npz_edit(p, split=np.zeros(47, np.uint8)))),
    ]  # fmt: skip

    def leaf(edit: Callable[[dict], object], split: str = "train") -> Callable[[Path], Path]:
        def make(root: Path) -> Path:
            write_femnist_leaf(root)
            path = root / "FEMNIST" / split / f"all_data_0_niid_05_keep_0_{split}_9.json"
            return _leaf_edit(path, edit)

        return make

    def truncated_json(root: Path) -> Path:
        write_femnist_leaf(root)
        return _truncate(root / "FEMNIST" / "test" / "all_data_1_niid_05_keep_0_test_9.json")

    def label_99(blob: dict) -> dict:
        _first_user(blob)["y"][0] = 99
        return blob

    def fewer_y(blob: dict) -> dict:
        _first_user(blob)["y"].pop()
        return blob

    def short_row(blob: dict) -> dict:
        _first_user(blob)["x"][0] = _first_user(blob)["x"][0][:700]
        return blob

    out += [
        ("femnist_json-truncated", "femnist", truncated_json),
        ("femnist_json-list", "femnist", leaf(lambda b: [b])),
        ("femnist_json-no_user_data", "femnist", leaf(lambda b: {"users": b["users"]})),
        ("femnist_json-label_99", "femnist", leaf(label_99, "test")),
        ("femnist_json-fewer_labels", "femnist", leaf(fewer_y)),
        ("femnist_json-short_row", "femnist", leaf(short_row)),
    ]

    def har(rel: str, edit: Callable[[Path], Path]) -> Callable[[Path], Path]:
        return lambda root: (write_har(root), edit(root / "UCI HAR Dataset" / rel))[1]

    def replace_line(path: Path, i: int, text: str) -> Path:
        lines = path.read_text().splitlines()
        lines[i] = text
        path.write_text("\n".join(lines) + "\n")
        return path

    sig = "train/Inertial Signals/body_gyro_y_train.txt"
    out += [
        ("har-label_7", "har", har("train/y_train.txt", lambda p: replace_line(p, 3, "7"))),
        ("har-label_0", "har", har("test/y_test.txt", lambda p: replace_line(p, 0, "0"))),
        ("har-text_in_signal", "har", har(sig, lambda p: replace_line(p, 2, "  abc  1.0"))),
        ("har-nan_in_signal", "har",
         har(sig, lambda p: replace_line(p, 2, "  ".join(["nan"] * 128)))),
        ("har-fewer_rows", "har", har(sig, lambda p: _truncate(p, 0.5))),
        ("har-subjects_short", "har",
         har("test/subject_test.txt", lambda p: (p.write_text("2\n4\n"), p)[1])),
    ]  # fmt: skip

    def speech(edit: Callable[[Path], Path], rel: str) -> Callable[[Path], Path]:
        return lambda root: (write_speech_commands(root), edit(
            root / "SpeechCommands" / "speech_commands_v0.02" / rel))[1]  # fmt: skip

    out += [
        ("speech-wav_truncated", "speech_commands",
         speech(lambda p: _truncate(p, 0.001), "yes/0a7c2a8d_nohash_0.wav")),
        ("speech-wav_not_riff", "speech_commands",
         speech(lambda p: _flip(p, 0), "no/c1d39ce8_nohash_0.wav")),
        ("speech-list_not_utf8", "speech_commands",
         speech(lambda p: (p.write_bytes(b"\xff\xfe\xfa" * 5), p)[1], "testing_list.txt")),
        ("speech-list_emptied", "speech_commands",  # found by benchmarks/fuzz_data.py
         speech(lambda p: (p.write_bytes(b""), p)[1], "testing_list.txt")),
    ]  # fmt: skip

    def qnli(edit: Callable[[Path], Path], name: str = "train.tsv") -> Callable[[Path], Path]:
        return lambda root: (write_qnli(root), edit(root / "QNLI" / name))[1]

    out += [
        ("qnli-not_utf8", "qnli", qnli(lambda p: (p.write_bytes(b"\xff\xfe\x00\x81" * 50), p)[1])),
        ("qnli-bad_header", "qnli",
         qnli(lambda p: (p.write_text("a\tb\nc\td\n"), p)[1], "dev.tsv")),
        ("qnli-no_good_rows", "qnli",
         qnli(lambda p: (p.write_text(f"{QNLI_HEADER}0\tq\ts\tmaybe\n"), p)[1])),
        ("qnli-empty", "qnli", qnli(lambda p: _truncate(p, 0.0))),
    ]  # fmt: skip
    return out


CASES = _cases()


def _config(tmp_path: Path, dataset: str, root: Path, **changes: object) -> Path:
    cfg = tiny_config(
        **{
            "model": "mlp",
            "data.dataset": dataset,
            "data.root": str(root),
            "data.num_clients": 2,
            "data.min_samples": 1,
            "train.clients_per_round": 1,
            "rounds": 1,
            "output.out_dir": str(tmp_path / "runs"),
            **changes,
        }
    )
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


# ---------------------------------------------------------------- every loader, every case


@pytest.mark.parametrize("case,dataset,make", CASES, ids=[c[0] for c in CASES])
def test_corrupt_file_is_one_line_exit_2_naming_it_and_writes_nothing(
    case, dataset, make, tmp_path, capsys
):
    # Prepare
    root = tmp_path / "data"
    bad = make(root)
    cfg = _config(tmp_path, dataset, root)
    for command in (["validate", str(cfg)], ["run", str(cfg), "--no-progress"]):
        # Execute
        code = main(command)
        err = capsys.readouterr().err
        # Assert
        assert code == 2, (command[0], err)
        assert err.startswith("error: ") and err.count("\n") == 1, err
        assert str(bad) in err, err
    assert not (tmp_path / "runs").exists()
    assert not (root / "cifar-10-batches-py" / "PWNED").exists()  # no foreign code ran


# ---------------------------------------------------------------- invariants and model fit


def test_check_bundle_rejects_labels_inputs_and_empty_splits():
    # Prepare
    import torch

    def bundle(y_train, x_test=None) -> DatasetBundle:
        train = ArrayDataset(torch.zeros(len(y_train), 1, 2, 2), torch.tensor(y_train))
        test = ArrayDataset(
            torch.zeros(1, 1, 2, 2) if x_test is None else x_test,
            torch.tensor([0] * (1 if x_test is None else len(x_test))),
        )
        return DatasetBundle("t", train, test, 3, (1, 2, 2))  # fmt: skip

    # Execute / Assert
    check_bundle(bundle([0, 1, 2]), "t")
    with pytest.raises(DatasetFileError, match=r"^t: train split labels span 0..3, outside 0..2$"):
        check_bundle(bundle([0, 3]), "t")
    with pytest.raises(DatasetFileError, match="train split labels span -1..1"):
        check_bundle(bundle([-1, 1]), "t")
    with pytest.raises(DatasetFileError, match="test split holds no samples"):
        check_bundle(bundle([0], torch.zeros(0, 1, 2, 2)), "t")
    with pytest.raises(DatasetFileError, match="test split holds NaN"):
        check_bundle(bundle([0], torch.full((1, 1, 2, 2), float("nan"))), "t")
    with pytest.raises(DatasetFileError, match=r"inputs have shape \[1, 2, 3\]"):
        check_bundle(bundle([0], torch.zeros(1, 1, 2, 3)), "t")


def test_labels_beyond_the_models_outputs_are_a_config_error():
    # Prepare

    cfg = as_config(tiny_config())
    bundle = load_dataset("digits")
    # Execute / Assert
    _check_label_range(cfg, bundle, 10)
    with pytest.raises(ConfigError, match="^model: cnn_digits has 9 outputs but digits labels"):
        _check_label_range(cfg, bundle, 9)


def test_bad_verify_value_is_a_config_error(tmp_path, capsys):
    # Execute
    code = main(["validate", str(_config(tmp_path, "digits", tmp_path, **{"data.verify": "x"}))])
    # Assert
    assert code == 2
    assert (
        capsys.readouterr().err == "error: data.verify: unknown 'x'; allowed: warn, strict, off\n"
    )


@pytest.mark.parametrize(
    ("dataset", "write", "shape"),
    [("speech_commands", write_speech_commands, "[1, 16000]"), ("qnli", write_qnli, "[64]")],
)
def test_image_model_on_non_image_inputs_is_a_config_error(dataset, write, shape, tmp_path, capsys):
    # Prepare: cnn_digits (a 2-D CNN) on 1-D audio or token ids
    write(tmp_path / "data")
    cfg = _config(tmp_path, dataset, tmp_path / "data", model="cnn_digits")
    # Execute
    code = main(["validate", str(cfg)])
    # Assert
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"error: model: cnn_digits does not fit {dataset} inputs")
    assert f"needs image inputs [C, H, W], got {shape}" in err
