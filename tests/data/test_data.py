"""Data layer: on-disk loaders (on generated fixtures) and client partitioners."""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from fixtures_data import (
    write_cifar10,
    write_cifar100,
    write_femnist_leaf,
    write_femnist_npz,
    write_mnist_idx,
)
from splitfl.data import DatasetError, DatasetNotFoundError, dataset_names, load_dataset
from splitfl.data.loaders.cifar import CIFAR10_MEAN, CIFAR10_STD
from splitfl.data.loaders.mnist import parse_idx
from splitfl.data.partition import PARTITIONERS, label_histograms, partition_indices

SHARED = Path("/work/shared/data")


def _mnist_norm(raw: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(((raw.astype(np.float64) / 255 - 0.5) / 0.5).astype(np.float32))


# ---------------------------------------------------------------- loaders


def test_registry_lists_all_loaders():
    # Execute
    names = dataset_names()
    # Assert
    assert {"mnist", "fashion_mnist", "cifar10", "cifar100", "femnist", "digits"} <= set(names)


def test_parse_idx_rejects_bad_magic():
    # Prepare
    data = b"\x01\x02\x08\x01" + (3).to_bytes(4, "big") + b"abc"
    # Execute / Assert
    with pytest.raises(ValueError, match="not an idx file"):
        parse_idx(data)


def test_mnist_gz_shapes_values_and_no_writers(tmp_path):
    # Prepare
    raw = write_mnist_idx(tmp_path, n_train=30, n_test=12, gz=True)
    # Execute
    b = load_dataset("mnist", tmp_path)
    # Assert
    assert b.train.x.shape == (30, 1, 28, 28) and b.test.x.shape == (12, 1, 28, 28)
    assert b.train.x.dtype == torch.float32 and b.train.y.dtype == torch.int64
    assert b.num_classes == 10 and b.input_shape == (1, 28, 28)
    assert torch.equal(b.train.y, torch.from_numpy(raw["train_y"].astype(np.int64)))
    assert torch.equal(b.train.x[:, 0], _mnist_norm(raw["train_x"]))
    assert b.train.x.min() >= -1 and b.train.x.max() <= 1
    assert b.train.writers is None and b.test.writers is None


def test_mnist_gz_and_plain_identical(tmp_path):
    # Prepare
    write_mnist_idx(tmp_path / "a", gz=True)
    write_mnist_idx(tmp_path / "b", gz=False)
    # Execute
    a, b = load_dataset("mnist", tmp_path / "a"), load_dataset("mnist", tmp_path / "b")
    # Assert
    assert torch.equal(a.train.x, b.train.x) and torch.equal(a.test.x, b.test.x)
    assert torch.equal(a.train.y, b.train.y) and torch.equal(a.test.y, b.test.y)


def test_mnist_writer_ids_filled(tmp_path):
    # Prepare
    raw = write_mnist_idx(tmp_path, gz=True, writer_ids=True)
    # Execute
    b = load_dataset("mnist", tmp_path)
    # Assert
    assert b.train.writers.dtype == np.int64
    np.testing.assert_array_equal(b.train.writers, raw["train_w"])
    np.testing.assert_array_equal(b.test.writers, raw["test_w"])
    np.testing.assert_array_equal(b.train.subset(np.array([3, 1])).writers, raw["train_w"][[3, 1]])


def test_mnist_writer_csv_label_mismatch_raises(tmp_path):
    # Prepare
    write_mnist_idx(tmp_path, gz=True, writer_ids=True)
    csv_path = tmp_path / "MNIST" / "mnist-writer-ids.csv.gz"
    lines = gzip.decompress(csv_path.read_bytes()).decode().splitlines()
    lines[1] = "train,0,9,7,0"  # fixture label 0 at train index 0
    csv_path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    # Execute / Assert
    with pytest.raises(ValueError, match="label mismatch"):
        load_dataset("mnist", tmp_path)


def test_mnist_root_may_be_the_raw_folder(tmp_path):
    # Prepare
    write_mnist_idx(tmp_path, gz=False, writer_ids=True)
    # Execute
    b = load_dataset("mnist", tmp_path / "MNIST" / "raw")
    # Assert
    assert len(b.train) == 60 and b.train.writers is not None


def test_fashion_mnist_layout(tmp_path):
    # Prepare
    raw = write_mnist_idx(tmp_path, n_train=20, n_test=10, gz=True, folder="FashionMNIST")
    # Execute
    b = load_dataset("fashion_mnist", tmp_path)
    # Assert
    assert b.name == "fashion_mnist" and len(b.train) == 20 and len(b.test) == 10
    assert torch.equal(b.test.x[:, 0], _mnist_norm(raw["test_x"]))


@pytest.mark.parametrize("name", ["mnist", "fashion_mnist", "cifar10", "cifar100", "femnist"])
def test_missing_files_raise_one_line_error_with_path(tmp_path, name):
    # Prepare
    root = tmp_path / "empty_root"
    root.mkdir()
    # Execute
    with pytest.raises(DatasetNotFoundError) as info:
        load_dataset(name, root)
    # Assert
    message = str(info.value)
    assert str(root) in message and "\n" not in message and name in message


def test_cifar10_missing_batch_names_it(tmp_path):
    # Prepare
    write_cifar10(tmp_path, n_per_batch=4)
    (tmp_path / "cifar-10-batches-py" / "data_batch_5").unlink()
    # Execute / Assert
    with pytest.raises(DatasetNotFoundError, match="data_batch_5"):
        load_dataset("cifar10", tmp_path)


@pytest.mark.parametrize("sub", ["", "CIFAR10"])
def test_cifar10_subset_batches(tmp_path, sub):
    # Prepare
    raw = write_cifar10(tmp_path / sub if sub else tmp_path, n_per_batch=7)
    # Execute
    b = load_dataset("cifar10", tmp_path)
    # Assert
    assert b.train.x.shape == (35, 3, 32, 32) and b.test.x.shape == (7, 3, 32, 32)
    assert b.train.x.dtype == torch.float32 and b.num_classes == 10
    assert torch.equal(b.train.y, torch.from_numpy(raw["train_y"].astype(np.int64)))
    img = raw["train_x"][4].reshape(3, 32, 32)
    c, i, j = 2, 5, 9
    expected = (img[c, i, j] / 255 - CIFAR10_MEAN[c]) / CIFAR10_STD[c]
    assert abs(float(b.train.x[4, c, i, j]) - expected) < 1e-6


@pytest.mark.parametrize(("mode", "classes"), [("fine", 100), ("coarse", 20)])
def test_cifar100_label_modes(tmp_path, mode, classes):
    # Prepare
    raw = write_cifar100(tmp_path, n=24)
    # Execute
    b = load_dataset("cifar100", tmp_path, label_mode=mode)
    # Assert
    assert b.num_classes == classes and b.input_shape == (3, 32, 32)
    assert b.train.x.shape == (24, 3, 32, 32) and len(b.test) == 8
    assert torch.equal(b.train.y, torch.from_numpy(raw[f"train_{mode}"].astype(np.int64)))


def test_cifar100_rejects_unknown_label_mode(tmp_path):
    # Prepare
    write_cifar100(tmp_path, n=3)
    # Execute / Assert
    with pytest.raises(ValueError, match="label_mode"):
        load_dataset("cifar100", tmp_path, label_mode="medium")


def test_femnist_npz(tmp_path):
    # Prepare
    raw = write_femnist_npz(tmp_path, n_writers=6, samples_per_writer=8)
    # Execute
    b = load_dataset("femnist", tmp_path)
    # Assert
    is_train = raw["split"] == 0
    assert b.num_classes == 62 and b.input_shape == (1, 28, 28)
    assert b.train.x.shape == (int(is_train.sum()), 1, 28, 28)
    assert len(b.test) == int((~is_train).sum())
    np.testing.assert_array_equal(b.train.writers, raw["writer"][is_train])
    assert set(b.test.writers) == set(range(6)) and set(b.train.writers) == set(range(4))
    assert float(b.train.x[0, 0, 0, 0]) == 1.0  # white LEAF background kept


def test_femnist_npz_and_leaf_identical(tmp_path):
    # Prepare: 11 json files per split checks the natural file order (2 < 10)
    write_femnist_npz(tmp_path / "npz", n_writers=13, samples_per_writer=5)
    write_femnist_leaf(tmp_path / "leaf", n_writers=13, samples_per_writer=5, files=11)
    # Execute
    a = load_dataset("femnist", tmp_path / "npz")
    b = load_dataset("femnist", tmp_path / "leaf")
    # Assert
    for x, y in ((a.train, b.train), (a.test, b.test)):
        assert torch.equal(x.x, y.x) and torch.equal(x.y, y.y)
        np.testing.assert_array_equal(x.writers, y.writers)


def test_femnist_leaf_under_data_folder(tmp_path):
    # Prepare
    write_femnist_leaf(tmp_path / "x", n_writers=4, samples_per_writer=4)
    (tmp_path / "FEMNIST").mkdir()
    (tmp_path / "x" / "FEMNIST").rename(tmp_path / "FEMNIST" / "data")
    # Execute
    b = load_dataset("femnist", tmp_path)
    # Assert
    assert len(b.train) > 0 and b.test.writers is not None


def test_femnist_several_npz_are_a_dataset_error_and_data_root_may_name_one(tmp_path):
    # Prepare
    write_femnist_npz(tmp_path, n_writers=4)
    folder = tmp_path / "FEMNIST"
    (folder / "femnist-fixture.npz").rename(folder / "femnist-a.npz")
    write_femnist_npz(tmp_path, n_writers=5)
    # Execute / Assert: one line (exit 2 in the CLI), advice a config can follow
    with pytest.raises(DatasetError, match=r"several npz files .* set data.root to the one"):
        load_dataset("femnist", tmp_path)
    assert set(load_dataset("femnist", folder / "femnist-a.npz").test.writers) == set(range(4))
    assert set(load_dataset("femnist", tmp_path, file="femnist-a.npz").test.writers) == set(
        range(4)
    )


def _repickle(folder: Path, protocol: int, **changes: object) -> None:
    for path in folder.iterdir():
        with open(path, "rb") as fh:
            batch = pickle.load(fh, encoding="latin1")
        batch.update(changes.get(path.name, {}))
        path.write_bytes(pickle.dumps(batch, protocol=protocol))


@pytest.mark.parametrize("protocol", [3, 4, 5])
def test_cifar_batches_of_any_pickle_protocol_load_alike(tmp_path, protocol):
    # Prepare: protocol 5 (Python 3.14's default) pickles arrays with numpy's _frombuffer
    write_cifar10(tmp_path / "a", n_per_batch=6)
    write_cifar10(tmp_path / "b", n_per_batch=6)
    _repickle(tmp_path / "b" / "cifar-10-batches-py", protocol)
    # Execute
    a, b = load_dataset("cifar10", tmp_path / "a"), load_dataset("cifar10", tmp_path / "b")
    # Assert
    assert torch.equal(a.train.x, b.train.x) and torch.equal(a.test.y, b.test.y)


@pytest.mark.parametrize("protocol", [2, 5])
def test_an_empty_cifar_batch_is_allowed(tmp_path, protocol):
    # Prepare: one training batch holds no images (an empty array pickles as bytes())
    write_cifar10(tmp_path, n_per_batch=6)
    empty = {"data": np.zeros((0, 3072), np.uint8), "labels": []}
    _repickle(tmp_path / "cifar-10-batches-py", protocol, data_batch_3=empty)
    # Execute
    b = load_dataset("cifar10", tmp_path)
    # Assert
    assert len(b.train) == 24 and len(b.test) == 6


# ---------------------------------------------------------------- partitioners

BALANCED = np.repeat(np.arange(10), 100)


def _parts(scheme: str, seed: int, labels=BALANCED, clients: int = 10, **kw):
    return partition_indices(scheme, labels, clients, np.random.default_rng(seed), **kw)


SCHEME_KW = {
    "iid": {},
    "dirichlet": {"alpha": 0.5},
    "shards": {"classes_per_client": 2},
    "natural": {"writers": np.arange(1000) % 37},
}


def test_partitioners_registry():
    assert set(PARTITIONERS) == {"iid", "dirichlet", "shards", "natural", "folders"}


@pytest.mark.parametrize("scheme", ["iid", "dirichlet", "shards"])
def test_partition_disjoint_and_covering(scheme):
    # Execute
    parts = _parts(scheme, 0, **SCHEME_KW[scheme])
    # Assert
    joined = np.concatenate(parts)
    assert len(joined) == len(set(joined.tolist())) == len(BALANCED)
    assert all(p.dtype == np.int64 and np.all(np.diff(p) > 0) for p in parts)


@pytest.mark.parametrize("scheme", sorted(SCHEME_KW))
def test_partition_deterministic_per_seed(scheme):
    # Execute
    a, b, c = (_parts(scheme, s, **SCHEME_KW[scheme]) for s in (1, 1, 2))
    # Assert
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


@pytest.mark.parametrize("scheme", sorted(SCHEME_KW))
def test_partition_min_samples(scheme):
    # Execute
    parts = _parts(scheme, 3, clients=20, min_samples=20, **SCHEME_KW[scheme])
    # Assert
    assert len(parts) == 20 and min(len(p) for p in parts) >= 20


def test_iid_near_equal_sizes():
    sizes = [len(p) for p in _parts("iid", 0, clients=7)]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 1000


def test_dirichlet_small_alpha_more_skewed():
    # Prepare
    def max_fraction(alpha: float) -> float:
        parts = _parts("dirichlet", 0, alpha=alpha)
        hist = label_histograms(BALANCED, parts, 10)
        return float((hist.max(1) / hist.sum(1)).mean())

    # Execute / Assert
    assert max_fraction(0.1) > max_fraction(100.0) + 0.3


def test_dirichlet_impossible_min_samples_raises_and_hard_draws_are_topped_up():
    labels = np.repeat([0, 1], 50)
    with pytest.raises(ValueError, match="cannot give"):
        partition_indices(
            "dirichlet", labels, 30, np.random.default_rng(0), alpha=0.001, min_samples=4
        )
    parts = partition_indices("dirichlet", labels, 30, np.random.default_rng(0), alpha=0.001)
    assert min(len(p) for p in parts) >= 1
    with pytest.raises(ValueError, match="cannot give"):
        partition_indices("iid", labels, 30, np.random.default_rng(0), min_samples=5)


@pytest.mark.parametrize(("clients", "k"), [(10, 2), (100, 2), (20, 3)])
def test_shards_exactly_k_classes(clients, k):
    # Prepare
    labels = np.repeat(np.arange(10), 600)
    # Execute
    parts = _parts("shards", 0, labels=labels, clients=clients, classes_per_client=k)
    # Assert
    hist = label_histograms(labels, parts, 10)
    assert np.all((hist > 0).sum(1) == k)
    assert hist.sum() == len(labels)


def test_natural_one_writer_per_client():
    # Prepare
    writers = np.repeat(np.arange(12), np.arange(1, 13))  # writer w has w+1 samples
    labels = np.zeros(len(writers), dtype=np.int64)
    # Execute
    parts = partition_indices(
        "natural", labels, 5, np.random.default_rng(0), writers=writers, min_samples=6
    )
    # Assert
    owners = [np.unique(writers[p]) for p in parts]
    assert all(len(o) == 1 for o in owners)
    assert all(o[0] >= 5 and len(p) == o[0] + 1 for o, p in zip(owners, parts, strict=True))
    with pytest.raises(ValueError, match="only 7 writers"):
        partition_indices(
            "natural", labels, 8, np.random.default_rng(0), writers=writers, min_samples=6
        )


def test_partition_indices_argument_errors():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="alpha"):
        partition_indices("dirichlet", BALANCED, 5, rng)
    with pytest.raises(ValueError, match="classes_per_client"):
        partition_indices("shards", BALANCED, 5, rng)
    with pytest.raises(ValueError, match="writer"):
        partition_indices("natural", BALANCED, 5, rng)
    with pytest.raises(ValueError, match="unknown partition scheme"):
        partition_indices("zipf", BALANCED, 5, rng)


def test_label_histograms_sums():
    # Prepare
    parts = _parts("dirichlet", 4, alpha=1.0)
    # Execute
    hist = label_histograms(BALANCED, parts, 10)
    # Assert
    assert hist.shape == (10, 10) and hist.dtype == np.int64
    np.testing.assert_array_equal(hist.sum(0), np.bincount(BALANCED))
    np.testing.assert_array_equal(hist.sum(1), [len(p) for p in parts])


# ---------------------------------------------------------------- real data (if present)


@pytest.mark.slow
@pytest.mark.skipif(not SHARED.exists(), reason="real datasets not on this machine")
def test_real_shared_datasets_load():
    # Execute
    mnist = load_dataset("mnist", SHARED)
    cifar = load_dataset("cifar10", SHARED)
    femnist = load_dataset("femnist", SHARED)
    # Assert
    assert (len(mnist.train), len(mnist.test)) == (60000, 10000)
    assert len(np.unique(mnist.train.writers)) == 539 and len(np.unique(mnist.test.writers)) == 297
    assert (len(cifar.train), len(cifar.test)) == (5000, 1000)
    assert np.all(np.bincount(cifar.train.y.numpy()) == 500)
    assert (len(femnist.train), len(femnist.test)) == (14708, 4088)
    assert len(np.unique(femnist.train.writers)) == 105
    assert len(np.unique(femnist.test.writers)) == 184
    parts = partition_indices(
        "natural", mnist.train.y.numpy(), 50, np.random.default_rng(0), writers=mnist.train.writers
    )
    assert len(parts) == 50


def test_dirichlet_cap_makes_small_alpha_feasible_and_bounds_sizes():
    # Prepare: 500 samples, 10 balanced classes, 50 clients, alpha 0.1, min 5
    labels = np.repeat(np.arange(10), 50)
    # Execute
    parts = partition_indices(
        "dirichlet",
        labels,
        50,
        np.random.default_rng(0),
        alpha=0.1,
        dirichlet_cap=True,
        min_samples=5,
    )
    # Assert: disjoint cover, min honoured; a capped client stops at the first class that
    # takes it past N/n = 10 samples, so no client holds more than 10 + one class (50)
    assert sorted(np.concatenate(parts).tolist()) == list(range(500))
    assert min(len(p) for p in parts) >= 5
    # without the cap no draw reaches min 5 here: the top-up still guarantees it
    parts = partition_indices(
        "dirichlet", labels, 50, np.random.default_rng(0), alpha=0.1, min_samples=5
    )
    assert min(len(p) for p in parts) >= 5
    assert sorted(np.concatenate(parts).tolist()) == list(range(500))
