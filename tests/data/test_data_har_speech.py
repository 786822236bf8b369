"""UCI HAR and Speech Commands loaders, on generated fixtures in the real on-disk formats."""

from __future__ import annotations

import shutil
import wave

import numpy as np
import pytest
import torch

from fixtures_data import write_har, write_speech_commands
from splitfl.data import DatasetNotFoundError, dataset_names, load_dataset
from splitfl.data.loaders.har import SIGNALS
from splitfl.data.loaders.speech import read_wav
from splitfl.data.partition import partition_indices


def _expected_wave(samples: np.ndarray) -> np.ndarray:
    out = np.zeros(16000, dtype=np.float32)
    kept = samples[:16000].astype(np.float32) / 32768.0
    out[: len(kept)] = kept
    return out


def test_registry_lists_har_and_speech():
    assert {"har", "speech_commands"} <= set(dataset_names())


# ---------------------------------------------------------------- UCI HAR


def test_har_shapes_values_labels_and_writers(tmp_path):
    # Prepare
    raw = write_har(tmp_path, n_train=14, n_test=7)
    # Execute
    b = load_dataset("har", tmp_path)
    # Assert
    assert b.name == "har" and b.num_classes == 6 and b.input_shape == (1, 128, 9)
    assert b.train.x.shape == (14, 1, 128, 9) and b.test.x.shape == (7, 1, 128, 9)
    assert b.train.x.dtype == torch.float32 and b.train.y.dtype == torch.int64
    for split, ds in (("train", b.train), ("test", b.test)):
        assert torch.equal(ds.x[:, 0], torch.from_numpy(raw[f"{split}_x"].astype(np.float32)))
        assert torch.equal(ds.y, torch.from_numpy(raw[f"{split}_y"] - 1))
        np.testing.assert_array_equal(ds.writers, raw[f"{split}_subject"])
    assert set(b.train.y.tolist()) == set(range(6))


def test_har_signal_order(tmp_path):
    # Prepare: signal k of window 0 overwritten with the constant k
    write_har(tmp_path, n_train=2, n_test=1)
    folder = tmp_path / "UCI HAR Dataset" / "train" / "Inertial Signals"
    for k, name in enumerate(SIGNALS):
        (folder / f"{name}_train.txt").write_text(f"{' '.join([str(k)] * 128)}\n" * 2)
    # Execute
    b = load_dataset("har", tmp_path)
    # Assert
    assert SIGNALS[0] == "body_acc_x" and SIGNALS[-1] == "total_acc_z"
    assert torch.equal(b.train.x[0, 0, 5], torch.arange(9, dtype=torch.float32))


@pytest.mark.parametrize("where", ["inside", "HAR"])
def test_har_other_roots(tmp_path, where):
    # Prepare
    if where == "HAR":
        write_har(tmp_path / "HAR", n_train=3, n_test=2)
        root = tmp_path
    else:
        write_har(tmp_path, n_train=3, n_test=2)
        root = tmp_path / "UCI HAR Dataset"
    # Execute
    b = load_dataset("har", root)
    # Assert
    assert len(b.train) == 3 and len(b.test) == 2


def test_har_by_subject_partition(tmp_path):
    # Prepare
    write_har(tmp_path, n_train=12, n_test=4)
    b = load_dataset("har", tmp_path)
    # Execute
    parts = partition_indices(
        "natural", b.train.y.numpy(), 3, np.random.default_rng(0), writers=b.train.writers
    )
    # Assert: one subject per client
    assert sorted(len(set(b.train.writers[p])) for p in parts) == [1, 1, 1]


def test_har_missing_file_raises_with_path(tmp_path):
    # Prepare
    write_har(tmp_path, n_train=2, n_test=2)
    (tmp_path / "UCI HAR Dataset" / "test" / "subject_test.txt").unlink()
    # Execute
    with pytest.raises(DatasetNotFoundError) as info:
        load_dataset("har", tmp_path)
    # Assert
    message = str(info.value)
    assert str(tmp_path / "UCI HAR Dataset") in message and "subject_test.txt" in message
    assert "\n" not in message and message.startswith("har:")


@pytest.mark.parametrize("name", ["har", "speech_commands"])
def test_empty_or_no_root_raise_one_line_error(tmp_path, name):
    # Prepare
    root = tmp_path / "empty_root"
    root.mkdir()
    # Execute
    with pytest.raises(DatasetNotFoundError) as info:
        load_dataset(name, root)
    with pytest.raises(DatasetNotFoundError, match="no data root"):
        load_dataset(name, None)
    # Assert
    message = str(info.value)
    assert str(root) in message and "\n" not in message and message.startswith(f"{name}:")


def test_har_rejects_bad_rows_and_labels(tmp_path):
    # Prepare
    write_har(tmp_path, n_train=2, n_test=2)
    base = tmp_path / "UCI HAR Dataset"
    (base / "test" / "y_test.txt").write_text("1\n7\n")
    # Execute / Assert
    with pytest.raises(ValueError, match="outside 1..6"):
        load_dataset("har", tmp_path)
    (base / "test" / "y_test.txt").write_text("1\n2\n")
    (base / "train" / "Inertial Signals" / "body_acc_x_train.txt").write_text("1 2 3\n4 5 6\n")
    with pytest.raises(ValueError, match="expected 128"):
        load_dataset("har", tmp_path)


# ---------------------------------------------------------------- Speech Commands


def test_speech_shapes_lists_labels_and_writers(tmp_path):
    # Prepare
    raw = write_speech_commands(tmp_path, labels=("yes", "no", "up"), per_label=4)
    # Execute
    b = load_dataset("speech_commands", tmp_path)
    # Assert
    assert b.name == "speech_commands" and b.num_classes == 3 and b.input_shape == (1, 16000)
    assert b.train.x.shape == (6, 1, 16000) and b.test.x.shape == (3, 1, 16000)
    assert b.train.x.dtype == torch.float32 and b.train.y.dtype == torch.int64
    labels = {name: i for i, name in enumerate(["no", "up", "yes"])}
    speakers = sorted({r.split("/")[1].split("_nohash_")[0] for r in raw["files"]})
    for files, ds in ((raw["train"], b.train), (raw["testing"], b.test)):
        expected_x = np.stack([_expected_wave(raw["files"][r]) for r in files])[:, None]
        assert torch.equal(ds.x, torch.from_numpy(expected_x))
        assert ds.y.tolist() == [labels[r.split("/")[0]] for r in files]
        expected_w = [speakers.index(r.split("/")[1].split("_nohash_")[0]) for r in files]
        assert ds.writers.tolist() == expected_w
    assert float(b.train.x.min()) == -1.0 and float(b.train.x.max()) < 1.0


def test_speech_validation_split_and_background_ignored(tmp_path):
    # Prepare
    raw = write_speech_commands(tmp_path, per_label=4)
    # Execute
    val = load_dataset("speech_commands", tmp_path, test_split="validation")
    # Assert: train excludes both lists either way; test is the validation list
    assert len(val.train) == len(raw["train"]) == 6
    expected = np.stack([_expected_wave(raw["files"][r]) for r in raw["validation"]])
    assert torch.equal(val.test.x[:, 0], torch.from_numpy(expected))
    assert (raw["folder"] / "_background_noise_" / "white_noise.wav").is_file()
    assert val.num_classes == 3


def test_speech_padding_and_trimming(tmp_path):
    # Prepare
    raw = write_speech_commands(tmp_path, labels=("yes",), per_label=4)
    folder = raw["folder"]
    # Execute
    lengths = {r: len(s) for r, s in raw["files"].items()}
    short = next(r for r, n in lengths.items() if n == 9000)
    long = next(r for r, n in lengths.items() if n == 16400)
    padded, trimmed = read_wav(folder / short), read_wav(folder / long)
    # Assert
    assert padded.shape == trimmed.shape == (16000,)
    assert np.all(padded[9000:] == 0) and np.any(padded[:9000] != 0)
    np.testing.assert_array_equal(trimmed, raw["files"][long][:16000] / np.float32(32768))


def test_speech_max_per_class(tmp_path):
    # Prepare
    raw = write_speech_commands(tmp_path, labels=("yes", "no"), per_label=7)
    # Execute
    b = load_dataset("speech_commands", tmp_path, max_per_class=2)
    full = load_dataset("speech_commands", tmp_path)
    # Assert: the first two sorted files of each class, speaker ids unchanged
    assert len(full.train) == 10 and len(b.train) == 4 and len(b.test) == 2
    assert b.train.y.tolist() == [0, 0, 1, 1]
    keep = [r for lab in ("no", "yes") for r in [f for f in raw["train"] if f.startswith(lab)][:2]]
    expected = np.stack([_expected_wave(raw["files"][r]) for r in keep])
    assert torch.equal(b.train.x[:, 0], torch.from_numpy(expected))
    full_w = dict(zip(raw["train"], full.train.writers.tolist(), strict=True))
    assert b.train.writers.tolist() == [full_w[r] for r in keep]


@pytest.mark.parametrize("where", ["inside", "bare"])
def test_speech_other_roots(tmp_path, where):
    # Prepare
    raw = write_speech_commands(tmp_path / "src", per_label=3)
    if where == "inside":
        root = raw["folder"]
    else:  # root/speech_commands_v0.02/ without the SpeechCommands level
        root = tmp_path / "bare"
        shutil.copytree(raw["folder"], root / "speech_commands_v0.02")
    # Execute
    b = load_dataset("speech_commands", root)
    # Assert
    assert len(b.train) == 3 and len(b.test) == 3 and b.num_classes == 3


def test_speech_missing_lists_raise_with_path(tmp_path):
    # Prepare
    raw = write_speech_commands(tmp_path, per_label=3)
    (raw["folder"] / "testing_list.txt").unlink()
    # Execute
    with pytest.raises(DatasetNotFoundError) as info:
        load_dataset("speech_commands", tmp_path)
    # Assert
    message = str(info.value)
    assert str(raw["folder"]) in message and "testing_list.txt" in message
    assert "\n" not in message and message.startswith("speech_commands:")


def test_speech_empty_root_and_no_label_folders(tmp_path):
    # Prepare
    (tmp_path / "empty").mkdir()
    lists_only = tmp_path / "lists_only"
    (lists_only / "_background_noise_").mkdir(parents=True)
    for name in ("validation_list.txt", "testing_list.txt"):
        (lists_only / name).write_text("")
    # Execute / Assert
    with pytest.raises(DatasetNotFoundError, match=str(tmp_path / "empty")):
        load_dataset("speech_commands", tmp_path / "empty")
    with pytest.raises(DatasetNotFoundError, match="no label folders"):
        load_dataset("speech_commands", lists_only)


def test_speech_rejects_bad_options_and_formats(tmp_path):
    # Prepare
    raw = write_speech_commands(tmp_path, per_label=3)
    # Execute / Assert
    with pytest.raises(ValueError, match="test_split"):
        load_dataset("speech_commands", tmp_path, test_split="train")
    with pytest.raises(ValueError, match="max_per_class"):
        load_dataset("speech_commands", tmp_path, max_per_class=0)
    path = raw["folder"] / "yes" / "stereo_nohash_0.wav"
    with wave.open(str(path), "wb") as fh:
        fh.setnchannels(2)
        fh.setsampwidth(2)
        fh.setframerate(16000)
        fh.writeframes(b"\0" * 400)
    with pytest.raises(ValueError, match="not 16-bit mono"):
        load_dataset("speech_commands", tmp_path)
