"""A resume after the data changed is refused in one line naming what changed (issue 35.13):
the checkpoint holds a fingerprint of the data the run read
(:mod:`splitfl.experiment.fingerprint`)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import splitfl
from splitfl.cli.main import main
from splitfl.experiment import fingerprint
from splitfl.experiment.checkpoint import save_checkpoint
from splitfl.experiment.runner import prepare
from splitfl.testing import config_for


def _npz(root) -> None:
    rng = np.random.default_rng(0)
    x = rng.random((96, 1, 8, 8)).astype(np.float32)
    y = np.arange(96) % 4
    root.mkdir(exist_ok=True)
    np.savez(root / "train.npz", x=x, y=y)
    np.savez(root / "test.npz", x=x[:16], y=y[:16])


def _config(root) -> dict:
    config = config_for("splitfed_v1", rounds=2, model="mlp")
    config["data"].update(
        dataset="mine", format="npz", root=str(root), num_clients=4, min_samples=1
    )
    config["train"]["clients_per_round"] = 4
    return config


def test_a_resume_after_the_npz_changed_is_refused_in_one_line(tmp_path, capsys):
    """Values ×0.5 between the run and ``--resume``: refused, naming the file; restored, the
    resume goes on."""
    data, run_dir = tmp_path / "data", tmp_path / "run"
    _npz(data)
    splitfl.run(_config(data), run_dir=run_dir)
    with np.load(data / "train.npz") as z:
        np.savez(data / "train.npz", x=z["x"] * 0.5, y=z["y"])
    code = main(["run", "--resume", str(run_dir), "rounds=3", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("error: --resume: the data differs from what ") and (
        "data.root/train.npz changed (content)" in err[0]
    ), err[0]
    assert "test.npz" not in err[0]
    _npz(data)
    assert main(["run", "--resume", str(run_dir), "rounds=3", "--no-progress"]) == 0


def test_large_files_compare_by_size_and_time_and_moved_data_resumes(tmp_path, monkeypatch):
    """Files above the content-hash size are compared by size and modification time; the
    same files under another ``data.root`` (a resume may move them) resume."""
    monkeypatch.setattr(fingerprint, "SMALL_FILE", 100)  # every npz is "large"
    data, run_dir = tmp_path / "data", tmp_path / "run"
    _npz(data)
    splitfl.run(_config(data), run_dir=run_dir)
    stored = torch.load(run_dir / "checkpoints/last.pt", weights_only=True)["data"]
    assert all(v.startswith("size=") for v in stored.values()), stored
    moved = tmp_path / "moved"
    data.rename(moved)
    text = (run_dir / "config.yaml").read_text().replace(str(data), str(moved))
    (run_dir / "config.yaml").write_text(text)
    assert splitfl.resume(run_dir, overrides=["rounds=3"]).summary["status"] == "ok"
    stat = (moved / "test.npz").stat()
    os.utime(moved / "test.npz", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    with pytest.raises(splitfl.ConfigError, match=r"data\.root/test\.npz changed \(size="):
        splitfl.resume(run_dir, overrides=["rounds=4"])


def test_loaded_data_is_fingerprinted_by_content():
    """Data a loader returns (the embedded digits here) is fingerprinted by its tensors."""
    config = splitfl.load_config(None, ["data.dataset=digits"])
    prep = prepare(config)
    first = fingerprint.data_fingerprint(prep.config, prep.ctx.bundle)
    assert list(first) == ["loaded data"] and first["loaded data"].startswith("sha256:")
    prep.ctx.bundle.train.x[0, 0] += 1.0
    assert fingerprint.data_fingerprint(prep.config, prep.ctx.bundle) != first


def test_a_checkpoint_without_a_fingerprint_resumes_with_a_note(tmp_path, capsys):
    """Checkpoints written before fingerprints existed hold none: they resume, and a note
    says the data could not be compared."""
    data, run_dir = tmp_path / "data", tmp_path / "run"
    _npz(data)
    splitfl.run({**_config(data), "rounds": 1}, run_dir=run_dir)
    state = torch.load(run_dir / "checkpoints/last.pt", weights_only=True)
    state.pop("data")
    save_checkpoint(run_dir, {k: v for k, v in state.items() if k not in ("format", "version")})
    capsys.readouterr()
    assert main(["run", "--resume", str(run_dir), "rounds=2", "--no-progress"]) == 0
    assert "holds no data fingerprint (written by an older splitfl)" in capsys.readouterr().err


def test_a_broadcast_input_is_fingerprinted_without_expanding_it():
    """``executor: timing`` with ``data.train_samples`` broadcasts one zero sample to every
    index (``labels_only``); the fingerprint hashed the expanded bytes, 31.9 GB for MergeSFL's
    IMAGE-100 at 3×144×144 (128,117 samples), and the timing run died allocating them (issue
    50 item 4's row). Here a 1e6 × 3×144×144 view (249 GB expanded) fingerprints at once, and
    the digest still tells shapes and stored values apart."""
    from splitfl.data.base import ArrayDataset, DatasetBundle, labels_only

    bundle = labels_only("image100_144", 1_000_000)
    digest = fingerprint.bundle_digest(bundle)
    assert digest == fingerprint.bundle_digest(labels_only("image100_144", 1_000_000))
    assert digest != fingerprint.bundle_digest(labels_only("image100_144", 999_999))
    x = torch.ones(1, 3, 4, 4).expand(5, 3, 4, 4)
    y = torch.zeros(5, dtype=torch.int64)
    ones = DatasetBundle("t", ArrayDataset(x, y), ArrayDataset(x, y), 2, (3, 4, 4))
    zeros = DatasetBundle("t", ArrayDataset(0 * x, y), ArrayDataset(0 * x, y), 2, (3, 4, 4))
    assert fingerprint.bundle_digest(ones) != fingerprint.bundle_digest(zeros)
