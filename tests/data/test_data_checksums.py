"""Checksum verification of standard dataset files (``data.verify: warn | strict | off``)."""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
from test_data_corrupt import _config, _gz_idx

from fixtures_data import write_cifar10, write_mnist_idx
from splitfl.cli.main import main
from splitfl.data import load_dataset
from splitfl.data.base import DatasetFileError, DatasetWarning
from splitfl.data.loaders import _checksums
from splitfl.data.loaders._checksums import CANONICAL


def _md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


@pytest.fixture
def canonical_mnist(tmp_path, monkeypatch):
    """MNIST fixture whose 20-label test file is declared canonical (its gz MD5)."""

    write_mnist_idx(tmp_path)
    path = tmp_path / "MNIST" / "raw" / "t10k-labels-idx1-ubyte.gz"
    table = dict(_checksums.CANONICAL)
    table[("mnist", "t10k-labels-idx1-ubyte")] = _checksums.Canonical(20, _md5(path.read_bytes()))
    monkeypatch.setattr(_checksums, "CANONICAL", table)
    monkeypatch.setattr(_checksums, "_DIGESTS", {})
    return path


def _relabel(path: Path) -> None:
    """Same shape, other labels, new mtime: a file that is no longer the canonical one."""
    _gz_idx(path, (np.arange(20) % 10)[::-1].astype(np.uint8))
    os.utime(path, ns=(1, 1))


def test_canonical_file_passes_strict_and_is_hashed_once(canonical_mnist, monkeypatch):
    # Prepare

    calls = []
    real = _checksums.hashlib.md5
    monkeypatch.setattr(_checksums.hashlib, "md5", lambda *a, **k: calls.append(1) or real(*a, **k))
    root = canonical_mnist.parents[2]
    # Execute
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_dataset("mnist", root, verify="strict")
        load_dataset("mnist", root, verify="warn")
    # Assert: only the file with the canonical sample count is hashed, and only once
    assert len(calls) == 1


def test_changed_file_warns_fails_or_is_skipped_by_mode(canonical_mnist):
    # Prepare

    root = canonical_mnist.parents[2]
    _relabel(canonical_mnist)
    # Execute / Assert
    with pytest.warns(DatasetWarning, match=f"^mnist: {re.escape(str(canonical_mnist))}: differs"):
        load_dataset("mnist", root)
    with pytest.raises(DatasetFileError, match="data.verify=warn or off"):
        load_dataset("mnist", root, verify="strict")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_dataset("mnist", root, verify="off")


def test_recompressed_copy_with_canonical_content_is_accepted(tmp_path, monkeypatch):
    # Prepare: the published gz MD5 differs, the decompressed content's MD5 matches

    write_mnist_idx(tmp_path)
    path = tmp_path / "MNIST" / "raw" / "t10k-labels-idx1-ubyte.gz"
    content = _md5(gzip.decompress(path.read_bytes()))
    table = dict(_checksums.CANONICAL)
    table[("mnist", "t10k-labels-idx1-ubyte")] = _checksums.Canonical(20, "0" * 32, content)
    monkeypatch.setattr(_checksums, "CANONICAL", table)
    # Execute / Assert
    load_dataset("mnist", tmp_path, verify="strict")


def test_cifar_batch_checksum_and_cli_modes(tmp_path, monkeypatch, capsys):
    # Prepare

    write_cifar10(tmp_path / "data")
    path = tmp_path / "data" / "cifar-10-batches-py" / "test_batch"
    table = dict(_checksums.CANONICAL)
    table[("cifar10", "test_batch")] = _checksums.Canonical(10, "0" * 32)
    monkeypatch.setattr(_checksums, "CANONICAL", table)
    monkeypatch.setattr(_checksums, "_DIGESTS", {})
    # Execute / Assert: warn = one line, still valid; strict = exit 2; off = silent
    assert main(["validate", str(_config(tmp_path, "cifar10", tmp_path / "data"))]) == 0
    err = capsys.readouterr().err
    assert err == (f"warning: cifar10: {path}: differs from the canonical file "
                   f"(md5 {_md5(path.read_bytes())}, expected {'0' * 32})\n")  # fmt: skip
    strict = _config(tmp_path, "cifar10", tmp_path / "data", **{"data.verify": "strict"})
    assert main(["validate", str(strict)]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    off = _config(tmp_path, "cifar10", tmp_path / "data", **{"data.verify": "off"})
    assert main(["validate", str(off)]) == 0
    assert capsys.readouterr().err == ""


def test_subsets_are_not_hashed(tmp_path, monkeypatch):
    # Prepare: fixture files have canonical names but not the canonical sample counts

    monkeypatch.setattr(_checksums, "_DIGESTS", {})
    write_mnist_idx(tmp_path / "m")
    write_cifar10(tmp_path / "c")
    # Execute
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_dataset("mnist", tmp_path / "m", verify="strict")
        load_dataset("cifar10", tmp_path / "c", verify="strict")
    # Assert
    assert _checksums._DIGESTS == {}


def test_published_md5s_are_the_torchvision_ones():
    # The MD5s torchvision's MNIST/FashionMNIST/CIFAR10/CIFAR100 classes check (spot check).

    assert CANONICAL[("mnist", "train-images-idx3-ubyte")].md5 == "f68b3c2dcbeaaa9fbdd348bbdeb94873"
    assert CANONICAL[("fashion_mnist", "t10k-labels-idx1-ubyte")].md5 == (
        "bb300cfdad3c16e7a12a480ee83cd310"
    )
    assert CANONICAL[("cifar10", "test_batch")].md5 == "40351d587109b95175f43aff81a1287e"
    assert CANONICAL[("cifar100", "train")].md5 == "16019d7e3df5f24257cddd939b257f8d"


SHARED = Path("/work/shared/data")


@pytest.mark.slow
@pytest.mark.skipif(not SHARED.exists(), reason="real datasets not on this machine")
def test_shared_data_passes_strict_verification():
    # MNIST there is re-gzipped (content canonical), CIFAR-10 a subset: neither may fail.
    for name in ("mnist", "cifar10"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            load_dataset(name, SHARED, verify="strict")
